"""Models built on dilcompile's attention modules."""

from .longnet import LongNetConfig, LongNetDecoder

__all__ = ["LongNetConfig", "LongNetDecoder"]
