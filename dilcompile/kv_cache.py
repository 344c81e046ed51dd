"""``KVCache``: preallocated keys and values of every attention layer of a
decoder, for generation without recomputing the context.

One (L, B, H, max_len, D) buffer each for keys and values, allocated once;
``update`` writes the new tokens' keys and values at ``[start, start + n)``
in place and returns views of positions ``[0, start + n)``. Nothing is
reallocated per token, and the write position is an argument (not state
kept here), so a compiled step with ``dynamic=True`` sees one symbolic int
instead of a new constant per token.

The buffers hold the keys in the dtype the projections produce: the
parameters' dtype, or autocast's under ``torch.autocast`` (``keys_dtype``).
"""

from __future__ import annotations

from numbers import Integral

import torch
from torch import Tensor

from .checks import check_positive_int


def keys_dtype(param_dtype: torch.dtype, device) -> torch.dtype:
    """The dtype of keys projected by parameters of ``param_dtype`` on
    ``device``, now: autocast's dtype where autocast is on for the device
    (it casts every floating input of a linear layer but float64), else the
    parameters' own."""
    device_type = torch.device(device).type
    if param_dtype != torch.float64 and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return param_dtype


class KVCache:
    """Keys and values of ``num_layers`` attention layers.

    Args:
        num_layers: attention layers sharing the cache (``layer`` indexes them).
        batch, num_heads, max_len, head_dim: the buffers are
            (num_layers, batch, num_heads, max_len, head_dim); ``max_len`` is
            the longest context (prompt + generated tokens).
        dtype, device: of the buffers; the projected keys must match
            (under ``torch.autocast`` they have autocast's dtype: build the
            cache with that dtype, as ``LongNetDecoder.new_cache`` does).
    """

    def __init__(self, num_layers: int, batch: int, num_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device=None):
        for name, value in (("num_layers", num_layers), ("batch", batch), ("num_heads", num_heads),
                            ("max_len", max_len), ("head_dim", head_dim)):
            check_positive_int(name, value)
        shape = (num_layers, batch, num_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        for t in (self.k, self.v):
            # Layers, batch, heads and head_dim are the model's, fixed: under dynamic=True
            # Dynamo would otherwise give a prompt length equal to one of them the same
            # symbol ("duck sizing") and specialise it. max_len stays dynamic.
            for dim in (0, 1, 2, 4):
                torch._dynamo.mark_static(t, dim)

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def check(self, layer: int, batch: int, num_heads: int, head_dim: int, dtype: torch.dtype, device,
              start: int, length: int) -> None:
        """Raise ValueError naming the mismatch (and the fix) if ``length`` new
        tokens of this shape cannot be written at ``start`` of ``layer``.
        ``dtype``: of the projection's parameters; the keys have
        ``keys_dtype(dtype, device)`` (autocast's under ``torch.autocast``)."""
        for name, value in (("layer_idx", layer), ("start_pos", start)):
            # an int (or a traced SymInt), never a bool: True would silently mean 1
            if isinstance(value, bool) or not isinstance(value, (Integral, torch.SymInt)):
                raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        _, b, h, _, d = self.k.shape
        fix = "build KVCache(num_layers, batch, num_heads, max_len, head_dim, dtype=, device=) to match the model"
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"cache layer {layer} out of range: the cache holds {self.num_layers} layers; {fix}")
        for name, want, got in (("batch", b, batch), ("num_heads", h, num_heads), ("head_dim", d, head_dim)):
            if want != got:
                raise ValueError(f"cache was built with {name}={want} but the input has {name}={got}; {fix}")
        keys = keys_dtype(dtype, device)
        if keys != self.k.dtype:
            why = "" if keys == dtype else f" (torch.autocast's dtype; the parameters are {dtype})"
            raise ValueError(f"cache has dtype {self.k.dtype} but the keys are {keys}{why}; build the cache with "
                             f"dtype={keys}, under the same autocast as the model call")
        if torch.device(device) != self.k.device:
            raise ValueError(f"cache is on {self.k.device} but the input is on {device}; {fix}")
        if start < 0 or start + length > self.max_len:
            raise ValueError(f"cache positions [{start}, {start + length}) do not fit max_len={self.max_len}; "
                             "build the cache with max_len ≥ prompt + new tokens")

    def update(self, layer: int, k: Tensor, v: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """Write k, v (B, H, n, D) at positions [start, start + n) of ``layer``;
        returns that layer's keys and values (B, H, start + n, D) (views)."""
        n = k.shape[2]
        self.k[layer, :, :, start : start + n] = k
        self.v[layer, :, :, start : start + n] = v
        return self.k[layer, :, :, : start + n], self.v[layer, :, :, : start + n]
