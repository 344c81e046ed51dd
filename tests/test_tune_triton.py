"""scripts/tune_triton.py's candidates run the launcher's kernels as the launcher does: the ``add``
candidate (every launch adding into zeroed buffers) against the launcher's choice (the first branch
overwriting unset buffers) is the A/B of OVERWRITE, so both must give the launcher's result."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import tune_triton  # noqa: E402

from dilcompile.dilated.impl.triton import dilated_backward_triton, dilated_forward_triton  # noqa: E402


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N, DIM, HEADS = 192, 32, 2


@pytest.fixture
def tiny(monkeypatch):
    """tune_triton's inputs at N = 192 (D = 32, H = 2) for a two-branch LongNet configuration, segments
    (64, 128), rates (1, 2), in the dtype asked for."""
    monkeypatch.setattr(tune_triton, "SEGMENTS", [64, 128])
    monkeypatch.setattr(tune_triton, "RATES", [1, 2])
    return lambda dtype=torch.float32: tune_triton._inputs(N, DIM, HEADS, dtype, DEVICE)


@pytest.mark.parametrize("kernel", ["fwd", "dq", "dkdv"])
def test_the_add_candidate_and_the_launchers_choice_give_the_launchers_result(kernel, tiny):
    t, dim = tiny(), DIM
    scale = dim ** -0.5
    if kernel == "fwd":
        out, _ = dilated_forward_triton(t["q"], t["k"], t["v"], [64, 128], [1, 2], "longnet", False, scale)
        want = [out]
    else:
        out, _ = dilated_forward_triton(t["q"], t["k"], t["v"], [64, 128], [1, 2], "longnet", False, scale)
        dq, dk, dv = dilated_backward_triton(t["do"], None, t["q"], t["k"], t["v"], out, t["lse"], [64, 128],
                                             [1, 2], "longnet", False, scale)
        want = [dq] if kernel == "dq" else [dk, dv]
    overwrite = tune_triton._launcher(kernel, None, t, dim)()
    add = tune_triton._launcher(kernel, tune_triton.ADD, t, dim)()
    for a, b, w in zip(overwrite, add, want):
        assert torch.equal(a, b)  # 0 + x is x: the two differ only in time
        torch.testing.assert_close(a, w.float(), rtol=0, atol=0)
    assert tune_triton._label(tune_triton.ADD, kernel) == "launcher/add"
    assert (kernel, tune_triton.ADD) in {(k, c) for _, k, c in tune_triton._jobs([64])}


def test_the_half_and_cast_candidates_give_the_launchers_forward_with_and_without_half_out(tiny):
    # ``half`` (every branch merged straight into the inputs' dtype) against ``cast`` (the fp32 merge,
    # then the cast the launcher returns): each equals the launcher's forward with half_out on and off.
    # fp16: Triton's interpreter rounds it to nearest even, as the GPU does (its bf16 cast truncates).
    from dataclasses import replace

    from dilcompile.dilated.work import branch_tile, kernel_config

    t, n, dim = tiny(torch.float16), N, DIM

    def launcher(half):  # both branches' classes hold 64 positions: one tile, so one configuration serves both
        tile = branch_tile(64, 1, n, dim, False, torch.float16)
        assert tile == branch_tile(128, 2, n, dim, False, torch.float16)
        options = {"fwd": replace(kernel_config("fwd", torch.float16, dim, 90, tile), half_out=half)}
        return dilated_forward_triton(t["q"], t["k"], t["v"], [64, 128], [1, 2], "longnet", False, dim ** -0.5,
                                      kernel_options=options)[0]

    (half,), (cast,) = tune_triton._launcher("fwd", tune_triton.HALF, t, dim)(), \
        tune_triton._launcher("fwd", tune_triton.CAST, t, dim)()
    assert half.dtype == cast.dtype == torch.float16
    assert torch.equal(half, launcher(True)) and torch.equal(cast, launcher(False))
    assert not torch.equal(half, cast)  # two branches: one more rounding
    assert [tune_triton._label(c, "fwd") for c in (tune_triton.HALF, tune_triton.CAST)] == \
        ["launcher/half", "launcher/cast"]
    jobs = {(k, c) for _, k, c in tune_triton._jobs([64])}
    assert {("fwd", tune_triton.HALF), ("fwd", tune_triton.CAST)} <= jobs
    assert not {(k, c) for k, c in jobs if c in (tune_triton.HALF, tune_triton.CAST) and k != "fwd"}


@pytest.mark.parametrize("kernel", ["fwd", "dq", "dkdv"])
def test_the_tma_candidate_gives_the_launchers_result(kernel, tiny, monkeypatch):
    # ``tma``: the launcher's choice with the walked rows loaded through tensor descriptors (every launch
    # has TMA on); the same values reach the same arithmetic, so its result is the launcher's own,
    # bitwise in the interpreter.
    from dilcompile.dilated.impl import triton as impl

    t, flags, real = tiny(), [], impl.launch_flags
    monkeypatch.setattr(impl, "launch_flags", lambda *a, **kw: flags.append(real(*a, **kw)) or flags[-1])
    launcher = tune_triton._launcher(kernel, None, t, DIM)()
    assert flags and not any(f["TMA"] for f in flags)
    flags.clear()
    tma = tune_triton._launcher(kernel, tune_triton.TMA, t, DIM)()
    assert flags and all(f["TMA"] for f in flags)
    for a, b in zip(launcher, tma):
        if DEVICE == "cpu":
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b)
    assert tune_triton._label(tune_triton.TMA, kernel) == "launcher/tma"
    assert (kernel, tune_triton.TMA) in {(k, c) for _, k, c in tune_triton._jobs([64])}


def test_prewarm_leaves_out_the_candidates_a_process_did_not_finish(monkeypatch, capsys):
    # Process i compiles jobs i, i + J, …, printing "done <index>" after each; one that fails (a
    # compile error, or a launch that leaves the GPU context unusable) stops there. The timed run
    # then goes without the candidates it did not finish, named, but keeps the launcher's own choice.
    from argparse import Namespace

    jobs = tune_triton._jobs([64])
    launcher_jobs = {i for i, job in enumerate(jobs) if job[2] is None}
    failing = next(i for i, job in enumerate(jobs) if job[2] == tune_triton.TMA)

    class Process:
        def __init__(self, command, **kwargs):
            first, step = map(int, command[command.index("--compile-only") + 1].split("/"))
            mine = range(first, len(jobs), step)
            self.done = [i for i in mine if i < failing] if failing in mine else list(mine)
            self.returncode = 1 if failing in mine else 0

        def communicate(self):
            return "".join(f"done {i}\n" for i in self.done), None

    monkeypatch.setattr(tune_triton.subprocess, "Popen", Process)
    kept = tune_triton._prewarm(jobs, Namespace(prewarm=3, dims=[64], heads=2))
    lost = [i for i in range(failing, len(jobs), 3) if i not in launcher_jobs]
    assert kept == [job for i, job in enumerate(jobs) if i not in lost]
    assert all(jobs[i] in kept for i in launcher_jobs)
    left_out = [line for line in capsys.readouterr().err.splitlines() if "left out" in line]
    assert len(left_out) == len(lost) and "left out D=64 fwd launcher/tma" in left_out[0]
