"""The fused kernels issue their useful work and little more (docs/gpu.md,
"Issued work"): ``dilated/work.py`` counts it in closed form, Triton's
interpreter counts every ``tl.dot`` it runs (``testing/issued.py``), the two
agree exactly on randomized configurations, and on LongNet configurations the
issued work is ≤ 1.1 × the useful work in every kernel."""

import os
import random

import pytest
import torch

from dilcompile import dilated_attention
from dilcompile.dilated.api import HAS_TRITON
from dilcompile.dilated.geometry import multiplicity, nnz, plan_parts
from dilcompile.dilated import work
from dilcompile.dilated.work import MAX_WASTE, branch_tile, class_pairs, kernel_work, predict_ms, tile_shape
from dilcompile.testing import assert_within_low_precision_budget, masked_attention_plain, random_qkv

pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),  # interpreter
]
NAMES = {"fwd": "_fwd_kernel", "dq": "_dq_kernel", "dkdv": "_dkdv_kernel"}


def _random_config(rng):
    m = rng.randint(1, 3)
    segments = sorted(rng.randint(4, 160) for _ in range(m))
    rates = [rng.randint(1, 5) for _ in range(m)]
    return dict(n=rng.randint(1, 220), heads=rng.randint(1, 4), segments=segments, rates=rates,
                causal=rng.random() < 0.5, mode=rng.choice(["longnet", "groups"]),
                dtype=rng.choice([torch.float32, torch.bfloat16]), head_dim=rng.choice([16, 32]))


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed (pip install 'dilcompile[triton]')")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="counts dots in Triton's CPU interpreter")
@pytest.mark.parametrize("seed", range(6))
def test_interpreter_dot_count_equals_closed_form(seed):
    from dilcompile.testing.issued import count_dot_flops

    c = _random_config(random.Random(seed))
    q, k, v = random_qkv(1, c["heads"], c["n"], c["head_dim"], dtype=c["dtype"], requires_grad=True, seed=seed)
    kw = dict(segment_lengths=c["segments"], dilation_rates=c["rates"], causal=c["causal"], mode=c["mode"])
    with count_dot_flops() as counts:
        out = dilated_attention(q, k, v, impl="triton", **kw)
        out.backward(torch.randn_like(out))
    useful = nnz(plan_parts(c["heads"], c["segments"], c["rates"], c["mode"]), c["heads"], c["n"], c["causal"])
    for kernel, name in NAMES.items():
        work = kernel_work(kernel, 1, c["heads"], c["n"], c["head_dim"], c["segments"], c["rates"], c["mode"],
                           c["causal"], c["dtype"].itemsize)
        assert counts[name] == work.flops, (kernel, c)
        assert work.useful_pairs == useful, (kernel, c)
    # the count is of the kernels that computed the right answer
    ref = dilated_attention(*(t.detach().double() for t in (q, k, v)), impl="reference", **kw)
    if c["dtype"] == torch.float32:
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    else:
        parts = plan_parts(c["heads"], c["segments"], c["rates"], c["mode"])
        count = multiplicity(parts, c["heads"], c["n"], c["causal"])
        if c["mode"] == "groups":  # groups mode averages its m branches
            count = count.double() / len(c["segments"])
        plain = masked_attention_plain(q.detach(), k.detach(), v.detach(), count, c["head_dim"] ** -0.5)
        assert_within_low_precision_budget(out.detach(), plain, ref)


LONGNET = [  # (N, segments, rates): the shapes LongNet and the harvest use, rates up to 16
    (4096, (256, 512, 1024, 2048, 4096), (1, 2, 4, 8, 16)),
    (16384, (1024, 2048, 4096, 8192, 16384), (1, 2, 4, 8, 16)),
    (65536, (2048, 4096, 8192, 16384, 32768), (1, 2, 4, 8, 16)),
    (65536, (2048, 4096, 8192, 16384), (1, 2, 4, 8)),
    (1 << 20, (2048, 4096, 8192, 16384, 32768), (1, 2, 4, 8, 16)),
]


@pytest.mark.parametrize("n, segments, rates", LONGNET)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "groups"])
def test_longnet_configs_issue_at_most_1_1_times_useful(n, segments, rates, causal, mode):
    useful = nnz(plan_parts(16, segments, rates, mode), 16, n, causal)
    for head_dim, element_bytes in ((64, 2), (128, 2), (256, 2), (64, 4)):
        for kernel in NAMES:
            work = kernel_work(kernel, 1, 16, n, head_dim, segments, rates, mode, causal, element_bytes)
            assert work.waste <= MAX_WASTE, (kernel, head_dim, element_bytes, work.waste)
            assert work.useful_pairs == useful  # the closed form's useful pairs are the geometry's


