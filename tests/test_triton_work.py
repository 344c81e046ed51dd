"""The fused kernels issue their useful work and little more (docs/gpu.md,
"Issued work"): ``dilated/work.py`` counts it in closed form, Triton's
interpreter counts every ``tl.dot`` it runs (``testing/issued.py``), the two
agree exactly on randomized configurations, and on LongNet configurations the
issued work is ≤ 1.1 × the useful work in every kernel."""

import os
import random
from dataclasses import replace

import pytest
import torch

from dilcompile import dilated_attention
from dilcompile.dilated.api import HAS_TRITON
from dilcompile.dilated.geometry import multiplicity, nnz, plan_parts
from dilcompile.dilated import work
from dilcompile.dilated.work import (MAX_WASTE, KernelConfig, branch_tile, class_pairs, kernel_config, kernel_work,
                                     predict_ms)
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
                           c["causal"], c["dtype"])
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
    for head_dim, dtype in ((64, "bfloat16"), (128, "bfloat16"), (256, "bfloat16"), (64, "float32")):
        for kernel in NAMES:
            work = kernel_work(kernel, 1, 16, n, head_dim, segments, rates, mode, causal, dtype)
            assert work.waste <= MAX_WASTE, (kernel, head_dim, dtype, work.waste)
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
    # the fallback: before Hopper the backward walks 32 rows where branch_tile's bound took the forward's 64
    rng = random.Random(1)
    for _ in range(300):
        n, tile, causal = rng.randint(1, 3000), rng.choice([64, 128]), rng.random() < 0.5
        for owner in ("query", "key"):
            assert class_pairs(n, causal, tile, 32, owner) <= class_pairs(n, causal, tile, 64, owner)
    assert kernel_config("dkdv", "bfloat16", 64, 80, 128).walk == 32
    assert kernel_config("dkdv", "bfloat16", 64, 90, 128).walk == 64
    assert kernel_config("fwd", "bfloat16", 64, 80, 128).walk == 64


def test_tile_rule():
    assert branch_tile(2048, 1, 65536, 64, causal=True) == 128  # (2048 + 128) / 2049 ≤ 1.1
    assert branch_tile(2048, 1, 65536, 128, causal=True) == 128  # Hopper's forward: timed (docs/gpu.md)
    assert branch_tile(2048, 1, 65536, 64, causal=True, kernel="dkdv") == 64  # timed: 1.1x the 128-row tile
    assert branch_tile(2048, 1, 65536, 128, causal=True, arch=80) == 64  # register cap before Hopper
    assert branch_tile(256, 1, 4096, 64, causal=True) == 16  # a 32-tile would waste 12%
    assert branch_tile(256, 1, 4096, 64, causal=False) == 128  # no diagonal: whole tiles
    assert branch_tile(2048, 1, 65536, 64, causal=True, dtype="float32") == 32  # fp32 cap
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


