"""One measurement point: what to run, at which shape, how."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ..checks import is_int

DTYPES = ("float32", "float16", "bfloat16", "float64")
PASSES = ("fwd", "fwd_bwd")
# The run store's column types bound the sizes (seq_len BIGINT, the others INTEGER): a point the
# store could not hold is refused before it is measured.
MAX_SIZE = {"seq_len": 2**63 - 1, "batch": 2**31 - 1, "heads": 2**31 - 1, "head_dim": 2**31 - 1}


@dataclass(frozen=True)
class Point:
    variant: str  # registry name, e.g. "dilated" or "block-sparse:local_window(256)"
    seq_len: int  # N
    batch: int = 1  # B
    heads: int = 8  # H
    head_dim: int = 64  # D
    dtype: str = "float32"
    causal: bool = False
    pass_: str = "fwd"  # "fwd" or "fwd_bwd" (forward + backward of sum-like loss)
    segments: tuple[int, ...] = ()  # dilated variants: segment lengths w_i
    rates: tuple[int, ...] = ()  # dilated variants: dilation rates r_i
    compiled: bool = False  # torch.compile the variant's callable
    device: str = "cpu"  # "cpu", "cuda", "cuda:1", ...
    impl: str = "auto"  # the variant's implementation: dilated sdpa/triton/..., an SDPA backend, a block-sparse backend

    def __post_init__(self):
        if not isinstance(self.variant, str) or not self.variant:
            raise ValueError(f"variant must be a non-empty string, got {self.variant!r}")
        for name in ("seq_len", "batch", "heads", "head_dim"):
            value = getattr(self, name)
            if not is_int(value) or not 1 <= value <= MAX_SIZE[name]:
                raise ValueError(f"{name} must be an int in 1..{MAX_SIZE[name]}, got {value!r}")
        if not isinstance(self.impl, str) or not self.impl:
            raise ValueError(f"impl must be a name such as 'auto', 'sdpa' or 'triton', got {self.impl!r}")
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device must be a string such as 'cpu' or 'cuda:0', got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.pass_ not in PASSES:
            raise ValueError(f"pass must be one of {PASSES}, got {self.pass_!r}")
        for name in ("causal", "compiled"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        object.__setattr__(self, "segments", tuple(int(s) for s in self.segments))
        object.__setattr__(self, "rates", tuple(int(r) for r in self.rates))
        if len(self.segments) != len(self.rates):
            raise ValueError(f"segments {self.segments} and rates {self.rates} must have one rate per segment")
        if any(v < 1 for v in self.segments + self.rates):
            raise ValueError(f"segments {self.segments} and rates {self.rates} must all be ≥ 1")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    def shape_key(self) -> tuple:
        """Points with one key share a dense-SDPA baseline for η."""
        return (self.device, self.dtype, self.pass_, self.causal, self.batch, self.seq_len, self.heads, self.head_dim)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Point":
        d = json.loads(text)
        d["segments"], d["rates"] = tuple(d["segments"]), tuple(d["rates"])
        return cls(**d)
