"""The seed system's single-device dilated attention classes, (b, n, h, d)
layout and constructor signatures, computing what they claimed, exactly.

``DilatedAttention`` and ``ImprovedDilatedAttention`` both compute the seed's
head-group dilated attention, which is ``dilcompile.dilated_attention(...,
mode="groups")`` (the "improved" one attended across heads and skipped groups
whose segment exceeded N; that is not reproduced). The multihead classes are
:class:`dilcompile.MultiheadDilatedAttention` with ``mode="groups"``, the
seed's argument order ``(embed_dim, num_heads, dilation_rates, segment_lengths)``,
its projections and LayerNorms, and they load its state dicts
(:mod:`dilcompile.compat.state_dict`). docs/compat.md lists every difference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import dilated
from ..multihead import MultiheadDilatedAttention as _ModernMultihead
from ._deprecation import warn_once
from .checks import check_bne, check_bnhd, check_branches, check_dropout, warn_head_dim
from .state_dict import accept_seed_state_dicts

_NO_EFFECT = ("use_tf32", "device", "dtype")  # seed config fields that change nothing here


def _take_no_effect(seed_name: str, kwargs: dict) -> None:
    unknown = sorted(set(kwargs) - set(_NO_EFFECT))
    if unknown:
        raise TypeError(f"{seed_name} got unexpected keyword arguments {unknown}; it accepts {list(_NO_EFFECT)} "
                        "besides its named parameters")


class _SeedAttention(nn.Module):
    """(b, n, h, d) → (b, n, h, d) seed attention call shape: a subclass
    implements ``_attend(q, k, v, causal)`` on (b, h, n, d); this owns the
    layout, the input checks, the refused ``attention_mask`` and the seed's
    output dropout."""

    def __init__(self, seed_name: str, modern: str, dropout: float):
        super().__init__()
        warn_once(seed_name, modern)
        self.dropout = check_dropout(dropout)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        raise NotImplementedError

    def forward(self, query: Tensor, key: Tensor, value: Tensor, is_causal: bool = False,
                attention_mask: Tensor | None = None) -> Tensor:
        """query, key, value: (b, n, h, d) → (b, n, h, d)."""
        if attention_mask is not None:
            raise ValueError("attention_mask is not supported (the seed ignored it); for padding use "
                             "dilcompile.dilated_attention(..., key_padding_mask=(B, N) bool) or the multihead class")
        check_bnhd(query, key, value)
        out = self._attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), is_causal)  # (b, h, n, d)
        out = F.dropout(out, self.dropout, self.training)  # the seed's dropout on the attention output
        return out.transpose(1, 2).contiguous()  # seed callers .view() the result


class _GroupsAttention(_SeedAttention):
    """Seed head-group dilated attention on one device."""

    def __init__(self, seed_name: str, segment_lengths, dilation_rates, dropout: float, softmax_scale):
        check_branches(segment_lengths, dilation_rates)
        super().__init__(seed_name, "dilcompile.DilatedAttention(segment_lengths, dilation_rates, mode='groups') "
                         "on (B, H, N, D) inputs", dropout)
        self.config = dilated.DilatedAttentionConfig(segment_lengths, dilation_rates, mode="groups",
                                                     scale=softmax_scale)

    @property
    def segment_lengths(self):
        return list(self.config.segment_lengths)

    @property
    def dilation_rates(self):
        return list(self.config.dilation_rates)

    @property
    def num_groups(self) -> int:
        return len(self.config.segment_lengths)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        c = self.config
        return dilated.dilated_attention(q, k, v, segment_lengths=c.segment_lengths, dilation_rates=c.dilation_rates,
                                         causal=causal, mode="groups", scale=c.scale)

    def extra_repr(self) -> str:
        return f"segment_lengths={self.segment_lengths}, dilation_rates={self.dilation_rates}, dropout={self.dropout}"


class DilatedAttention(_GroupsAttention):
    """Seed ``DilatedAttention``; ``op`` and the memory-pool flags have no effect."""

    def __init__(self, segment_lengths, dilation_rates, softmax_scale: float | None = None,
                 attention_dropout: float = 0.0, op=None, enable_memory_pool: bool = False,
                 enable_profiling: bool = False, lightweight_pool: bool = True, **kwargs):
        _take_no_effect("DilatedAttention", kwargs)
        super().__init__("DilatedAttention", segment_lengths, dilation_rates, attention_dropout, softmax_scale)


class ImprovedDilatedAttention(_GroupsAttention):
    """Seed ``ImprovedDilatedAttention``: the same numbers as ``DilatedAttention``;
    ``use_tf32`` and the memory-pool flags have no effect."""

    def __init__(self, segment_lengths, dilation_rates, dropout: float = 0.0, use_tf32: bool = True,
                 enable_memory_pool: bool = False, enable_profiling: bool = False, lightweight_pool: bool = True,
                 **kwargs):
        _take_no_effect("ImprovedDilatedAttention", kwargs)
        super().__init__("ImprovedDilatedAttention", segment_lengths, dilation_rates, dropout, None)


class SeedCallShape:
    """Mixin over a ``MultiheadAttentionBase`` subclass: the seed multihead call
    shape ``forward(query, key=None, value=None, key_padding_mask=None,
    need_weights=False, attn_mask=None, is_causal=False,
    average_attn_weights=True)``. ``key`` and ``value`` default to ``query``
    (each on its own, as in the seed). Returns ``out`` (B, N, E), or
    ``(out, None)`` with ``need_weights=True`` or where the seed class always
    returned a pair (``returns_pair``); the seed never returned weights."""

    returns_pair = False

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                key_padding_mask: Tensor | None = None, need_weights: bool = False, attn_mask: Tensor | None = None,
                is_causal: bool = False, average_attn_weights: bool = True):
        if attn_mask is not None:
            raise ValueError("attn_mask is not supported (the seed ignored it); use is_causal=True and/or "
                             "key_padding_mask=(B, N) bool, True = padding")
        key = query if key is None else key
        value = query if value is None else value
        check_bne(self, (("query", query), ("key", key), ("value", value)))
        out = self._seed_output(super().forward(query, key, value, is_causal=is_causal,
                                                key_padding_mask=key_padding_mask)[0])
        return (out, None) if need_weights or self.returns_pair else out

    def _seed_output(self, out: Tensor) -> Tensor:
        return out


class _SeedMultihead(SeedCallShape, _ModernMultihead):
    """Seed multihead dilated attention: modern groups-mode module, seed call
    shape, the seed's post-attention LayerNorm (``q_ln``, our ``sub_ln``)."""

    def __init__(self, seed_name, embed_dim, num_heads, dilation_rates, segment_lengths, dropout, bias, layer_norm,
                 layer_norm_eps, gamma_init, device, dtype):
        warn_once(seed_name, "dilcompile.MultiheadDilatedAttention(embed_dim, num_heads, segment_lengths, "
                  "dilation_rates, mode='groups') (segment_lengths comes first there)")
        check_branches(segment_lengths, dilation_rates)
        warn_head_dim(embed_dim, num_heads)
        super().__init__(embed_dim, num_heads, segment_lengths, dilation_rates, dropout=dropout, bias=bias,
                         sub_ln=layer_norm, mode="groups", device=device, dtype=dtype, gamma_init=gamma_init,
                         layer_norm_eps=layer_norm_eps)

    @property
    def q_ln(self) -> nn.LayerNorm | None:
        """The seed's name for the LayerNorm before the output projection."""
        return self.sub_ln


