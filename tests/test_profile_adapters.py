"""The multihead and block-sparse adapters of the variant registry, driven by
stand-ins with the agreed signatures (the real modules live in other
packages; these tests don't depend on them)."""

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dilcompile
from dilcompile.dilated import dilated_attention
from dilcompile.dilated.geometry import nnz, plan_parts
from dilcompile.profile import Point, Profiler, variants


class FakeMHA(nn.Module):
    """MultiheadDilatedAttention(embed_dim, num_heads, segment_lengths, dilation_rates); batch-first (B, N, E)."""

    def __init__(self, embed_dim, num_heads, segment_lengths, dilation_rates):
        super().__init__()
        self.h, self.seg, self.rates = num_heads, tuple(segment_lengths), tuple(dilation_rates)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key, value, is_causal=False):
        b, n, e = query.shape
        q = self.proj(query).view(b, n, self.h, e // self.h).transpose(1, 2)  # (B, H, N, D)
        out = dilated_attention(q, q, q, segment_lengths=self.seg, dilation_rates=self.rates, causal=is_causal)
        return out.transpose(1, 2).reshape(b, n, e), None


class Band:
    def __init__(self, width):
        self.width = width

    def mask_mod(self, b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= self.width


def fake_block_sparse(q, k, v, pattern, causal=False):
    n = q.shape[2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    mask = pattern.mask_mod(0, 0, i, j) & ((j <= i) if causal else True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.fixture
def merged(monkeypatch):
    monkeypatch.setattr(dilcompile, "MultiheadDilatedAttention", FakeMHA, raising=False)
    monkeypatch.setattr(dilcompile, "block_sparse_attention", fake_block_sparse, raising=False)
    patterns = types.ModuleType("dilcompile.patterns")
    patterns.from_spec = lambda spec: Band(int(spec.removeprefix("band(").removesuffix(")")))
    monkeypatch.setitem(sys.modules, "dilcompile.patterns", patterns)
    variants._mha_module.cache_clear()
    yield
    variants._mha_module.cache_clear()


@pytest.mark.parametrize("pass_", ["fwd", "fwd_bwd"])
def test_multihead_adapter_runs_and_counts_attention_flops(merged, pass_):
    point = Point("multihead", 50, batch=2, heads=4, head_dim=8, causal=True, pass_=pass_, segments=(16, 32),
                  rates=(1, 2))
    row, _ = Profiler(warmup=0, repeats=2, max_time_s=0.01).measure(point)
    expected = 4 * 2 * 8 * nnz(plan_parts(4, (16, 32), (1, 2)), 4, 50, True) * (3.5 if pass_ == "fwd_bwd" else 1)
    assert row["useful_flops"] == expected and row["latency_ms"] > 0


def test_block_sparse_adapter_runs_and_counts_pattern_flops(merged):
    point = Point("block-sparse:band(3)", 40, heads=2, head_dim=8, causal=True, pass_="fwd_bwd")
    built = variants.build(point)
    i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
    pairs = (((i - j).abs() <= 3) & (j <= i)).sum().item()
    assert built.fwd_flops == 4 * 8 * 2 * pairs
    assert built.config == {"pattern": "band(3)"}
    row, _ = Profiler(warmup=0, repeats=2, max_time_s=0.01).measure(point)
    assert row["latency_ms"] > 0
