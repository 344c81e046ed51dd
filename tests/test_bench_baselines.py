"""scripts/bench_baselines.py and its flash-attn shim (scripts/baselines_shims.py).

The shim is checked against a float64 reference (out, lse, input gradients);
the script runs --quick for our impls alone and refuses bad checkout paths in
one line. Where a torchscale checkout is given (DILCOMPILE_TORCHSCALE=PATH,
with einops installed) torchscale's LongNet is compared with ours, and where a
seed checkout is given (DILCOMPILE_SEED=PATH) the seed's DilatedAttention with
mode="groups"; CI has neither."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import baselines_shims as shims  # noqa: E402

from dilcompile import dilated_attention  # noqa: E402

SCRIPT = ROOT / "scripts" / "bench_baselines.py"
TORCHSCALE = os.environ.get("DILCOMPILE_TORCHSCALE")
SEED = os.environ.get("DILCOMPILE_SEED")
needs_torchscale = pytest.mark.skipif(not TORCHSCALE, reason="set DILCOMPILE_TORCHSCALE to a torchscale checkout "
                                      "(git clone https://github.com/microsoft/torchscale) to compare with it")
needs_seed = pytest.mark.skipif(not SEED, reason="set DILCOMPILE_SEED to a dilated-attention-pytorch checkout "
                                "to compare with the seed library")

# (b, lq, lk, h, d, causal): lengths that are multiples of nothing, one query, lq ≠ lk (not causal).
SHAPES = [(1, 1, 1, 1, 8, False), (2, 97, 97, 3, 16, True), (1, 130, 61, 2, 64, False), (2, 257, 257, 4, 24, True),
          (1, 33, 1000, 2, 32, False)]


def _reference(q, k, v, scale, causal):
    """float64 out (b, lq, h, d) by SDPA and lse (b, h, lq) by an explicit logsumexp."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    scores = q @ k.transpose(-1, -2) * scale
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return out.transpose(1, 2), scores.logsumexp(-1)


def _check_shim(device, dtype, tol_out, tol_grad):
    gen = torch.Generator(device).manual_seed(0)
    for i, (b, lq, lk, h, d, causal) in enumerate(SHAPES):
        q = torch.randn(b, lq, h, d, generator=gen, device=device, dtype=torch.float64)
        k, v = (torch.randn(b, lk, h, d, generator=gen, device=device, dtype=torch.float64) for _ in range(2))
        go = torch.randn(b, lq, h, d, generator=gen, device=device, dtype=torch.float64)
        scale = None if i % 2 else 0.3
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out, lse, probs = shims.flash_attn_func(*leaves, softmax_scale=scale, causal=causal, return_attn_probs=True)
        assert out.shape == (b, lq, h, d) and lse.shape == (b, h, lq) and probs is None
        grads = torch.autograd.grad(out, leaves, go.to(dtype))

        ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref_out, ref_lse = _reference(*ref_leaves, 1 / math.sqrt(d) if scale is None else scale, causal)
        ref_grads = torch.autograd.grad(ref_out, ref_leaves, go)
        assert (out.double() - ref_out).abs().max() <= tol_out, (i, "out")
        assert (lse.double() - ref_lse).abs().max() <= tol_out, (i, "lse")
        for g, r in zip(grads, ref_grads):
            assert (g.double() - r).abs().max() <= tol_grad * max(1.0, r.abs().max().item()), (i, "grad")
        assert torch.equal(shims.flash_attn_func(*leaves, softmax_scale=scale, causal=causal), out)


@pytest.mark.parametrize("dtype, tol_out, tol_grad", [(torch.float64, 1e-12, 1e-11), (torch.float32, 1e-5, 1e-4)])
def test_shim_matches_float64_reference_on_cpu(dtype, tol_out, tol_grad):
    _check_shim(torch.device("cpu"), dtype, tol_out, tol_grad)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype, tol_out, tol_grad", [(torch.bfloat16, 3e-2, 6e-2), (torch.float32, 2e-5, 2e-4)])
def test_shim_matches_float64_reference_on_cuda(dtype, tol_out, tol_grad):
    _check_shim(torch.device("cuda"), dtype, tol_out, tol_grad)


def test_shim_refuses_what_it_does_not_serve():
    q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 6, 2, 8)
    with pytest.raises(ValueError, match="causal with lq = 4 != lk = 6"):
        shims.flash_attn_func(q, k, k, causal=True)
    with pytest.raises(ValueError, match="window_size"):
        shims.flash_attn_func(q, q, q, window_size=(8, 0))