def test_half_out_is_chosen_per_call_and_halves_the_forwards_output_traffic(monkeypatch):
    # The output's dtype is one per call: a branch's smaller tile keeps the entry's half_out. The
    # forward's compulsory bytes per row and branch: q, k, v read, O read and written, lse read and
    # written — O in fp32, or (half_out) in the inputs' dtype.
    n, heads, dim, segments, rates = 65536, 16, 128, (2048, 4096, 8192, 16384, 32768), (1, 2, 4, 8, 16)
    fp32_out = kernel_work("fwd", 1, heads, n, dim, segments, rates)
    entry = kernel_config("fwd", "bfloat16", dim, 90)
    monkeypatch.setitem(work.CONFIGS, (90, "fwd", "bfloat16", 128), replace(entry, half_out=True))
    assert kernel_config("fwd", "bfloat16", dim, 90, tile=32).half_out
    half = kernel_work("fwd", 1, heads, n, dim, segments, rates)
    rows = fp32_out.bytes / (3 * 2 * dim + 2 * 4 * dim + 2 * 4)
    assert rows == sum(heads * n // r for r in rates)  # every head's class in every branch: N / r rows
    assert half.bytes == rows * (3 * 2 * dim + 2 * 2 * dim + 2 * 4)
    assert (half.pairs, half.flops) == (fp32_out.pairs, fp32_out.flops)


def test_tma_holds_where_a_class_row_is_a_16_byte_multiple_on_hopper_and_later():
    # TMA needs the rows' start and stride in 16-byte multiples: D × element size; sm_90 and later.
    flags = dict(branch=0, covers=True, causal=False, has_keep=False, varlen=False, interpreting=False)
    config = KernelConfig(64, 64, 4, 2, tma=True)
    assert work.launch_flags("fwd", config, 64, "bfloat16", arch=90, **flags)["TMA"]
    assert work.launch_flags("dq", config, 4, "float32", arch=100, **flags)["TMA"]
    assert not work.launch_flags("fwd", config, 64, "bfloat16", arch=80, **flags)["TMA"]  # no TMA unit
    assert not work.launch_flags("fwd", config, 12, "bfloat16", arch=90, **flags)["TMA"]  # 24-byte rows
    assert not work.launch_flags("fwd", config, 64, "bfloat16", arch=90, aligned=False, **flags)["TMA"]
    assert not work.launch_flags("fwd", replace(config, tma=False), 64, "bfloat16", arch=90, **flags)["TMA"]
    assert work.launch_flags("dkdv", config, 64, "bfloat16", arch=90, **flags)["TMA"]
    entry = kernel_config("dq", "bfloat16", 128, 90)
    assert kernel_config("dq", "bfloat16", 128, 90, tile=32).tma == entry.tma  # chosen per call, like half_out


@pytest.mark.parametrize("arch, dtype_bytes, head_dim, training, want", [
    (90, 2, 128, True, "triton"),   # measured: triton trains faster on the H100 at bf16, D = 128
    (90, 2, 128, False, "sdpa"),    # the forward alone: sdpa faster from 64K
    (90, 2, 64, True, "sdpa"),      # not measured: the default stays
    (90, 4, 128, True, "sdpa"),
    (80, 2, 128, True, "sdpa"),
])
def test_auto_takes_triton_only_where_it_was_measured_to_train_faster(arch, dtype_bytes, head_dim, training, want):
    assert work.auto_impl(arch, dtype_bytes, head_dim, training) == want


# -- the configuration table -------------------------------------------------------------------------


def test_the_table_names_the_run_behind_every_entry_and_the_fallback_says_it_is_one():
    for (arch, kernel, dtype, lanes), config in work.CONFIGS.items():
        assert config.timed and config.source.startswith("runs/h100-80gb-tune/"), (arch, kernel, dtype, lanes)
        assert kernel_config(kernel, dtype, lanes, arch) is config
    hopper = kernel_config("dq", "bfloat16", 128, 90)
    assert (hopper.tile, hopper.walk, hopper.warps, hopper.stages) == (128, 64, 8, 3)
    assert kernel_config("fwd", "float16", 100, 90).source.endswith("(timed at bf16; fp16: the same MMA)")
    # an unknown GPU (a B200: sm_100) is not handed the H100's entries: it gets the fallback, saying so
    blackwell = kernel_config("dq", "bfloat16", 128, 100)
    assert not blackwell.timed and blackwell.source.startswith("fallback: nothing timed for sm_100 dq bfloat16")
    assert (blackwell.tile, blackwell.walk) == (64, 32)
    # an entry holds for its own tile: a smaller tile a branch picks gets the fallback's shape
    assert not kernel_config("dq", "bfloat16", 128, 90, tile=32).timed
    assert work.peaks_for("NVIDIA H100 80GB HBM3") is work.H100_SXM
    assert work.peaks_for("NVIDIA H200") is work.H200
    assert work.peaks_for("NVIDIA B200").name == "H100 SXM (assumed: no peaks for 'NVIDIA B200')"


def test_the_first_launch_overwrites_only_where_every_row_is_written():
    config = kernel_config("fwd", "float32", 32, 90)
    flags = dict(covers=True, causal=True, has_keep=True, varlen=False, interpreting=True)
    assert work.launch_flags("fwd", config, 32, "float32", branch=0, **flags)["OVERWRITE"]
    assert not work.launch_flags("fwd", config, 32, "float32", branch=1, **flags)["OVERWRITE"]
    assert not work.launch_flags("fwd", config, 32, "float32", branch=0, **(flags | dict(covers=False)))["OVERWRITE"]
    dkdv = kernel_config("dkdv", "float32", 32, 90)  # a key mask leaves removed keys' dk, dv unwritten: add to 0
    assert not work.launch_flags("dkdv", dkdv, 32, "float32", branch=0, **flags)["OVERWRITE"]
    assert work.launch_flags("dkdv", dkdv, 32, "float32", branch=0, **(flags | dict(has_keep=False)))["OVERWRITE"]
    on_gpu = work.launch_flags("dq", config, 32, "bfloat16", branch=0, **(flags | dict(interpreting=False)))
    assert (on_gpu["num_warps"], on_gpu["num_stages"], on_gpu["PREC"]) == (config.warps, config.stages, 0)


@pytest.mark.parametrize("bad, error, words", [
    (lambda: KernelConfig(48, 16, 4, 2), ValueError, "tile must be one of"),
    (lambda: KernelConfig(32, 64, 4, 2), ValueError, "walk must be one of"),
    (lambda: KernelConfig(32, 16, 3, 2), ValueError, "warps must be"),
    (lambda: KernelConfig(32, 16, 4, 0), ValueError, "stages must be"),
    (lambda: work.check_kernel_options({"bwd": KernelConfig(32, 16, 4, 2)}), ValueError, "keys must be among"),
    (lambda: work.check_kernel_options({"fwd": (32, 16, 4, 2)}), TypeError, "must be a work.KernelConfig"),
    (lambda: work.check_kernel_options({"fwd": KernelConfig(32, 16, 4, 2, atomic_dq=True)}), ValueError,
     "atomic_dq is the dkdv kernel's"),
    (lambda: work.check_kernel_options({"dkdv": KernelConfig(32, 16, 4, 2, full_blocks=True)}), ValueError,
     "full_blocks the fwd and dq kernels'"),
    (lambda: work.check_kernel_options({"dq": KernelConfig(32, 16, 4, 2, half_out=True)}), ValueError,
     "half_out the fwd kernel's"),
    (lambda: kernel_config("fwd", "float64", 32), ValueError, "serve bfloat16, float16 and float32"),
])
def test_bad_kernel_configurations_are_one_line_errors(bad, error, words):
    with pytest.raises(error, match=words):
        bad()


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed (pip install 'dilcompile[triton]')")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the made-up GPU runs in the interpreter")
def test_a_new_gpu_is_one_table_entry(monkeypatch):
    # A made-up sm_120 with its own timed configuration: one entry per kernel, nothing else changed;
    # the launcher then launches with it (interpreter), exactly.
    from dilcompile.dilated.impl import triton as launcher

    made_up = {kernel: KernelConfig(16, 16, 4, 2, source="runs/made-up-sm120-tune/triton_tiles.parquet")
               for kernel in NAMES}
    for kernel, config in made_up.items():
        monkeypatch.setitem(work.CONFIGS, (120, kernel, "float32", 16), config)
    monkeypatch.setattr(launcher, "_arch", lambda q: 120)
    work._largest_tile.cache_clear()  # the tile choice caches the table's caps
    try:
        assert branch_tile(2048, 1, 65536, 16, False, "float32", arch=120) == 16
        assert kernel_config("dkdv", "float32", 16, 120) is made_up["dkdv"]
        used = []
        real = launcher.launch_flags
        monkeypatch.setattr(launcher, "launch_flags", lambda kernel, config, *a, **kw: used.append(config) or real(
            kernel, config, *a, **kw))
        q, k, v = random_qkv(1, 2, 40, 16, dtype=torch.float32, requires_grad=True, seed=3)
        kw = dict(segment_lengths=(16, 40), dilation_rates=(1, 2), causal=True)
        out = dilated_attention(q, k, v, impl="triton", **kw)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        want = dilated_attention(q64, k64, v64, impl="reference", **kw)
        wants = torch.autograd.grad(want.square().sum(), (q64, k64, v64))
    finally:
        work._largest_tile.cache_clear()
    assert used and all(config in made_up.values() for config in used)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    for g, w in zip(grads, wants):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_the_launch_key_follows_the_table_and_a_compiled_call_holds_it(device, monkeypatch):
    # AOTAutograd's cache keys the graph Dynamo traced, where a Triton op is one node: the launch key among
    # its arguments is what tells a graph compiled under another table apart (docs/compiler.md, "Cache
    # key"; tests/test_fake_gpu.py compiles one through Inductor). Digests, not Python's salted hash:
    # another process computes the same key.
    import subprocess
    import sys

    key = work.launch_key()
    other = [subprocess.run([sys.executable, "-c", "from dilcompile.dilated.work import launch_key; "
                             "print(launch_key())"], env=dict(os.environ, PYTHONHASHSEED=seed), capture_output=True,
                            text=True, check=True).stdout.strip() for seed in ("1", "2")]
    assert other == [key, key]
    entry = (90, "fwd", "bfloat16", 128)
    monkeypatch.setitem(work.CONFIGS, entry, replace(work.CONFIGS[entry], tma=True))
    tuned = work.launch_key()
    assert tuned != key and work.launch_key() == tuned
    calls = []

    def backend(gm, inputs):
        calls.extend(node.args for node in gm.graph.nodes if "dilated_triton_fwd" in str(node.target))
        return gm.forward

    q, k, v = random_qkv(1, 2, 48, 8, dtype=torch.float32, device=device, seed=4)
    torch._dynamo.reset()
    try:
        torch.compile(lambda q, k, v: dilated_attention(q, k, v, segment_lengths=(16, 48), dilation_rates=(1, 2),
                                                        impl="triton"), backend=backend, fullgraph=True)(q, k, v)
    finally:
        torch._dynamo.reset()
    assert len(calls) == 1 and calls[0][-1] == tuned
