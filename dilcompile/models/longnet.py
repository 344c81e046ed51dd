"""A small LongNet decoder: token + learned position embeddings, pre-LN blocks
of causal ``MultiheadDilatedAttention`` and an MLP, a final LayerNorm and an
output head tied to the token embedding. Nothing compile-specific lives here:
``torch.compile(model, fullgraph=True)`` happens at the call site."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import INT64_MAX, check_bool, check_int, check_positive_int
from ..kv_cache import KVCache, keys_dtype
from ..multihead import MultiheadDilatedAttention
from ..tracing import tracing
from ..varlen import _check_cu_tensor, check_padding_mask, packed_sequences
from .sampling import check_prompt, check_sampling, check_token_ids, crop_rows, last_real, left_pad, pick


@dataclass(frozen=True)
class LongNetConfig:
    vocab_size: int  # number of token ids
    max_seq_len: int = 256  # longest context (size of the position table)
    embed_dim: int = 128  # model width E
    num_heads: int = 4  # attention heads; head_dim = E / H
    num_layers: int = 2  # decoder blocks
    segment_lengths: tuple[int, ...] = (64, 128, 256)  # dilated attention branches (w_i)
    dilation_rates: tuple[int, ...] = (1, 2, 4)  # and their rates (r_i)
    mode: str = "longnet"  # dilated attention mode, see dilcompile.dilated_attention
    impl: str = "auto"  # dilated attention implementation ("auto", "sdpa", "triton", "reference")
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio · E
    dropout: float = 0.0  # on the embeddings, attention and MLP outputs

    def __post_init__(self):
        for name in ("vocab_size", "max_seq_len", "embed_dim", "num_heads", "num_layers", "mlp_ratio"):
            value = getattr(self, name)
            check_positive_int(name, value)
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({self.num_heads})")
        object.__setattr__(self, "segment_lengths", tuple(self.segment_lengths))
        object.__setattr__(self, "dilation_rates", tuple(self.dilation_rates))
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LongNetConfig:
        return cls(**json.loads(text))


def _padding(mask: Tensor | None) -> dict:
    """forward's padding keyword; an unpadded batch passes none (its compiled
    step takes no mask input)."""
    return {} if mask is None else {"key_padding_mask": mask}


class Block(nn.Module):
    """Pre-LN decoder block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, c: LongNetConfig, gamma: float):
        super().__init__()
        self.ln_attn = nn.LayerNorm(c.embed_dim)
        self.attn = MultiheadDilatedAttention(c.embed_dim, c.num_heads, c.segment_lengths, c.dilation_rates,
                                              dropout=c.dropout, mode=c.mode, gamma_init=gamma, impl=c.impl)
        self.ln_mlp = nn.LayerNorm(c.embed_dim)
        self.fc_in = nn.Linear(c.embed_dim, c.mlp_ratio * c.embed_dim)
        self.fc_out = nn.Linear(c.mlp_ratio * c.embed_dim, c.embed_dim)
        self.dropout = c.dropout
        for fc in (self.fc_in, self.fc_out):  # MAGNETO: γ-scaled xavier on the MLP too
            nn.init.xavier_normal_(fc.weight, gain=gamma)
            nn.init.zeros_(fc.bias)

    def forward(self, x: Tensor, cache: KVCache | None = None, layer_idx: int = 0, start_pos: int = 0,
                key_padding_mask: Tensor | None = None, cu_seqlens: Tensor | None = None) -> Tensor:
        # (B, N, E) → (B, N, E)
        a = self.attn(self.ln_attn(x), is_causal=True, cache=cache, layer_idx=layer_idx, start_pos=start_pos,
                      key_padding_mask=key_padding_mask, cu_seqlens=cu_seqlens)[0]
        x = x + a
        h = self.fc_out(F.gelu(self.fc_in(self.ln_mlp(x))))
        return x + F.dropout(h, self.dropout, self.training)


