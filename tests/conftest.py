import os

import pytest
import torch

# The device the exactness and contract tests run on: DILCOMPILE_TEST_DEVICE=cpu
# (default) or cuda (docs/gpu.md). CUDA asked for on a machine without one is an
# error, not a silent CPU run.
TEST_DEVICE = os.environ.get("DILCOMPILE_TEST_DEVICE", "cpu")
if TEST_DEVICE not in ("cpu", "cuda"):
    raise pytest.UsageError(f"DILCOMPILE_TEST_DEVICE must be 'cpu' or 'cuda', got {TEST_DEVICE!r}")
if TEST_DEVICE == "cuda" and not torch.cuda.is_available():
    raise pytest.UsageError("DILCOMPILE_TEST_DEVICE=cuda but torch sees no CUDA device "
                            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); unset it to test on CPU")

# Triton picks its CPU interpreter when it decorates kernels (at first import,
# which importing torch does not do): without a GPU, impl="triton" runs interpreted.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Two cores: keep intra-op threads from oversubscribing when pytest-xdist is used.
torch.set_num_threads(max(1, min(torch.get_num_threads(), int(os.environ.get("DILCOMPILE_TEST_THREADS", "2")))))


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (NVML, NCCL, CUDA events); skipped on CPU")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: run with DILCOMPILE_TEST_DEVICE=cuda on a GPU machine")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where the tensors of the exactness and contract tests live."""
    return torch.device(TEST_DEVICE)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
