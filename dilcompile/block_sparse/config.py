"""Validated, JSON-round-trippable configuration of a block-sparse attention."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ..checks import check_positive_int, check_scale

IMPLS = ("auto", "gather", "flex", "reference")


@dataclass(frozen=True)
class BlockSparseAttentionConfig:
    pattern: str = "local_window(window=256)"  # a pattern spec (patterns.from_spec); repr(pattern) works too
    causal: bool = False  # also restrict to key ≤ query
    scale: float | None = None  # softmax scale; None → 1/sqrt(head_dim)
    block_size: int = 128  # tokens per block of the block lists / BlockMask
    impl: str = "auto"  # "gather", "flex", "reference" or "auto"

    def __post_init__(self):
        from ..patterns import Pattern, from_spec

        if isinstance(self.pattern, Pattern):
            if self.pattern.data_dependent:
                raise TypeError("a data-dependent pattern (adaptive) has parameters: pass it to "
                                "BlockSparseAttention(pattern=...) directly, not through the config")
            object.__setattr__(self, "pattern", repr(self.pattern))
        from_spec(self.pattern)  # raises ValueError naming the problem
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal must be a bool, got {self.causal!r}")
        check_positive_int("block_size", self.block_size, " (e.g. 128)")
        object.__setattr__(self, "scale", check_scale(self.scale))  # a numpy float stored as float (JSON)
        if self.impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {self.impl!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BlockSparseAttentionConfig:
        return cls(**json.loads(text))