def test_class_pairs_by_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        n, tile = rng.randint(1, 300), rng.choice([16, 32, 64, 128])
        inner, causal = rng.choice([t for t in (16, 32, 64) if t <= tile]), rng.random() < 0.5
        tiles = -(-n // tile)
        for owner in ("query", "key"):
            issued = 0
            for j in range(tiles):  # walk as the kernels do
                lo = j * tile if (causal and owner == "key") else 0
                hi = min(n, (j + 1) * tile) if (causal and owner == "query") else n
                issued += tile * len(range(lo, hi, inner)) * inner
            assert class_pairs(n, causal, tile, inner, owner) == issued
        assert class_pairs(n, causal) == sum(range(1, n + 1) if causal else [n] * n)


def test_a_shorter_walk_issues_no_more_pairs():
    # work.tile_shape: before Hopper the backward walks 32 rows where branch_tile's bound took the forward's 64
    rng = random.Random(1)
    for _ in range(300):
        n, tile, causal = rng.randint(1, 3000), rng.choice([64, 128]), rng.random() < 0.5
        for owner in ("query", "key"):
            assert class_pairs(n, causal, tile, 32, owner) <= class_pairs(n, causal, tile, 64, owner)
    assert tile_shape(128, 64, 2, "dkdv", 80) == (128, 32) and tile_shape(128, 64, 2, "dkdv", 90) == (128, 64)
    assert tile_shape(128, 64, 2, "fwd", 80) == (128, 64)


def test_tile_rule():
    assert branch_tile(2048, 1, 65536, 64, causal=True) == 128  # (2048 + 128) / 2049 ≤ 1.1
    assert branch_tile(2048, 1, 65536, 128, causal=True) == 128  # Hopper's forward: timed (docs/gpu.md)
    assert branch_tile(2048, 1, 65536, 64, causal=True, kernel="dkdv") == 64  # timed: 1.1x the 128-row tile
    assert branch_tile(2048, 1, 65536, 128, causal=True, arch=80) == 64  # register cap before Hopper
    assert branch_tile(256, 1, 4096, 64, causal=True) == 16  # a 32-tile would waste 12%
    assert branch_tile(256, 1, 4096, 64, causal=False) == 128  # no diagonal: whole tiles
    assert branch_tile(2048, 1, 65536, 64, causal=True, dtype_bytes=4) == 32  # fp32 cap
    assert branch_tile(1 << 30, 1, 128, 64, causal=False) == 128  # N < w: the class is ⌈N / r⌉, not w
    assert branch_tile(1 << 30, 1, 100, 64, causal=False) == 16  # no tile pads 100 rows within 10%: the smallest


def test_prediction_is_a_roofline():
    # forward, bf16, non-causal, one class of 2048 per row and branch: FLOP-bound at 989 TFLOP/s
    n, segments, rates = 65536, (2048, 4096, 8192, 16384, 32768), (1, 2, 4, 8, 16)
    fwd = predict_ms("fwd", 1, 16, n, 128, segments, rates)
    flops = kernel_work("fwd", 1, 16, n, 128, segments, rates).flops
    assert fwd == pytest.approx(flops / 989e12 * 1e3)
    assert predict_ms("fwd_bwd", 1, 16, n, 128, segments, rates) > 3 * fwd
    assert predict_ms("fwd", 1, 16, n, 128, segments, rates, dtype="float32") > 10 * fwd


@pytest.mark.parametrize("arch, dtype_bytes, head_dim, training, want", [
    (90, 2, 128, True, "triton"),   # measured: triton trains faster on the H100 at bf16, D = 128
    (90, 2, 128, False, "sdpa"),    # the forward alone: sdpa faster from 64K
    (90, 2, 64, True, "sdpa"),      # not measured: the default stays
    (90, 4, 128, True, "sdpa"),
    (80, 2, 128, True, "sdpa"),
])
def test_auto_takes_triton_only_where_it_was_measured_to_train_faster(arch, dtype_bytes, head_dim, training, want):
    assert work.auto_impl(arch, dtype_bytes, head_dim, training) == want
