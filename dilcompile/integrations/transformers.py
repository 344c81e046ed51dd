"""Hugging Face transformers: our attention behind ``attn_implementation``.

    from dilcompile.integrations.transformers import register
    register()
    cfg.dilcompile_segment_lengths, cfg.dilcompile_dilation_rates = [2048, 4096], [1, 2]
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="dilcompile_dilated")

``register()`` adds two names to transformers' ``AttentionInterface`` and
``AttentionMaskInterface``:

- ``"dilcompile_dilated"``: :func:`dilcompile.dilated_attention`; model config
  keys ``dilcompile_segment_lengths`` and ``dilcompile_dilation_rates``
  (required), ``dilcompile_mode`` (optional, default "longnet").
- ``"dilcompile_block_sparse"``: :func:`dilcompile.block_sparse_attention`;
  config key ``dilcompile_pattern`` (required, a pattern spec string such as
  ``"local_window(window=256)"``), ``dilcompile_block_size`` (optional, 128).

The mask function hands the attention the 2-D padding mask (or None) instead
of a 4-D mask: the attention is causal when the module says so (``is_causal``)
and padding becomes ``key_padding_mask``. It refuses, with a ValueError, what
these cannot express exactly: masks other than plain causal / bidirectional
(sliding windows, packed sequences, custom mask functions), and caches whose
keys do not end at the last query (static or sliding caches; use the default
``DynamicCache``). Grouped-query attention repeats the key/value heads;
``scaling`` is the softmax scale; attention-probability dropout is refused
(set ``attention_dropout=0``). Positions inside the dilated geometry are
indices into the key tensor (with left padding, the pads count).
"""

from __future__ import annotations

import torch
from torch import Tensor

NAMES = ("dilcompile_dilated", "dilcompile_block_sparse")


def _config_value(config, key: str, example: str, default=None, required: bool = True):
    value = getattr(config, key, None)
    if value is None:
        if required:
            raise ValueError(f"the model config has no {key}; set it before building the model, e.g. "
                             f"config.{key} = {example}")
        return default
    return value


def _padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                  attention_mask=None, **kwargs):
    """AttentionMaskInterface entry: the (B, kv_length) bool padding mask
    (True = keep, HF's convention) or None, after checking that the mask
    HF asks for is one our attention expresses exactly."""
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

    if mask_function not in (causal_mask_function, bidirectional_mask_function):
        raise ValueError(f"dilcompile attention expresses only plain causal or bidirectional masks plus padding; "
                         f"this model asks for {getattr(mask_function, '__name__', mask_function)!r} (a sliding "
                         "window, packed sequences or a custom mask): use attn_implementation='sdpa' for it")
    if kv_offset != 0 or q_offset + q_length != kv_length:
        raise ValueError(f"dilcompile attention needs the keys to end at the last query (query i at key position "
                         f"Nk − Nq + i); got q_offset={q_offset}, q_length={q_length}, kv_offset={kv_offset}, "
                         f"kv_length={kv_length} — a static or sliding cache: use the default DynamicCache "
                         "(cache_implementation=None)")
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:].bool()
    if attention_mask.shape[1] != kv_length:
        raise ValueError(f"attention_mask covers {attention_mask.shape[1]} keys but the attention sees {kv_length}; "
                         "pass a (batch, past + new tokens) padding mask")
    return None if bool(attention_mask.all()) else attention_mask


def _inputs(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, dropout: float):
    """HF's (B, H, N, D) query and (B, Hkv, N, D) key/value → our q, k, v, causal, key_padding_mask."""
    if dropout:
        raise ValueError(f"dilcompile attention takes no attention-probability dropout (got {dropout}); set the "
                         "model config's attention_dropout=0.0")
    if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.dtype != torch.bool):
        raise ValueError(f"dilcompile attention got an attention_mask of shape {tuple(attention_mask.shape)} and "
                         f"dtype {attention_mask.dtype}; it takes the (B, Nk) padding mask its registered mask "
                         "function builds — call dilcompile.integrations.transformers.register() and build the "
                         "model with the same attn_implementation")
    groups = query.shape[1] // key.shape[1]
    if groups * key.shape[1] != query.shape[1]:
        raise ValueError(f"query has {query.shape[1]} heads, not a multiple of the {key.shape[1]} key/value heads")
    if groups > 1:  # grouped-query attention: kv head j serves query heads [j·groups, (j+1)·groups)
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    causal = bool(getattr(module, "is_causal", True))
    key_padding_mask = None if attention_mask is None else ~attention_mask
    return query, key, value, causal, key_padding_mask


def dilated_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """AttentionInterface entry for ``"dilcompile_dilated"``; returns ((B, Nq, H, D), None)."""
    from .. import dilated_attention

    config = module.config
    segments = _config_value(config, "dilcompile_segment_lengths", "[2048, 4096]")
    rates = _config_value(config, "dilcompile_dilation_rates", "[1, 2]")
    mode = _config_value(config, "dilcompile_mode", "'longnet'", "longnet", required=False)
    q, k, v, causal, key_padding_mask = _inputs(module, query, key, value, attention_mask, dropout)
    out = dilated_attention(q, k, v, segment_lengths=tuple(segments), dilation_rates=tuple(rates), causal=causal,
                            mode=mode, scale=scaling, key_padding_mask=key_padding_mask)
    return out.transpose(1, 2).contiguous(), None


def block_sparse_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """AttentionInterface entry for ``"dilcompile_block_sparse"``; returns ((B, Nq, H, D), None)."""
    from .. import block_sparse_attention

    config = module.config
    pattern = _config_value(config, "dilcompile_pattern", "'local_window(window=256)'")
    block_size = _config_value(config, "dilcompile_block_size", "128", 128, required=False)
    q, k, v, causal, key_padding_mask = _inputs(module, query, key, value, attention_mask, dropout)
    if key_padding_mask is not None:
        raise ValueError("dilcompile_block_sparse takes no padding mask (the pattern is batch-independent): pass "
                         "unpadded batches, or use attn_implementation='dilcompile_dilated'")
    out = block_sparse_attention(q, k, v, pattern, causal=causal, scale=scaling, block_size=block_size)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register ``"dilcompile_dilated"`` and ``"dilcompile_block_sparse"`` with
    transformers' attention and mask interfaces (idempotent)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as exc:
        raise ImportError("dilcompile.integrations.transformers needs transformers: "
                          "pip install 'dilcompile[hf]'") from exc
    for name, forward in zip(NAMES, (dilated_forward, block_sparse_forward)):
        AttentionInterface.register(name, forward)
        AttentionMaskInterface.register(name, _padding_mask)