def test_shimmed_import_restores_sys_modules():
    before = {name: sys.modules.get(name) for name in ("flash_attn", "flash_attn.flash_attn_interface")}
    with shims.flash_attn_shimmed():
        from flash_attn.flash_attn_interface import flash_attn_func

        assert flash_attn_func is shims.flash_attn_func
    assert {name: sys.modules.get(name) for name in before} == before


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_quick_without_baselines_times_ours_and_writes_rows(tmp_path):
    pytest.importorskip("duckdb")
    from dilcompile import store

    db = tmp_path / "runs.duckdb"
    proc = _run("--quick", "--device", "cpu", "--rounds", "1", "--db", str(db))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["bench"] == "baselines" and summary["agreement"] == {}
    assert {(r["impl"], r["pass"], r["N"]) for r in summary["rows"]} == {
        ("sdpa", p, n) for p in ("fwd", "fwd_bwd") for n in (256, 512)}
    _, rows = store.query(db, "SELECT variant, impl, mode, \"pass\", seq_len, status, latency_ms, sweep_name FROM runs "
                              "ORDER BY \"pass\", seq_len")
    assert [r[:6] for r in rows] == [("dilated", "sdpa", "longnet", p, n, "ok") for p in ("fwd", "fwd_bwd")
                                     for n in (256, 512)]
    assert all(r[6] > 0 and r[7] == "bench_baselines" for r in rows)


@pytest.mark.parametrize("flag, marker", [("--torchscale", "torchscale/component/dilated_attention.py"),
                                          ("--seed", "dilated_attention_pytorch/dilated_attention.py")])
def test_a_bad_checkout_path_fails_in_one_line(tmp_path, capsys, flag, marker):
    import bench_baselines

    db = tmp_path / "runs.duckdb"
    proc = _run(flag, str(tmp_path / "missing"), "--db", str(db), timeout=120)  # the whole script: no traceback
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"bench_baselines: error: {flag} '{tmp_path / 'missing'}' is not a folder; "
                                        "pass the root of a clone of " + ("https://github.com/microsoft/torchscale"
                                        if flag == "--torchscale" else
                                        "https://github.com/DarcStar-Solutions-Tech/dilated-attention-pytorch")]
    assert bench_baselines.main([flag, str(tmp_path), "--db", str(db)]) == 2  # a folder without the module
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"bench_baselines: error: {flag} '{tmp_path}' has no {marker}; pass the root of a clone")
    assert not db.exists()


