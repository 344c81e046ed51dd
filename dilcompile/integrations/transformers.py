"""Hugging Face transformers: our attention behind ``attn_implementation``.

    from dilcompile.integrations.transformers import configure, register
    register()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="dilcompile_dilated",
                                                 dilcompile_segment_lengths=[2048, 4096],
                                                 dilcompile_dilation_rates=[1, 2])
    # or, on a model or config already built:
    configure(model, segment_lengths=[2048, 4096], dilation_rates=[1, 2])

``register()`` adds two names to transformers' ``AttentionInterface`` and
``AttentionMaskInterface`` and makes the ``dilcompile_*`` config keys checked
attributes of every transformers config (``hf_config``):

- ``"dilcompile_dilated"``: :func:`dilcompile.dilated_attention`; config keys
  ``dilcompile_segment_lengths`` and ``dilcompile_dilation_rates``
  (required), ``dilcompile_mode`` (optional, default "longnet").
- ``"dilcompile_block_sparse"``: :func:`dilcompile.block_sparse_attention`;
  config key ``dilcompile_pattern`` (required, a pattern spec string such as
  ``"local_window(window=256)"``), ``dilcompile_block_size`` (optional, 128).

Every sequence of a batch is computed as if it were alone (docs/design.md,
"Variable-length batches"), whatever else shares the batch:

- padding: the mask function hands the attention HF's 2-D padding mask, which
  becomes ``key_padding_mask`` (padding is absence: positions count from a
  row's first real token);
- packing: several documents in one row, from HF's ``cu_seq_lens_q`` /
  ``cu_seq_lens_k`` keywords (``DataCollatorWithFlattening``) or, without a
  padding mask, from ``position_ids`` restarting (a new sequence wherever a
  position is not the previous one + 1, transformers' rule).

Both are tensor computations with fixed shapes: a model compiles with
``fullgraph=True`` with or without a mask, for training or under
``torch.no_grad`` with the KV cache (serving). The mask function refuses, with a
ValueError, what these cannot express exactly: masks other than causal /
bidirectional (sliding windows, custom mask functions), and sliding-window
caches. A static cache (``cache_implementation="static"``) hands the attention
its whole buffer, queries in the middle: the mask function describes its
slots (``hf_sequences.slot_map``, 4-D so that generate builds it once a step
as a prepared mask); a prefill rotates the written slots to the end of the
key axis, a decode step reads the keys it attends in place, one graph for
every decode step.
Grouped-query attention repeats the key/value heads;
``scaling`` is the softmax scale; attention-probability dropout is refused
(set the config's attention dropout to 0, or call ``model.eval()``). An
``is_causal`` keyword overrides ``module.is_causal``, as in transformers'
sdpa (CLIP's text encoder is causal only through it). Every other keyword a
model passes is either read (packing), without effect on the result, or
refused when set, naming the module and the keyword: soft-capping, attention
sinks, position bias, sparse-attention indices, sliding windows,
``output_attentions=True`` (``HONOURED``, ``INERT``, ``REFUSED``).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from ..checks import check_scale
from ..tracing import tracing
from . import hf_sequences
from .hf_config import CHECKS, check_branches_of, check_config, configure, install_config_keys, pattern_of

__all__ = ["NAMES", "configure", "register"]

NAMES = ("dilcompile_dilated", "dilcompile_block_sparse")


def _closure(fn) -> dict:
    return dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__ or ())))


def _unpack_mask_function(mask_function):
    """(base mask function, packed sequence ids or None). For packed rows
    transformers composes the causal function with its packing mask —
    and_masks(packed_sequence_mask_function(ids), remap_positions_for_packed_sequence(causal, pos))
    up to 5.23, the two parts the other way round in 5.24 — and we handle the
    packing ourselves. The parts are told apart by their code objects, in
    whatever order and nesting; anything else is returned whole (and refused
    by the caller unless it is a plain causal or bidirectional function)."""
    from transformers import masking_utils as hf

    and_code = hf.and_masks().__code__
    packed_code = hf.packed_sequence_mask_function(None).__code__
    remap = getattr(hf, "remap_positions_for_packed_sequence", None)
    remap_code = remap(None, None).__code__ if remap is not None else None

    leaves, stack = [], [mask_function]
    while stack:  # flatten nested and_masks
        fn = stack.pop()
        if getattr(fn, "__code__", None) is and_code:
            stack.extend(_closure(fn).get("mask_functions") or ())
        else:
            leaves.append(fn)
    packed = [fn for fn in leaves if fn.__code__ is packed_code]
    others = [fn for fn in leaves if fn.__code__ is not packed_code]
    if len(packed) != 1 or len(others) != 1:
        return mask_function, None
    base = others[0]
    if remap_code is not None and getattr(base, "__code__", None) is remap_code:
        base = _closure(base)["mask_function"]
    return base, _closure(packed[0])["packed_sequence_mask"]


def _windowed(config) -> bool:
    """Whether a config declares sliding-window or chunked attention layers."""
    layer_types = getattr(config, "layer_types", None) or ()
    sliding = getattr(config, "sliding_window", None) is not None and (not layer_types or any(
        "sliding" in str(kind) for kind in layer_types))
    return sliding or getattr(config, "attention_chunk_size", None) is not None


# Every keyword transformers' models pass their attention function besides query, key, value and
# attention_mask (tests/test_hf_keywords.py walks the installed transformers' model files and fails on
# one missing here). HONOURED are read as transformers' sdpa_attention_forward reads them (is_causal
# over module.is_causal); INERT cannot change our result; REFUSED are refused when set.
HONOURED = ("dropout", "scaling", "is_causal", "cu_seq_lens_q", "cu_seq_lens_k", "position_ids")
INERT = {
    "max_length_q": "the longest packed query sequence, implied by cu_seq_lens_q",
    "max_length_k": "the longest packed key sequence, implied by cu_seq_lens_k",
    "num_items_in_batch": "read by the loss",
    "output_hidden_states": "read by the model",
    "output_router_logits": "read by the model's mixture-of-experts layers",
    "seq_idx": "packed rows for state-space layers; attention layers read cu_seq_lens_* / position_ids, as sdpa",
}
REFUSED = {  # keyword → (what it asks of the attention, the way out)
    "softcap": ("attention-logit soft-capping (Gemma 2-style attn_logit_softcapping)", "attn_implementation='eager'"),
    "s_aux": ("attention sinks (GPT-OSS-style s_aux, a learned logit in every softmax row)",
              "attn_implementation='eager'"),
    "sinks": ("attention sinks (a sink logit in every softmax row)", "attn_implementation='eager'"),
    "position_bias": ("an additive position bias on every score (T5-style relative attention)",
                      "attn_implementation='sdpa'"),
    "indices": ("the keys a sparse-attention indexer chose per query (DeepSeek-style sparse attention)",
                "attn_implementation='eager'"),
    "block_indices": ("the key blocks a sparse-attention indexer chose per query", "attn_implementation='eager'"),
    "sliding_window": ("a sliding attention window", "attn_implementation='sdpa'"),
    "output_attentions": ("the attention probabilities (output_attentions=True)",
                          "attn_implementation='eager', or output_attentions=False"),
    "deterministic": ("a run-to-run reproducible backward (flash-attention's deterministic mode), which a tuned "
                      "backward adding dq atomically does not give", "deterministic_flash_attn=False"),
}


def _keywords(module, kwargs: dict) -> bool:
    """Refuse a set keyword of ``REFUSED`` (not None, False or 0), naming the
    module (its model family) and the keyword; → whether the attention is
    causal: the ``is_causal`` keyword where given (CLIP's text encoder passes
    True while its modules say False), else ``module.is_causal``."""
    for name, (what, way_out) in REFUSED.items():
        value = kwargs.get(name)
        if value is None or (isinstance(value, (bool, int, float)) and not value):
            continue
        shown = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else repr(value)
        raise ValueError(f"{type(module).__name__} passes {name}={shown}: {what}, which dilcompile attention does "
                         f"not compute; use {way_out}")
    causal = kwargs.get("is_causal")
    return bool(getattr(module, "is_causal", True) if causal is None else causal)


def _padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                  attention_mask=None, **kwargs):
    """AttentionMaskInterface entry. Returns what the attention needs: the
    (B, kv_length) bool padding mask (True = keep, HF's convention), the
    (B, N) int sequence ids of packed rows, or None."""
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

    if mask_function in (causal_mask_function, bidirectional_mask_function):
        base, packed_ids = mask_function, None
    elif tracing():
        # A trace cannot look inside closures: unless the config declares windowed layers, take the
        # composed function as transformers' packed-row composition of the causal mask (the one it
        # builds under tracing when no padding mask is given); the attention reads the packing
        # from position_ids.
        base, packed_ids = (mask_function if _windowed(kwargs.get("config")) else causal_mask_function), None
    else:
        base, packed_ids = _unpack_mask_function(mask_function)
    if base not in (causal_mask_function, bidirectional_mask_function):
        raise ValueError(f"dilcompile attention expresses only plain causal or bidirectional masks plus padding "
                         f"and packing; this model asks for {getattr(base, '__name__', base)!r} (a sliding "
                         "window or a custom mask): use attn_implementation='sdpa' for it")
    if kv_offset != 0 or (not isinstance(q_offset, Tensor) and q_offset + q_length > kv_length):
        raise ValueError(f"dilcompile attention needs every key from the sequence's first token on (got q_offset="
                         f"{q_offset}, q_length={q_length}, kv_offset={kv_offset}, kv_length={kv_length}) — a "
                         "sliding-window cache: use the default DynamicCache or cache_implementation='static'")
    if isinstance(q_offset, Tensor) or q_offset + q_length < kv_length:  # a static cache: keys are its slots
        if attention_mask is not None and attention_mask.shape[1] > kv_length:
            raise ValueError(f"attention_mask covers {attention_mask.shape[1]} tokens but the static cache holds "
                             f"{kv_length}; generate with a larger max_cache_len")
        padding = None if attention_mask is None else attention_mask.bool()
        return hf_sequences.slot_map(padding, batch_size, q_offset, q_length, kv_length, kwargs.get("device"))
    if attention_mask is None:
        return packed_ids
    attention_mask = attention_mask[:, -kv_length:].bool()
    if attention_mask.shape[1] != kv_length:
        raise ValueError(f"attention_mask covers {attention_mask.shape[1]} keys but the attention sees {kv_length}; "
                         "pass a (batch, past + new tokens) padding mask")
    return attention_mask


def _inputs(query: Tensor, key: Tensor, value: Tensor, attention_mask, dropout: float, repeat: bool = True):
    """HF's (B, H, N, D) query and (B, Hkv, N, D) key/value → our q, k, v;
    ``repeat=False`` leaves grouped key/value heads unrepeated."""
    if dropout:
        raise ValueError(f"dilcompile attention takes no attention-probability dropout (got {dropout}); set the "
                         "config's attention dropout to 0.0 (attention_dropout, or attention_probs_dropout_prob "
                         "for BERT-style models), or call model.eval() for inference")
    if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.dtype.is_floating_point):
        raise ValueError(f"dilcompile attention got an attention_mask of shape {tuple(attention_mask.shape)} and "
                         f"dtype {attention_mask.dtype}; it takes the 2-D mask its registered mask function "
                         "builds — call dilcompile.integrations.transformers.register() and build the model "
                         "with the same attn_implementation")
    groups = query.shape[1] // key.shape[1]
    if groups * key.shape[1] != query.shape[1]:
        raise ValueError(f"query has {query.shape[1]} heads, not a multiple of the {key.shape[1]} key/value heads")
    if groups > 1 and repeat:  # grouped-query attention: kv head j serves query heads [j·groups, (j+1)·groups)
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return query, key, value


def _constant_scale(q: Tensor, scaling) -> tuple[Tensor, float | None]:
    """(q, scale) with ``scale`` a constant for our ops' float argument.
    Compiled with dynamic=True, Dynamo keeps a module's float attribute (HF's
    ``scaling``) symbolic: the usual head_dim ** -0.5 is matched to the
    constant (exact); any other scale is folded into q, one rounding of q in
    its dtype (compiled only)."""
    scaling = check_scale(scaling)
    if scaling is None or not tracing():
        return q, scaling
    usual = q.shape[-1] ** -0.5  # the head dim comes from the weights' shapes: static
    return (q, usual) if scaling == usual else (q * scaling, 1.0)


def _attend(attention, module, query, key, value, attention_mask, dropout, scaling, kwargs, decode) -> Tensor:
    """Run ``attention(q, k, v, causal, scale, **sequences)`` with the batch's
    sequences described as the attention API takes them; → (B, Nq, H, D).
    A static cache's decode step (one query per row) reads only the keys
    ``keys_of(position, slots, heads, causal)`` lists, ``decode`` being
    (keys_of, weights_of(position, keys, heads), divisor of the output)
    (``hf_sequences.decode_step``)."""
    causal = _keywords(module, kwargs)
    static = hf_sequences.is_slot_map(attention_mask)  # a static cache's slots
    if static and query.shape[2] == 1:
        q, _, _ = _inputs(query, key, value, None, dropout, repeat=False)
        q, scale = _constant_scale(q, scaling)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        keys_of, weights_of, divisor = decode
        out = hf_sequences.decode_step(q, key, value, attention_mask,
                                       lambda p: keys_of(p, key.shape[2], q.shape[1], causal),
                                       lambda p, keys: weights_of(p, keys, q.shape[1]), scale)
        return (out if divisor == 1 else out / divisor).transpose(1, 2).contiguous()
    if static:
        key, value, pads = hf_sequences.cache_order(key, value, attention_mask)  # before GQA's repeat: less to move
        attention_mask = ~pads  # now a padding mask like any other, the queries at the end of the keys
    q, k, v = _inputs(query, key, value, attention_mask, dropout)
    q, scale = _constant_scale(q, scaling)
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    is_padding = attention_mask is not None and attention_mask.dtype == torch.bool
    if cu_q is not None or cu_k is not None:  # packed rows, boundaries given (DataCollatorWithFlattening)
        if is_padding:
            raise ValueError("cu_seq_lens_q / cu_seq_lens_k describe packed rows; pass them without an "
                             "attention_mask (packed rows have no padding)")
        out = attention(q, k, v, causal, scale, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        return out.transpose(1, 2).contiguous()

    def plain(q, k, v):
        return attention(q, k, v, causal, scale)

    if is_padding:
        pads = ~attention_mask  # (B, Nk), True = pad

        def padded(q, k, v, pads):
            return attention(q, k, v, causal, scale, key_padding_mask=pads)

        out = _plain_unless(pads.any(), padded, plain, q, k, v, pads)
    else:
        ids = attention_mask  # (B, N) ids of packed rows found by transformers' mask preparation, or None
        position_ids = kwargs.get("position_ids")
        if ids is None and position_ids is not None and q.shape[2] == k.shape[2]:
            ids = hf_sequences.ids_from_positions(position_ids, q.shape[0])

        def packed(q, k, v, ids):
            flat = [hf_sequences.flatten(t) for t in (q, k, v)]
            out = attention(*flat, causal, scale, cu_seqlens=hf_sequences.cu_seqlens_of(ids))
            return hf_sequences.unflatten(out, q.shape[0])

        out = plain(q, k, v) if ids is None else _plain_unless((ids[:, -1] != 0).any(), packed, plain, q, k, v, ids)
    return out.transpose(1, 2).contiguous()


def _plain_unless(needed: Tensor, special, plain, q: Tensor, k: Tensor, v: Tensor, data: Tensor) -> Tensor:
    """``special(q, k, v, data)`` (padded / packed rows) if ``needed``, else
    the batched ``plain(q, k, v)`` — equal results when not needed, plain
    being one call for the batch. Eagerly a Python branch (one host sync).
    Compiled, ``special`` always: it is exact either way, and the
    ``torch.cond`` that chose at run time broke compiled serving — Inductor
    handed its branches operands in other strides than it compiled them for
    under ``torch.no_grad``, and Dynamo lost the cache layers' attributes set
    before it (``fullgraph=True`` with ``use_cache``)."""
    if tracing() or bool(needed):
        return special(q, k, v, data)
    return plain(q, k, v)


def dilated_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """AttentionInterface entry for ``"dilcompile_dilated"``; returns ((B, Nq, H, D), None)."""
    from .. import dilated_attention

    segments, rates, mode = check_branches_of(module.config)

    def attention(q, k, v, causal, scale, **sequences):
        return dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, causal=causal, mode=mode,
                                 scale=scale, **sequences)

    def keys_of(position, slots, heads, causal):
        from ..dilated.decode_gather import decode_keys

        return decode_keys(position, slots, heads, segments, rates, mode)

    def weights_of(position, keys, heads):
        from ..dilated.decode_gather import key_weights

        return key_weights(position, keys, heads, segments, rates, mode)

    decode = (keys_of, weights_of, len(segments) if mode == "groups" else 1)  # groups mode: the merged output ÷ m
    return _attend(attention, module, query, key, value, attention_mask, dropout, scaling, kwargs, decode), None


def block_sparse_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """AttentionInterface entry for ``"dilcompile_block_sparse"``; returns ((B, Nq, H, D), None)."""
    from .. import block_sparse_attention

    pattern, block_size = pattern_of(module.config)

    def attention(q, k, v, causal, scale, **sequences):
        return block_sparse_attention(q, k, v, pattern, causal=causal, scale=scale, block_size=block_size,
                                      **sequences)

    def keys_of(position, slots, heads, causal):
        from ..block_sparse.decode_gather import decode_keys

        return decode_keys(position, slots, heads, pattern, causal, block_size,
                           longest=getattr(module.config, "max_position_embeddings", None))

    def weights_of(position, keys, heads):
        from ..block_sparse.decode_gather import key_weights

        return key_weights(position, keys, heads, pattern.with_heads(heads))

    return _attend(attention, module, query, key, value, attention_mask, dropout, scaling, kwargs,
                   (keys_of, weights_of, 1)), None


_WARNED: set[int] = set()  # configs warned about (by id: a config defines __eq__, so it is unhashable)


def _configured_attention(config) -> str | None:
    """The attention a config's ``dilcompile_*`` keys were written for, or None."""
    if config is None:
        return None
    if getattr(config, "dilcompile_pattern", None) is not None:
        return "dilcompile_block_sparse"
    if getattr(config, "dilcompile_segment_lengths", None) is not None:
        return "dilcompile_dilated"
    return None


