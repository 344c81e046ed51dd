"""Validated, JSON-round-trippable configuration of a dilated attention."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ..checks import check_bool, check_positive_ints, check_scale
from .geometry import MODES

IMPLS = ("auto", "sdpa", "triton", "reference")


def check_branches(segment_lengths, dilation_rates, mode: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Validate a branch spec; returns it as two int tuples."""
    segments = check_positive_ints("segment_lengths", segment_lengths)
    rates = check_positive_ints("dilation_rates", dilation_rates)
    if len(segments) != len(rates):
        raise ValueError(
            f"segment_lengths {segments} and dilation_rates {rates} must have the same length "
            "(one rate per segment length)"
        )
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return segments, rates


@dataclass(frozen=True)
class DilatedAttentionConfig:
    segment_lengths: tuple[int, ...]  # w_i: segment length of branch i (clamped to N)
    dilation_rates: tuple[int, ...]  # r_i: keep every r_i-th row of a segment in branch i
    causal: bool = False  # key position ≤ query position
    mode: str = "longnet"  # "longnet": every head every branch; "groups": seed-system head groups
    scale: float | None = None  # softmax scale; None → 1/sqrt(head_dim)
    impl: str = "auto"  # "sdpa" (fused kernels), "triton" (one fused kernel), "reference" (float64 oracle) or "auto"

    def __post_init__(self):
        segments, rates = check_branches(self.segment_lengths, self.dilation_rates, self.mode)
        object.__setattr__(self, "segment_lengths", segments)
        object.__setattr__(self, "dilation_rates", rates)
        check_bool("causal", self.causal)
        object.__setattr__(self, "scale", check_scale(self.scale))  # a numpy float stored as float (JSON)
        if self.impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {self.impl!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DilatedAttentionConfig:
        return cls(**json.loads(text))
