"""The fused dilated kernels compile for sm_90 with no GPU, in a subprocess with
TRITON_INTERPRET unset, with ``scale`` typed fp32 (eager launch) and fp64 (as
torch.compile types a Python float)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_SCRIPT = """
from dilcompile.testing.gpu_compile import compile_kernel
for scale_type in ("fp32", "fp64"):
    for name in ("_fwd_kernel", "_dq_kernel", "_dkdv_kernel"):
        ptx = compile_kernel(name, "bf16", 64, 90, scale_type).asm["ptx"]
        # only the entry cast may touch fp64; the softmax state stays fp32
        n = ptx.count(".f64")
        assert n <= 2, (scale_type, name, n)
        print(scale_type, name, "ok", n)
"""


def test_kernels_compile_for_sm90_with_fp32_and_fp64_scale():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(" ok ") == 6, run.stdout
