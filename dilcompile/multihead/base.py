"""``MultiheadAttentionBase``: everything a multihead attention module owns
except the attention itself.

A subclass implements one method, ``attend(q, k, v, *, is_causal,
key_padding_mask)`` on (B, H, N, D) tensors (and takes ``cu_seqlens=`` there
if it sets ``takes_cu_seqlens``); the base owns the projections,
the MAGNETO sub-LayerNorm, dropout, the ``nn.MultiheadAttention`` call shape
and the (B, N, E) ↔ (B, H, N, D) reshapes.

State-dict keys (stable; every subclass has exactly these):

=====================  ===========  =============================================
key                    shape        meaning
=====================  ===========  =============================================
``qkv_proj.weight``    (3E, E)      rows [0, E) query, [E, 2E) key, [2E, 3E) value
``qkv_proj.bias``      (3E,)        only with ``bias=True``; same row blocks
``sub_ln.weight``      (E,)         only with ``sub_ln=True``
``sub_ln.bias``        (E,)         only with ``sub_ln=True``
``out_proj.weight``    (E, E)
``out_proj.bias``      (E,)         only with ``bias=True``
=====================  ===========  =============================================

Self-attention (``key`` and ``value`` are ``query`` or None) runs one fused
(E → 3E) matmul; cross-attention applies the three row blocks of the same
weight to query, key and value separately, so both paths share parameters.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_positive_int


class MultiheadAttentionBase(nn.Module):
    """Batch-first multihead attention shell, ``nn.MultiheadAttention`` call shape.

    Args:
        embed_dim: E, model width; must be divisible by ``num_heads``.
        num_heads: H; head_dim D = E // H.
        dropout: probability applied to the attention output (B, N, E) before
            the output projection, in training only. The fused attention
            kernels take no dropout on attention probabilities.
        bias: biases on the projections.
        sub_ln: LongNet/MAGNETO sub-LayerNorm on the attention output before
            the output projection.
        gamma_init: MAGNETO γ. Query and key projections get xavier-normal
            init with gain 1; value and output projections gain γ. MAGNETO
            uses γ = sqrt(log 2L) for an L-layer decoder (the model sets it);
            1.0 is plain xavier. Biases start at 0.
        layer_norm_eps: eps of the sub-LayerNorm.
        device, dtype: of the parameters.
    """

    #: True where the attention needs key length == query length.
    requires_equal_lengths = False
    #: True where ``attend`` takes packed input: ``cu_seqlens=`` (docs/design.md, "Variable-length batches").
    takes_cu_seqlens = False

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        sub_ln: bool = True,
        gamma_init: float = 1.0,
        layer_norm_eps: float = 1e-5,
        device=None,
        dtype=None,
    ):
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            check_positive_int(name, value)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}); "
                             f"e.g. embed_dim={num_heads * max(1, round(embed_dim / num_heads))}")
        if not (isinstance(dropout, (int, float)) and 0.0 <= dropout < 1.0):
            raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
        if not (isinstance(gamma_init, (int, float)) and math.isfinite(gamma_init) and gamma_init > 0):
            raise ValueError(f"gamma_init must be a positive finite float, got {gamma_init!r}")
        if isinstance(layer_norm_eps, bool) or not (isinstance(layer_norm_eps, (int, float))
                                                    and 0 < layer_norm_eps < math.inf):
            raise ValueError(f"layer_norm_eps must be a positive finite float, got {layer_norm_eps!r}")
        for name, value in (("bias", bias), ("sub_ln", sub_ln)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = float(dropout)
        self.gamma_init = float(gamma_init)
        self.qkv_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias, **factory)
        self.sub_ln = nn.LayerNorm(embed_dim, eps=layer_norm_eps, **factory) if sub_ln else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        e = self.embed_dim
        with torch.no_grad():
            w = self.qkv_proj.weight  # (3E, E): each row block initialised as its own (E, E) matrix
            nn.init.xavier_normal_(w[:e])
            nn.init.xavier_normal_(w[e : 2 * e])
            nn.init.xavier_normal_(w[2 * e :], gain=self.gamma_init)
            nn.init.xavier_normal_(self.out_proj.weight, gain=self.gamma_init)
            for linear in (self.qkv_proj, self.out_proj):
                if linear.bias is not None:
                    linear.bias.zero_()
        if self.sub_ln is not None:
            self.sub_ln.reset_parameters()

    # -- the one method a subclass implements -------------------------------------------------
    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        """q: (B, H, Nq, D); k, v: (B, H, Nk, D); key_padding_mask: (B, Nk) bool,
        True = padding, or None. Returns (B, H, Nq, D)."""
        raise NotImplementedError(f"{type(self).__name__} must implement attend(q, k, v, *, is_causal, key_padding_mask)")

    # -- shared machinery ------------------------------------------------------------------------
    def _check(self, query, key, value, key_padding_mask, need_weights, is_causal, cache=None, layer_idx=0,
               start_pos=0, cu_seqlens=None) -> None:
        weight = self.qkv_proj.weight.dtype
        for name, t in (("query", query), ("key", key), ("value", value)):
            if name != "query" and t is query:  # self-attention: one tensor, checked once
                continue
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor of shape (B, N, E), got {type(t).__name__}")
            if t.dim() != 3 or t.shape[-1] != self.embed_dim:
                raise ValueError(f"{name} must have shape (B, N, embed_dim={self.embed_dim}) (batch first), "
                                 f"got {tuple(t.shape)}")
            if not t.is_floating_point():
                raise TypeError(f"{name} has dtype {t.dtype}; pass floating-point inputs of the parameters' "
                                f"dtype {weight} (e.g. {name}.to({weight}))")
            if t.dtype != weight and not torch.is_autocast_enabled(t.device.type):
                raise TypeError(f"{name} has dtype {t.dtype} but the module's parameters are {weight}: cast "
                                f"the input ({name}.to({weight})), convert the module (.to({t.dtype})) or "
                                "run under torch.autocast")
        if key.shape != value.shape:
            raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must have the same shape")
        if key.shape[0] != query.shape[0]:
            raise ValueError(f"query has batch {query.shape[0]} but key has {key.shape[0]}; pass equal batches")
        if cache is not None:
            if key is not query or value is not query:
                raise ValueError("cache= is for self-attention: pass key=None and value=None")
            cache.check(layer_idx, query.shape[0], self.num_heads, self.head_dim, self.qkv_proj.weight.dtype,
                        query.device, start_pos, query.shape[1])
        if self.requires_equal_lengths and key.shape[1] != query.shape[1]:
            raise ValueError(f"{type(self).__name__} needs key length == query length, got {key.shape[1]} "
                             f"and {query.shape[1]}; pad the shorter one and mark it in key_padding_mask")
        if not isinstance(is_causal, bool):
            raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
        if cu_seqlens is not None:
            if not self.takes_cu_seqlens:
                raise ValueError(f"{type(self).__name__} takes no cu_seqlens (packed sequences); pass a padded "
                                 "batch with key_padding_mask, or cu_seqlens=None")
            if cache is not None:
                raise ValueError("cu_seqlens and cache= do not go together: a KV cache holds one sequence per "
                                 "batch row; pass a padded batch with key_padding_mask instead")
        if need_weights:
            raise ValueError("need_weights=True is not supported: the N×N attention weights are never "
                             "materialised; pass need_weights=False")
        if key_padding_mask is not None:
            if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
                raise TypeError("key_padding_mask must be a bool tensor (B, N), True = padding "
                                "(for a float mask use mask != 0)")
            keys = key.shape[:2] if cache is None else (key.shape[0], start_pos + key.shape[1])
            if key_padding_mask.shape != keys:
                raise ValueError(f"key_padding_mask has shape {tuple(key_padding_mask.shape)}, "
                                 f"expected (B, N) = {tuple(keys)}" + ("" if cache is None else
                                 " (every key in the cache, the new tokens included)"))

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, N, E) inputs → q, k, v (B, N, E). One fused matmul for self-attention."""
        if key is query and value is query:
            return self.qkv_proj(query).chunk(3, dim=-1)
        w = self.qkv_proj.weight.chunk(3, dim=0)
        b = self.qkv_proj.bias.chunk(3, dim=0) if self.qkv_proj.bias is not None else (None, None, None)
        return F.linear(query, w[0], b[0]), F.linear(key, w[1], b[1]), F.linear(value, w[2], b[2])

    def _split_heads(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)  # (B, N, E) → (B, H, N, D)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        is_causal: bool = False,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        attn_mask: Tensor | None = None,
        cache=None,
        layer_idx: int = 0,
        start_pos: int = 0,
        cu_seqlens: Tensor | None = None,
    ) -> tuple[Tensor, None]:
        """query (B, Nq, E); key, value (B, Nk, E), default ``query`` (value
        defaults to key); key_padding_mask (B, Nk) bool, True = padding:
        padding is absence, each row computed as its real tokens alone
        (docs/design.md, "Variable-length batches").
        Returns (out (B, Nq, E), None) like ``nn.MultiheadAttention``, whose
        ``attn_mask=None`` is taken too (a mask is refused: the pattern is the mask).

        Packed sequences: ``cu_seqlens`` (S + 1,) int tensor from 0 to total
        with query (1, total, E) holding S sequences end to end; each is
        computed as if it were alone (the attention's ``cu_seqlens``).

        Generation: with ``cache`` (a :class:`~dilcompile.kv_cache.KVCache`),
        self-attention only, ``query`` holds the tokens at positions
        ``[start_pos, start_pos + Nq)``; their keys and values are written to
        layer ``layer_idx`` of the cache and the queries attend to every key
        in it up to their own position (the attention's Nq < Nk convention)."""
        if attn_mask is not None:  # taken (None) as nn.MultiheadAttention takes it, for drop-in calls
            raise ValueError("attn_mask is not supported: the attention's own pattern is its mask; pass "
                             "is_causal=True for a causal mask and key_padding_mask for padding")
        key = query if key is None else key
        value = key if value is None else value
        self._check(query, key, value, key_padding_mask, need_weights, is_causal, cache, layer_idx, start_pos,
                    cu_seqlens)
        q, k, v = (self._split_heads(t) for t in self.project(query, key, value))  # (B, H, N, D)
        if cache is not None:
            k, v = cache.update(layer_idx, k, v, start_pos)  # (B, H, start_pos + Nq, D)
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}  # only subclasses that take it see it
        out = self.attend(q, k, v, is_causal=is_causal, key_padding_mask=key_padding_mask, **packed)  # (B, H, Nq, D)
        out = out.transpose(1, 2).flatten(2)  # (B, Nq, E)
        if self.sub_ln is not None:
            out = self.sub_ln(out)
        out = F.dropout(out, self.dropout, self.training)
        return self.out_proj(out), None

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
                f"sub_ln={self.sub_ln is not None}, gamma_init={self.gamma_init}")