def _patch_attention_choice() -> None:
    """Wrap transformers' attention choice (idempotent):

    - Models that run their own attention code (BLOOM, GPT-J, Falcon,
      CodeGen before transformers 5.24, …: ``_supports_attention_backend``
      False) never call ours, yet transformers takes any registered name for
      them — and they then got our mask, not the causal one, and ran silently
      non-causal. Such a model asking for ours is refused when it is built or
      switched.
    - A config carrying ``dilcompile_*`` keys (a checkpoint saved with our
      attention) reloaded without ``attn_implementation=`` ran sdpa silently,
      its logits off by more than 1: it now warns, naming the argument (not
      when another attention is asked for by name: comparing is deliberate)."""
    from transformers import PreTrainedModel

    chosen = PreTrainedModel.get_correct_attn_implementation
    if getattr(chosen, "_dilcompile", False):
        return

    def get_correct_attn_implementation(self, requested_attention=None, is_init_check=False):
        if requested_attention in NAMES and not getattr(type(self), "_supports_attention_backend", False):
            raise ValueError(f"{type(self).__name__} runs its own attention code rather than transformers' "
                             f"AttentionInterface, so attn_implementation={requested_attention!r} cannot reach it; "
                             "use a model whose attention dispatches through the interface (Llama, Qwen, Mistral, "
                             "GPT-2, OPT, BERT, …)")
        result = chosen(self, requested_attention, is_init_check)
        config = getattr(self, "config", None)
        if result in NAMES and config is not None:
            check_config(config)  # keys set before register() were never checked (nor the pattern parsed)
        ours = _configured_attention(config)
        if requested_attention is None and ours is not None and result not in NAMES and id(config) not in _WARNED:
            _WARNED.add(id(config))  # once per config: a model and its submodules share one
            warnings.warn(f"{type(self).__name__}'s config carries dilcompile_* keys (saved with {ours!r}), but the "
                          f"model runs attn_implementation={result!r}; pass attn_implementation={ours!r} to "
                          "from_pretrained / from_config to run the attention it was trained with",
                          UserWarning, stacklevel=3)
        return result

    get_correct_attn_implementation._dilcompile = True
    PreTrainedModel.get_correct_attn_implementation = get_correct_attn_implementation