def test_torchscale_without_einops_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    import bench_baselines

    (tmp_path / shims.TORCHSCALE_FILE).parent.mkdir(parents=True)
    (tmp_path / shims.TORCHSCALE_FILE).touch()
    monkeypatch.setitem(sys.modules, "einops", None)  # importlib finds no einops
    assert bench_baselines.main(["--torchscale", str(tmp_path), "--db", str(tmp_path / "runs.duckdb")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "bench_baselines: error: --torchscale needs einops: pip install einops"


# ---- against the user's checkouts (skipped without them) ----

def _bnhd(x):
    return x.transpose(1, 2)


def _torchscale_out(module, x, heads, segments, rates, causal):
    """torchscale's LongNet on x = (q, k, v), each (B, N, H, D) → out (B, N, H, D)."""
    m = shims.torchscale_attention(module, heads, x[0].shape[-1], segments, rates)
    return m(*(t.flatten(2) for t in x), is_causal=causal)[0].unflatten(2, x[0].shape[2:])


# (heads, segments, rates, N, causal): LongNet's shape scaled down, H not a multiple of r, rows no
# rate-1 branch covers, N multiple of nothing (causal: padding after the last row is never attended).
LONGNET_CASES = [(16, (8, 16, 32, 64, 128), (1, 2, 4, 8, 16), 256, True),
                 (16, (8, 16, 32, 64, 128), (1, 2, 4, 8, 16), 256, False),
                 (6, (16, 32, 64), (1, 4, 4), 128, False), (6, (16, 32, 64), (2, 4, 4), 128, True),
                 (5, (16, 32, 64), (1, 2, 4), 100, True), (8, (16, 32, 64), (1, 2, 4), 40, True)]


@needs_torchscale
@pytest.mark.parametrize("heads, segments, rates, n, causal", LONGNET_CASES)
def test_torchscale_longnet_equals_ours_in_float64(heads, segments, rates, n, causal):
    pytest.importorskip("einops")
    import bench_baselines

    module = shims.load_torchscale(TORCHSCALE)
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(2, n, heads, 16, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    out = _torchscale_out(module, x, heads, segments, rates, causal)
    kw = dict(segment_lengths=segments, dilation_rates=rates, causal=causal, mode="longnet")
    ref = _bnhd(dilated_attention(*(_bnhd(t) for t in x), impl="reference", **kw))
    sdpa = _bnhd(dilated_attention(*(_bnhd(t) for t in x), impl="sdpa", **kw))
    assert (out - ref).abs().max() < 1e-13 and (out - sdpa).abs().max() < 1e-13
    # Its gradients are those of the same forward with the merge weights held constant (computed under
    # no_grad): dv is exact, dq and dk lack the term through the weights.
    go = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    cfg = dict(segments=segments, rates=rates)
    detached = _bnhd(bench_baselines._branchwise_detached(*(_bnhd(t) for t in x), cfg, causal, impl="sdpa"))
    grads, exact = torch.autograd.grad(out, x, go), torch.autograd.grad(ref, x, go)
    assert all((g - d).abs().max() < 1e-12 for g, d in zip(grads, torch.autograd.grad(detached, x, go)))
    assert (grads[2] - exact[2]).abs().max() < 1e-12
    assert (grads[0] - exact[0]).abs().max() > 1e-3 and (grads[1] - exact[1]).abs().max() > 1e-3


@needs_torchscale
def test_torchscale_attends_zero_padding_in_a_short_last_segment_when_not_causal():
    # N = 100, segments 16/32/64: torchscale pads the sequence to a multiple of each segment with zero keys and
    # values, which a non-causal row of the last, short segment attends (score 0): those rows differ from ours,
    # every other row agrees.
    pytest.importorskip("einops")
    module = shims.load_torchscale(TORCHSCALE)
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(1, 100, 8, 16, generator=gen, dtype=torch.float64) for _ in range(3)]
    out = _torchscale_out(module, x, 8, (16, 32, 64), (1, 2, 4), False)
    ref = _bnhd(dilated_attention(*(_bnhd(t) for t in x), segment_lengths=(16, 32, 64), dilation_rates=(1, 2, 4),
                                  impl="reference"))
    per_row = (out - ref).abs().amax(dim=(0, 2, 3))
    assert per_row[:64].max() < 1e-13 and (per_row[64:] > 1e-3).all()  # 64..99: the 64-segment's short tail


@needs_torchscale
def test_script_checks_agreement_with_torchscale(tmp_path):
    pytest.importorskip("einops")
    pytest.importorskip("duckdb")
    args = ["--quick", "--device", "cpu", "--seq-lens", "256", "--passes", "fwd", "--rounds", "1",
            "--torchscale", TORCHSCALE, "--db", str(tmp_path / "runs.duckdb")] + (["--seed", SEED] if SEED else [])
    proc = _run(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    a = summary["agreement"]["torchscale"]
    assert a["agrees"] and a["dtype"] == "float64" and a["max_abs_vs_reference"] < 1e-13
    assert a["grad_max_abs_vs_detached_weights"] < 1e-12
    if SEED:
        assert summary["agreement"]["seed"]["agrees"] and summary["agreement"]["seed"]["grad_rel_vs_reference"] < 1e-12
    assert {r["impl"] for r in summary["rows"]} == {"torchscale", "sdpa"} | ({"seed"} if SEED else set())


@needs_seed
@pytest.mark.parametrize("heads, segments, rates, causal", [(8, (16, 32, 64), (1, 2, 4), True),
                                                            (7, (32, 64), (2, 4), False)])
def test_seed_equals_ours_groups_mode_in_float64(heads, segments, rates, causal):
    module = shims.load_seed(SEED)
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(2, 128, heads, 16, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    out = module.DilatedAttention(list(segments), list(rates))(*x, is_causal=causal)
    ref = _bnhd(dilated_attention(*(_bnhd(t) for t in x), segment_lengths=segments, dilation_rates=rates,
                                  causal=causal, mode="groups", impl="reference"))
    assert (out - ref).abs().max() < 1e-13
    go = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    for g, r in zip(torch.autograd.grad(out, x, go), torch.autograd.grad(ref, x, go)):
        assert (g - r).abs().max() < 1e-12


@pytest.mark.parametrize("flag, value", [("--seq-lens", "-5"), ("--seq-lens", "0"), ("--rounds", "0"),
                                         ("--warmup", "-1"), ("--seq-lens", "1e3")])
def test_a_bad_shared_flag_is_one_line_before_the_store_opens(tmp_path, flag, value):
    db = tmp_path / "runs.duckdb"
    proc = _run(flag, value, "--device", "cpu", "--db", str(db), timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"bench_baselines: error: argument {flag}: '{value}' is not a whole number")
    assert not db.exists()  # nothing opened, nothing stored
