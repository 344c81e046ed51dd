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

# Under pytest-xdist (`make test` runs two workers) each worker gets its share of the cores, and
# so do the processes its tests start (OMP_NUM_THREADS): more threads than cores spin at every op
# instead of waiting. DILCOMPILE_TEST_THREADS overrides the share.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = int(os.environ.get("DILCOMPILE_TEST_THREADS", max(1, (os.cpu_count() or 1) // _WORKERS)))
torch.set_num_threads(max(1, min(torch.get_num_threads(), _THREADS)))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (NVML, NCCL, CUDA events); skipped on CPU")
    _check_loadgroup(config)


def _check_loadgroup(config):
    """``--dist loadgroup`` must group: the suite's xdist_group marks give one wheel build, one
    browser at a time and each fake-GPU process once. Under pytest 9.2 pytest-xdist 3.8 silently
    stops grouping (it writes a node id pytest no longer reads, pytest-xdist#1386) and every group
    ran once per worker; pyproject's test extra pins pytest < 9.2. Stop rather than run that way."""
    from importlib.metadata import version

    if config.getoption("dist", "no") != "loadgroup":
        return
    xdist = tuple(int(part) for part in version("pytest-xdist").split(".")[:2])
    if pytest.version_tuple[:2] >= (9, 2) and xdist <= (3, 8):
        raise pytest.UsageError(f"pytest {pytest.__version__} with pytest-xdist {version('pytest-xdist')}: "
                                "--dist loadgroup would not group (pytest-xdist#1386); pip install 'pytest<9.2'")


# The longest tests, longest first (--durations on the 2-core machine, Inductor cache cold): they
# start first, so that the pytest-xdist workers, which take the rest as they come free, finish
# together instead of one running a long test alone at the end. A stale entry costs only time.
LONG_FIRST = (
    "tests/test_gpu_compile.py",  # ahead-of-time cubin compiles
    "tests/test_bench_hf_serving.py",
    "tests/test_block_sparse.py::test_flex_serves_many_lengths_with_few_graphs",
    "tests/test_decode_cache.py::test_compiled_generate_fullgraph_recompiles_do_not_grow_with_tokens",
    "tests/test_fake_gpu.py",  # Inductor in subprocesses
    "tests/test_docs_snippets.py",  # each block in a fresh interpreter, most with an Inductor compile
    "tests/test_compiler_mask_pass.py",
    "tests/test_bench_",  # each benchmark script in a subprocess
)


def _long_rank(item) -> int:
    return next((i for i, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_long_rank)  # stable: the rest keeps its order
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


# Modules whose tests compile whole Hugging Face models.
WHOLE_MODEL_TESTS = ("test_hf", "test_cuda_training")


@pytest.fixture(autouse=True)
def _fresh_dynamo_per_model_test(request):
    """Dynamo's recompile limit (8) counts the graphs of one forward function across a process: nine
    Llama configurations compiled in one pytest-xdist worker make the ninth fullgraph compile fail,
    so a test's outcome depended on which tests shared its worker. Each test of a whole model starts
    from empty Dynamo caches."""
    if request.module.__name__.startswith(WHOLE_MODEL_TESTS):
        torch._dynamo.reset()