def _patch_from_config() -> None:
    """``from_config(config, dilcompile_...=...)`` sets the keys on a copy of
    the config, as ``from_pretrained`` takes them (transformers hands
    ``from_config``'s other keywords to the model's ``__init__``, which
    refused ours with a TypeError). Idempotent."""
    import copy

    from transformers import PreTrainedModel

    original = PreTrainedModel._from_config.__func__
    if getattr(original, "_dilcompile", False):
        return

    def _from_config(cls, config, **kwargs):
        keys = {key: kwargs.pop(key) for key in list(kwargs) if key in CHECKS}
        if keys:
            config = copy.deepcopy(config)  # the caller's config stays as it was, as from_config leaves it
            for key, value in keys.items():
                setattr(config, key, value)  # checked attributes: a bad value fails here, naming the key
        return original(cls, config, **kwargs)

    _from_config._dilcompile = True
    PreTrainedModel._from_config = classmethod(_from_config)


def register() -> None:
    """Register ``"dilcompile_dilated"`` and ``"dilcompile_block_sparse"`` with
    transformers' attention and mask interfaces, and make the ``dilcompile_*``
    config keys checked attributes of ``PreTrainedConfig`` (idempotent)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as exc:
        raise ImportError("dilcompile.integrations.transformers needs transformers: "
                          "pip install 'dilcompile[hf]'") from exc
    install_config_keys()
    _patch_attention_choice()
    _patch_from_config()
    for name, forward in zip(NAMES, (dilated_forward, block_sparse_forward)):
        AttentionInterface.register(name, forward)
        AttentionMaskInterface.register(name, _padding_mask)
