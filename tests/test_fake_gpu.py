"""torch.compile for an H100 with no GPU (``dilcompile/testing/fake_gpu.py``):
Inductor compiles our modules and kernels for device "cuda" down to sm_90
cubin. The cases are functions (``dilcompile/testing/fake_gpu_cases.py``),
run in two subprocesses (the stand-ins patch torch and triton globally; the
training cases need the fake CUDA runtime loaded before torch) with
TRITON_INTERPRET unset, each process once per session, when a test first
asks for one of its cases. What this torch or triton cannot do skips with
the reason."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")
from dilcompile.testing.fake_gpu_cases import CASES, RUN, TRAINING  # noqa: E402

# Each group's process runs inside the first test that asks for one of its cases: far above its quiet time.
# The cases of one process share an xdist worker (loadgroup), so each process runs once per session, not
# once per worker: the training tests add their own group, so the two processes may run side by side.
pytestmark = [pytest.mark.timeout(3600), pytest.mark.xdist_group("fake-gpu")]
TRAINING_PROCESS = pytest.mark.xdist_group("training")
if torch.version.cuda is not None:  # the stand-ins replace what a CPU-only build lacks; a CUDA build has it
    pytest.skip("the fake GPU harness is for CPU-only torch builds: on a CUDA build run the suite with "
                "DILCOMPILE_TEST_DEVICE=cuda", allow_module_level=True)

@pytest.fixture(scope="session")
def fake_cuda_runtime(tmp_path_factory):
    """The no-op CUDA device guard and hooks a backward needs (fake_gpu's module doc)."""
    from dilcompile.testing.fake_gpu import FakeGpuUnavailable, build_fake_cuda_runtime

    try:
        return build_fake_cuda_runtime(str(tmp_path_factory.mktemp("fake_cuda_runtime")))
    except FakeGpuUnavailable as exc:
        pytest.skip(f"fake GPU harness: {exc}")


@pytest.fixture(scope="session")
def fake_gpu_cases():
    """case → its result (``fake_gpu_cases``' JSON), each group's process run once."""
    results = {}

    def run(case: str, runtime: str | None) -> dict:
        if case not in results:
            group = TRAINING if case in TRAINING else tuple(name for name in CASES if name not in TRAINING)
            env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FAKE_CUDA_RUNTIME")}
            env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            if runtime:
                env["FAKE_CUDA_RUNTIME"] = runtime
            done = subprocess.run([sys.executable, "-c", RUN, *group], env=env, capture_output=True, text=True,
                                  timeout=3000)
            found = {r["case"]: r for r in map(json.loads, done.stdout.splitlines()) if "case" in r}
            ended = f"the process ended (exit {done.returncode}) before this case: {done.stderr[-4000:]}"
            results.update({name: found.get(name, {"case": name, "error": ended}) for name in group})
        return results[case]
    return run


def _compile(fake_gpu_cases, case: str, runtime: str | None = None, result_key: str = "kernels") -> list:
    result = fake_gpu_cases(case, runtime)
    if "unavailable" in result:
        pytest.skip(f"fake GPU harness: {result['unavailable']}")
    assert "error" not in result, result["error"]
    assert result["kernels"]
    assert all(cubin > 0 for _, cubin, _ in result["kernels"])
    return result[result_key]


def test_multihead_dilated_triton_compiles_for_sm90(fake_gpu_cases):
    names = [name for name, _, _ in _compile(fake_gpu_cases, "multihead-triton")]
    assert "_fwd_kernel" in names  # our kernel, through Inductor as a user-defined Triton kernel


def test_multihead_dilated_sdpa_compiles_for_sm90(fake_gpu_cases):
    assert _compile(fake_gpu_cases, "multihead-sdpa")  # Inductor's fused projections and layer norm


def test_longnet_on_the_sdpa_path_compiles_with_every_size_symbolic(fake_gpu_cases):
    # the benchmark's compile (dynamic=True): the head dim is a symbol, and testing its membership of
    # a range() failed in Dynamo (AsPythonConstantNotImplementedError) at every N on an H200
    assert _compile(fake_gpu_cases, "sdpa-longnet-dynamic")


def test_the_tma_candidate_compiles_through_inductor_for_sm90(fake_gpu_cases):
    # Tensor descriptors made in a user kernel: Inductor's analysis and codegen take them (it sets
    # triton's allocator for their scratch memory before its launches); every launch had TMA on, and
    # the five branches' kernels were built with TMA loads although the default table's graph of the
    # same call (triton-longnet, earlier in the process) sat in Inductor's caches (work.launch_key)
    result = fake_gpu_cases("triton-longnet-tma", None)
    names = [name for name, _, _ in _compile(fake_gpu_cases, "triton-longnet-tma")]
    assert names.count("_fwd_kernel") == 5 and result["tma"] == [True] and result["tma_loads"] == 5, result


def test_dilated_triton_backward_kernels_compile_for_sm90(fake_gpu_cases):
    names = {name for name, _, _ in _compile(fake_gpu_cases, "triton-backward")}
    assert {"_dq_kernel", "_dkdv_kernel"} <= names


def test_inductor_takes_only_the_accumulators_for_the_kernels_outputs(fake_gpu_cases):
    # It once took the head-class table for an output too (passed into a helper whose results address
    # the stores); its copies of the "mutated" row views then read past a buffer: compiled LongNet at
    # N = 65536 differed from eager by 0.2 on an H100 (docs/compiler.md, "User Triton kernels").
    written = _compile(fake_gpu_cases, "triton-outputs", result_key="written")
    # dk/dv writes DQ where it adds dq by atomic adds (ATOMIC_DQ)
    assert written == {"_fwd_kernel": ["LSE", "O"], "_dq_kernel": ["DQ"], "_dkdv_kernel": ["DK", "DQ", "DV"]}


@pytest.mark.parametrize("dynamic", [False, True])
def test_longnet_configuration_compiles_to_one_launch_per_branch(dynamic, fake_gpu_cases):
    # five branches, five launches, and nothing copied between them; dynamic=True traced a symbolic
    # head dim into the tile choice's cache (TypeError: unhashable type: non-nested SymInt)
    names = [name for name, _, _ in _compile(fake_gpu_cases, "triton-longnet" + ("-dynamic" if dynamic else ""))]
    assert names.count("_fwd_kernel") == 5, names
    assert not [name for name in names if "unbind" in name or "clone" in name], names


def test_packed_sequences_compile_to_one_launch_per_branch(fake_gpu_cases):
    # 32 packed documents: the segment tables are Inductor kernels (searchsorted, no host read), the
    # branches three launches, and nothing copied around them
    names = [name for name, _, _ in _compile(fake_gpu_cases, "triton-packed")]
    assert names.count("_fwd_kernel") == 3, names
    assert not [name for name in names if "unbind" in name or "clone" in name], names


@TRAINING_PROCESS
def test_packed_sequences_training_step_compiles_for_sm90(fake_cuda_runtime, fake_gpu_cases):
    names = [name for name, _, _ in _compile(fake_gpu_cases, "triton-packed-training", fake_cuda_runtime)]
    assert names.count("_dq_kernel") == 3 and names.count("_dkdv_kernel") == 3, names


@pytest.mark.parametrize("block", [64, 128])
def test_block_sparse_flex_compiles_for_sm90(block, fake_gpu_cases):
    # block 64 needed kernel_options: Inductor's default H100 tile (128 rows) must divide the block
    names = [name for name, _, _ in _compile(fake_gpu_cases, f"block-sparse-{block}")]
    assert any("flex_attention" in name for name in names), names


def test_block_sparse_flex_with_dynamic_lengths_compiles_for_sm90(fake_gpu_cases):
    # the graph eager impl="flex" compiles at a sequence's second length (block_sparse/impl/flex.py)
    names = [name for name, _, _ in _compile(fake_gpu_cases, "block-sparse-128-dynamic")]
    assert any("flex_attention" in name for name in names), names


def test_auto_serves_inference_with_the_sdpa_path_for_sm90(fake_gpu_cases):
    names = [name for name, _, _ in _compile(fake_gpu_cases, "auto-inference")]
    assert not [name for name in names if name in ("_fwd_kernel", "_dq_kernel", "_dkdv_kernel")], names


@TRAINING_PROCESS
def test_auto_trains_with_the_triton_kernels_for_sm90(fake_cuda_runtime, fake_gpu_cases):
    # measured faster for training on an H100 at bf16, D = 128 (dilated/work.py, TRITON_TRAINS_FASTER);
    # the device query folds to a constant: one graph, fullgraph
    names = {name for name, _, _ in _compile(fake_gpu_cases, "auto-training", fake_cuda_runtime)}
    assert {"_fwd_kernel", "_dq_kernel", "_dkdv_kernel"} <= names, names


def test_longnet_decoder_forward_and_loss_compile_for_sm90(fake_gpu_cases):
    assert len(_compile(fake_gpu_cases, "decoder")) >= 3


@TRAINING_PROCESS
def test_multihead_dilated_triton_training_step_compiles_for_sm90(fake_cuda_runtime, fake_gpu_cases):
    # the loss's forward and backward graphs: our three kernels as Inductor's user kernels
    names = {name for name, _, _ in _compile(fake_gpu_cases, "multihead-triton-training", fake_cuda_runtime)}
    assert {"_fwd_kernel", "_dq_kernel", "_dkdv_kernel"} <= names, names


@TRAINING_PROCESS
def test_longnet_decoder_training_step_compiles_for_sm90(fake_cuda_runtime, fake_gpu_cases):
    names = [name for name, _, _ in _compile(fake_gpu_cases, "decoder-training", fake_cuda_runtime)]
    assert any("embedding_dense_backward" in name for name in names), names  # the graph's far end
    assert any("layer_norm_backward" in name for name in names), names


@TRAINING_PROCESS
@pytest.mark.parametrize("attention", ["dilcompile_dilated", "dilcompile_block_sparse"])
def test_hugging_face_llama_padded_training_step_compiles_for_sm90(attention, fake_cuda_runtime, fake_gpu_cases):
    # a transformers Llama switched to our attention, a padding mask, loss and backward
    names = [name for name, _, _ in _compile(fake_gpu_cases, f"hf-{attention}-training", fake_cuda_runtime)]
    assert any("backward" in name for name in names), names
