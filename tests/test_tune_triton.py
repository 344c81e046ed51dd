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


@pytest.mark.parametrize("kernel", ["fwd", "dq", "dkdv"])
def test_the_add_candidate_and_the_launchers_choice_give_the_launchers_result(kernel, monkeypatch):
    monkeypatch.setattr(tune_triton, "SEGMENTS", [64, 128])
    monkeypatch.setattr(tune_triton, "RATES", [1, 2])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n, dim, heads = 192, 32, 2
    t = tune_triton._inputs(n, dim, heads, torch.float32, device)
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
