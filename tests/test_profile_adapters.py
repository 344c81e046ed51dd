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


def fake_block_sparse(q, k, v, pattern, causal=False, impl="auto"):
    n = q.shape[2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    mask = pattern.mask_mod(0, 0, i, j) & ((j <= i) if causal else True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.fixture
def merged(monkeypatch):
    # where the profiler's variants import them from
    monkeypatch.setattr(dilcompile.multihead, "MultiheadDilatedAttention", FakeMHA, raising=False)
    monkeypatch.setattr(dilcompile.block_sparse, "block_sparse_attention", fake_block_sparse, raising=False)
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


def test_real_block_sparse_and_multihead_sweep_writes_ok_rows_with_exact_useful_flops(tmp_path):
    """The real dilcompile.patterns / MultiheadDilatedAttention, through a sweep into DuckDB."""
    from dilcompile import store
    from dilcompile.patterns import from_spec
    from dilcompile.profile.runner import run_sweep
    from dilcompile.profile.sweep import from_dict

    spec = "local_window(window=16)"
    defaults = dict(batch=2, heads=2, head_dim=8, dtype="float32", causal=True, device="cpu", segments=[16, 32],
                    rates=[1, 2])
    doc = {"warmup": 0, "repeats": 2, "max_time_s": 0.01, "defaults": defaults,
           "grid": [{"variant": ["multihead", f"block-sparse:{spec}"], "seq_len": [70], "pass": ["fwd", "fwd_bwd"]}]}
    db = tmp_path / "runs.duckdb"
    rows = run_sweep(from_dict(doc, "cpu"), str(db), progress=False)
    assert [r["status"] for r in rows] == ["ok"] * 4, [r.get("error") for r in rows]
    names, got = store.query(db, 'SELECT variant, "pass", useful_flops, impl FROM runs')
    flops = {(v, p): (f, impl) for v, p, f, impl in got}
    i, j = torch.arange(70)[:, None], torch.arange(70)[None, :]
    band = 2 * (((i - j).abs() <= 16) & (j <= i)).sum().item()  # 2 heads, causal window
    assert from_spec(spec).nnz(2, 70, True) == band
    dil = nnz(plan_parts(2, (16, 32), (1, 2)), 2, 70, True)
    for pass_, factor in (("fwd", 1.0), ("fwd_bwd", 3.5)):
        assert flops[(f"block-sparse:{spec}", pass_)] == (4 * 2 * 8 * band * factor, "gather")
        assert flops[("multihead", pass_)][0] == 4 * 2 * 8 * dil * factor
    with pytest.raises(ValueError, match="data-dependent"):
        variants.pattern_nnz(from_spec("adaptive(head_dim=8)"), 2, 70, False)