class LongNetDecoder(nn.Module):
    """Causal language model. ``forward(idx (B, N) int64, targets (B, N) or None)``
    returns ``(logits (B, N, vocab), loss or None)``; N ≤ max_seq_len.

    Keyword-only inputs of ``forward``:

    - ``cache`` (:meth:`new_cache`) and ``start_pos``: idx holds the tokens at
      cache positions ``[start_pos, start_pos + N)``; their keys and values
      join the cache and they attend to every cached key before them.
    - ``key_padding_mask`` (B, N) bool, True = pad (with a cache: (B,
      start_pos + N), every key in it): padding is absence — each row's real
      tokens get the logits of that row with its pads deleted, positions
      counted from its first real token (left, right or mixed padding). The
      ids at pads are ignored; their logits mean nothing (give them target
      −100, ``cross_entropy``'s ignore index).
    - ``cu_seqlens`` (S + 1,) int, 0 … total: packed training input, idx
      (1, total) holding S documents end to end; each document's positions
      restart at 0 and it attends only within itself, so its logits are those
      of the document alone. Mark each document's last target −100.
    """

    def __init__(self, config: LongNetConfig):
        super().__init__()
        self.config = c = config
        gamma = math.sqrt(math.log(2 * c.num_layers))  # MAGNETO's γ for an L-layer decoder
        self.tok_emb = nn.Embedding(c.vocab_size, c.embed_dim)
        self.pos_emb = nn.Embedding(c.max_seq_len, c.embed_dim)
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(c, gamma) for _ in range(c.num_layers))
        self.ln_out = nn.LayerNorm(c.embed_dim)

    def new_cache(self, batch: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> KVCache:
        """An empty :class:`KVCache` for this model (max_len default:
        max_seq_len). dtype default: that of the keys the model projects now —
        the parameters', or autocast's when called under ``torch.autocast``."""
        c, p = self.config, self.tok_emb.weight
        dtype = keys_dtype(self.blocks[0].attn.qkv_proj.weight.dtype, p.device) if dtype is None else dtype
        return KVCache(c.num_layers, batch, c.num_heads, max_len or c.max_seq_len, c.embed_dim // c.num_heads,
                       dtype=dtype, device=p.device)

    def forward(self, idx: Tensor, targets: Tensor | None = None, *, cache: KVCache | None = None,
                start_pos: int = 0, key_padding_mask: Tensor | None = None,
                cu_seqlens: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        self._check_inputs(idx, cache, start_pos, key_padding_mask, cu_seqlens)
        n = idx.shape[1]
        if key_padding_mask is not None:  # (B, start_pos + N): real tokens counted from each row's first
            pos = (~key_padding_mask).cumsum(1)[:, -n:] - 1 + (start_pos if cache is None else 0)  # (B, N)
            idx = idx.masked_fill(key_padding_mask[:, -n:], 0)
            pos = pos.clamp(min=0)  # pads before a row's first real token: any valid row of the table
        elif cu_seqlens is not None:  # each document counts from 0
            cu = cu_seqlens.long()
            t = torch.arange(n, device=idx.device)
            pos = t - cu[torch.searchsorted(cu[1:], t, right=True)]  # (N,): t − start of its document
        else:
            pos = torch.arange(start_pos, start_pos + n, device=idx.device)  # (N,)
        x = F.dropout(self.tok_emb(idx) + self.pos_emb(pos), self.config.dropout, self.training)  # (B, N, E)
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i, start_pos, key_padding_mask, cu_seqlens)
        logits = F.linear(self.ln_out(x), self.tok_emb.weight)  # tied head: (B, N, vocab)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def _check_inputs(self, idx, cache, start_pos, key_padding_mask, cu_seqlens) -> None:
        """forward's arguments, each error naming its argument, before any compute."""
        limit = self.config.max_seq_len
        check_token_ids(idx, "(B, N)")
        if idx.dim() != 2:
            raise ValueError(f"idx must be (B, N) token ids, got shape {tuple(idx.shape)}")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache (model.new_cache(batch)) or None, got {type(cache).__name__}")
        start_pos = check_int("start_pos", start_pos, minimum=0)
        width = start_pos + idx.shape[1]
        if key_padding_mask is not None and cu_seqlens is not None:
            raise ValueError("pass key_padding_mask (a padded batch) or cu_seqlens (packed documents), not both")
        if key_padding_mask is not None:
            keys = width if cache is not None else idx.shape[1]
            check_padding_mask("key_padding_mask", key_padding_mask, idx.shape[0], keys, idx.device)
            # Positions count real tokens only: the padded width may pass max_seq_len, a row may not
            # (a value check, a host sync: eager only).
            offset = 0 if cache is not None else start_pos
            eager = not tracing()
            if width > limit and eager and (~key_padding_mask).sum(1).max() + offset > limit:
                raise ValueError(f"a row of key_padding_mask holds more than max_seq_len={limit} real tokens; "
                                 "crop the input or build the model with a larger max_seq_len")
            return
        if cu_seqlens is not None:
            if cache is not None:
                raise ValueError("cu_seqlens and cache= do not go together: a KV cache holds one sequence per "
                                 "batch row; pass a padded batch with key_padding_mask instead")
            _check_cu_tensor("cu_seqlens", cu_seqlens, idx.device)
            if idx.shape[0] != 1:
                raise ValueError(f"packed input (cu_seqlens) takes idx of shape (1, total), got {tuple(idx.shape)}")
            if tracing():  # the values (a host sync): eager only
                return
            n = idx.shape[1]
            documents = packed_sequences(cu_seqlens, cu_seqlens, n, n, ("cu_seqlens",) * 2)
            longest = max((s.nk for s in documents), default=0)
            if longest > limit:
                raise ValueError(f"a document of cu_seqlens has {longest} tokens, more than max_seq_len={limit}; "
                                 "split it or build the model with a larger max_seq_len")
            return
        if width > limit:
            raise ValueError(f"sequence length {width} exceeds max_seq_len={limit}; "
                             "crop the input or build the model with a larger max_seq_len")

    @torch.no_grad()
    def generate(self, idx: Tensor | list[Tensor], max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None, *,
                 key_padding_mask: Tensor | None = None, use_cache: bool | None = None,
                 forward=None) -> Tensor | list[Tensor]:
        """Sample ``max_new_tokens`` continuations of the prompts idx (B, N0).

        Returns (B, N0 + max_new_tokens): each row's prompt as given, then its
        new tokens. ``max_new_tokens=0`` returns a copy of idx.

        Prompts of different lengths: pass idx left-padded with
        ``key_padding_mask`` (B, N0) bool, True = pad (any placement works:
        padding is absence), or a list of 1-D prompts, which returns a list of
        1-D tensors, each prompt followed by its new tokens. Every row is
        computed as if it were alone, so its greedy tokens are those of its
        prompt generated alone.

        temperature: finite, ≥ 0; 0 is greedy (argmax). top_k: None or ≥ 1;
        sample among the k most likely tokens (k ≥ vocab_size: all of them).
        ``use_cache``: run the prompt once into a :class:`KVCache` and then one
        token per step (each step's attention reads only the keys its query
        attends); default: when the longest prompt + new ≤ max_seq_len. Without
        the cache every step recomputes the whole context, cropped to each
        row's last max_seq_len tokens. ``forward`` replaces ``self`` for the
        model calls, e.g. ``torch.compile(model, fullgraph=True,
        dynamic=True)``: with the cache the step's only changing input is the
        int ``start_pos`` (and the mask's length), so the compiled step does
        not recompile per token."""
        if isinstance(idx, (list, tuple)):
            if key_padding_mask is not None:
                raise ValueError("a list of prompts is padded here: pass key_padding_mask=None")
            padded, mask = left_pad(idx)
            out = self.generate(padded, max_new_tokens, temperature, top_k, generator, key_padding_mask=mask,
                                use_cache=use_cache, forward=forward)
            return [row[out.shape[1] - len(p) - max_new_tokens :] for row, p in zip(out, idx)]
        longest = check_prompt(idx, key_padding_mask, self.config.vocab_size)
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0, maximum=INT64_MAX - idx.shape[1])
        temperature, top_k = check_sampling(temperature, top_k, generator)
        if forward is not None and not callable(forward):
            raise TypeError(f"forward must be callable (the model or a compiled model), got {type(forward).__name__}")
        total = longest + max_new_tokens
        if use_cache is None:
            use_cache = total <= self.config.max_seq_len
        elif check_bool("use_cache", use_cache) and total > self.config.max_seq_len:
            raise ValueError(f"use_cache=True needs prompt + new tokens ({total}) ≤ max_seq_len="
                             f"{self.config.max_seq_len} (positions are absolute); pass use_cache=False to crop "
                             "the context instead")
        forward = self if forward is None else forward
        cache = self.new_cache(idx.shape[0], idx.shape[1] + max_new_tokens) if use_cache else None
        mask, out = key_padding_mask, [idx]
        for i in range(max_new_tokens):
            if cache is None:  # the whole context again: each row's last max_seq_len tokens
                context, context_mask = crop_rows(torch.cat(out, 1), mask, self.config.max_seq_len)
                logits, _ = forward(context, **_padding(context_mask))
            else:  # the new tokens only: the prompt, then one token per step
                context_mask, start = mask, idx.shape[1] + i - out[-1].shape[1]
                logits, _ = forward(out[-1], cache=cache, start_pos=start, **_padding(mask))
            # A right-padded prompt ends in pads: its next token follows its last real token.
            last = logits[:, -1] if i or mask is None else logits[torch.arange(len(idx)), last_real(context_mask)]
            out.append(pick(last, temperature, top_k, generator))  # (B, 1)
            if mask is not None:
                mask = torch.cat([mask, mask.new_zeros(len(mask), 1)], 1)  # the new tokens are real
        return torch.cat(out, 1)