class MultiheadDilatedAttention(_SeedMultihead):
    """Seed ``MultiheadDilatedAttention``. With ``layer_norm=True`` it
    normalises the projected queries with ``q_ln`` and keys with ``k_ln``
    before attention, and the attention output with ``q_ln`` again (one
    LayerNorm, shared, as in the seed). All four projections get xavier-normal
    init with gain ``gamma_init``. ``op`` has no effect."""

    def __init__(self, embed_dim: int, num_heads: int, dilation_rates, segment_lengths, dropout: float = 0.0,
                 bias: bool = True, layer_norm: bool = True, layer_norm_eps: float = 1e-5, gamma_init: float = 1.0,
                 device=None, dtype=None, op=None):
        super().__init__("MultiheadDilatedAttention", embed_dim, num_heads, dilation_rates, segment_lengths, dropout,
                         bias, layer_norm, layer_norm_eps, gamma_init, device, dtype)
        self.k_ln = (nn.LayerNorm(embed_dim, eps=layer_norm_eps, device=device, dtype=dtype) if layer_norm
                     else None)
        accept_seed_state_dicts(self, keep_k_ln=True)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        e = self.embed_dim
        with torch.no_grad():  # the seed's separate q and k projections: gain γ too (the base: 1)
            nn.init.xavier_normal_(self.qkv_proj.weight[:e], gain=self.gamma_init)
            nn.init.xavier_normal_(self.qkv_proj.weight[e : 2 * e], gain=self.gamma_init)
        if getattr(self, "k_ln", None) is not None:
            self.k_ln.reset_parameters()

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().project(query, key, value)  # (B, N, E) each
        if self.k_ln is not None:
            q, k = self.sub_ln(q), self.k_ln(k)  # the seed's q/k LayerNorm; q_ln is our sub_ln
        return q, k, v


class ImprovedMultiheadDilatedAttention(_SeedMultihead):
    """Seed ``ImprovedMultiheadDilatedAttention``: fused projection, no q/k
    LayerNorm (the seed's fused path skipped it), ``q_ln`` before the output
    projection; returns ``(out, None)`` always, as the seed did. The seed's
    unused ``k_ln`` weights are dropped on load. ``use_tf32`` has no effect."""

    returns_pair = True

    def __init__(self, embed_dim: int, num_heads: int, dilation_rates, segment_lengths, dropout: float = 0.0,
                 bias: bool = True, layer_norm: bool = True, layer_norm_eps: float = 1e-5, gamma_init: float = 1.0,
                 device=None, dtype=None, use_tf32: bool = True):
        super().__init__("ImprovedMultiheadDilatedAttention", embed_dim, num_heads, dilation_rates, segment_lengths,
                         dropout, bias, layer_norm, layer_norm_eps, gamma_init, device, dtype)
        accept_seed_state_dicts(self, keep_k_ln=False)
