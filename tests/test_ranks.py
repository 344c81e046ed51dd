"""The multi-process tests start their ranks so that a backward works in each
(``tests/ranks.py``), also after the parent ran one on a machine with a GPU —
reproduced here with the fake CUDA runtime of ``testing/fake_gpu.py``, whose
one device makes autograd start its device threads as a real GPU does."""

import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import ctypes, os, sys
ctypes.CDLL(os.environ["FAKE_CUDA_RUNTIME"], mode=ctypes.RTLD_GLOBAL)  # before torch (fake_gpu's doc)
import torch
from ranks import start_ranks


def worker(rank, directory):
    x = torch.randn(3, requires_grad=True)
    (x * 2).sum().backward()
    open(os.path.join(directory, str(rank)), "w").write(str(x.grad.tolist()))


if __name__ == "__main__":
    x = torch.randn(3, requires_grad=True)
    (x * 2).sum().backward()  # as a pytest worker has, long before a ring test
    start_ranks(worker, (sys.argv[1],), 2)
"""


def test_ranks_run_a_backward_after_the_parent_ran_one_with_a_gpu_present(tmp_path):
    from dilcompile.testing.fake_gpu import FakeGpuUnavailable, build_fake_cuda_runtime

    try:
        runtime = build_fake_cuda_runtime(str(tmp_path / "runtime"))
    except FakeGpuUnavailable as exc:
        pytest.skip(f"fake GPU harness: {exc}")
    script = tmp_path / "ranks_after_backward.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, FAKE_CUDA_RUNTIME=runtime, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / str(rank)).read_text() == "[2.0, 2.0, 2.0]"
