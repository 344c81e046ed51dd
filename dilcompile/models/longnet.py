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

from ..kv_cache import KVCache
from ..multihead import MultiheadDilatedAttention


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
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio · E
    dropout: float = 0.0  # on the embeddings, attention and MLP outputs

    def __post_init__(self):
        for name in ("vocab_size", "max_seq_len", "embed_dim", "num_heads", "num_layers", "mlp_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
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


class Block(nn.Module):
    """Pre-LN decoder block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, c: LongNetConfig, gamma: float):
        super().__init__()
        self.ln_attn = nn.LayerNorm(c.embed_dim)
        self.attn = MultiheadDilatedAttention(c.embed_dim, c.num_heads, c.segment_lengths, c.dilation_rates,
                                              dropout=c.dropout, mode=c.mode, gamma_init=gamma)
        self.ln_mlp = nn.LayerNorm(c.embed_dim)
        self.fc_in = nn.Linear(c.embed_dim, c.mlp_ratio * c.embed_dim)
        self.fc_out = nn.Linear(c.mlp_ratio * c.embed_dim, c.embed_dim)
        self.dropout = c.dropout
        for fc in (self.fc_in, self.fc_out):  # MAGNETO: γ-scaled xavier on the MLP too
            nn.init.xavier_normal_(fc.weight, gain=gamma)
            nn.init.zeros_(fc.bias)

    def forward(self, x: Tensor, cache: KVCache | None = None, layer_idx: int = 0,
                start_pos: int = 0) -> Tensor:  # (B, N, E) → (B, N, E)
        x = x + self.attn(self.ln_attn(x), is_causal=True, cache=cache, layer_idx=layer_idx, start_pos=start_pos)[0]
        h = self.fc_out(F.gelu(self.fc_in(self.ln_mlp(x))))
        return x + F.dropout(h, self.dropout, self.training)


class LongNetDecoder(nn.Module):
    """Causal language model. ``forward(idx (B, N) int64, targets (B, N) or None)``
    returns ``(logits (B, N, vocab), loss or None)``; N ≤ max_seq_len.

    With ``cache=`` (:meth:`new_cache`) and ``start_pos``, idx holds the tokens
    at positions ``[start_pos, start_pos + N)``: their keys and values join the
    cache and they attend to every cached key before them."""

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

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """An empty :class:`KVCache` for this model (max_len default: max_seq_len)."""
        c, p = self.config, self.tok_emb.weight
        return KVCache(c.num_layers, batch, c.num_heads, max_len or c.max_seq_len, c.embed_dim // c.num_heads,
                       dtype=p.dtype, device=p.device)

    def forward(self, idx: Tensor, targets: Tensor | None = None, *, cache: KVCache | None = None,
                start_pos: int = 0) -> tuple[Tensor, Tensor | None]:
        n = idx.shape[1]
        if start_pos + n > self.config.max_seq_len:
            raise ValueError(f"sequence length {start_pos + n} exceeds max_seq_len={self.config.max_seq_len}; "
                             "crop the input or build the model with a larger max_seq_len")
        pos = torch.arange(start_pos, start_pos + n, device=idx.device)
        x = F.dropout(self.tok_emb(idx) + self.pos_emb(pos), self.config.dropout, self.training)  # (B, N, E)
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i, start_pos)
        logits = F.linear(self.ln_out(x), self.tok_emb.weight)  # tied head: (B, N, vocab)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, *, use_cache: bool | None = None,
                 forward=None) -> Tensor:
        """Sample ``max_new_tokens`` continuations of idx (B, N0); returns (B, N0 + new).

        temperature 0 is greedy (argmax). ``use_cache``: run the prompt once
        into a :class:`KVCache` and then one token per step (each step's
        attention reads only the keys its query attends); default: when
        N0 + new ≤ max_seq_len. Without the cache every step recomputes the
        whole context, cropped to the last max_seq_len tokens. ``forward``
        replaces ``self`` for the model calls, e.g.
        ``torch.compile(model, fullgraph=True, dynamic=True)``: with the cache
        the step's only changing input is the int ``start_pos``, so the
        compiled step does not recompile per token."""
        if temperature < 0:
            raise ValueError(f"temperature must be ≥ 0 (0 = greedy), got {temperature}")
        total = idx.shape[1] + max_new_tokens
        if use_cache is None:
            use_cache = total <= self.config.max_seq_len
        elif use_cache and total > self.config.max_seq_len:
            raise ValueError(f"use_cache=True needs prompt + new tokens ({total}) ≤ max_seq_len="
                             f"{self.config.max_seq_len} (positions are absolute); pass use_cache=False to crop "
                             "the context instead")
        forward = self if forward is None else forward
        cache = self.new_cache(idx.shape[0], total) if use_cache else None
        step = idx
        for _ in range(max_new_tokens):
            if cache is None:
                logits, _ = forward(idx[:, -self.config.max_seq_len :])
            else:
                logits, _ = forward(step, cache=cache, start_pos=idx.shape[1] - step.shape[1])
            nxt = self._pick(logits[:, -1], temperature, top_k, generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
            step = nxt
        return idx

    @staticmethod
    def _pick(logits: Tensor, temperature: float, top_k: int | None, generator) -> Tensor:
        """Next token (B, 1) from the last position's logits (B, vocab)."""
        if temperature == 0:
            return logits.argmax(-1, keepdim=True)
        logits = logits / temperature
        if top_k is not None:
            kth = logits.topk(min(top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.multinomial(logits.softmax(-1), 1, generator=generator)
