"""The fake-H100 compile cases of tests/test_fake_gpu.py, as functions, run
several to a process (``fake_gpu.py`` says why a process of their own at all:
the stand-ins patch torch and triton globally, and a backward needs the fake
CUDA runtime loaded before torch).

    python -c "$(python -c 'from dilcompile.testing.fake_gpu_cases import RUN; print(RUN)')" CASE [CASE ...]

(``RUN``: load the fake CUDA runtime named by ``FAKE_CUDA_RUNTIME``, if set,
before torch, then ``main``) runs the named cases one after another in one
process, sharing its Inductor state and cache, and prints one JSON line per case: ``{"case": name,
"kernels": [[kernel, cubin bytes, shared bytes], ...]}`` (plus what the case
adds), ``{"case": name, "unavailable": why}`` where this torch or triton
lacks a piece, or ``{"case": name, "error": traceback}``. Cases that train
(``TRAINING``) need ``FAKE_CUDA_RUNTIME`` (the library's path) set. Runs
with TRITON_INTERPRET unset.
"""

from __future__ import annotations

import json
import sys
import traceback

import torch

from .fake_gpu import FakeGpuUnavailable, compile_for_sm90, fake_h100, to_fake_cuda

# A process's entry: the runtime before torch (its import queries the CUDA hooks once), then the cases.
RUN = """import ctypes, os, sys
if os.environ.get("FAKE_CUDA_RUNTIME"):
    ctypes.CDLL(os.environ["FAKE_CUDA_RUNTIME"], mode=ctypes.RTLD_GLOBAL)
from dilcompile.testing.fake_gpu_cases import main
sys.exit(main(sys.argv[1:]))
"""

bf16 = torch.bfloat16


def _cuda(*shape, dtype=bf16):
    return torch.empty(*shape, device="cuda", dtype=dtype)


def _multihead(impl: str, training: bool):
    from dilcompile import MultiheadDilatedAttention

    module = MultiheadDilatedAttention(256, 4, [64, 128], [1, 2], impl=impl, dtype=bf16)

    def run():
        m = to_fake_cuda(module.requires_grad_(False)).requires_grad_(training)
        x = _cuda(2, 256, 256)
        return compile_for_sm90(lambda x: m(x, x, x, is_causal=True)[0].float().square().mean(), x, backward=training)
    return run


def _triton_outputs():
    """What Inductor's analysis of each kernel takes for an output, under every flag set that writes."""
    from torch._higher_order_ops import triton_kernel_wrap as wrap

    from dilcompile.kernels import triton_dilated as kernels
    from dilcompile.testing.gpu_compile import Config, launch_flags

    analyse = getattr(wrap, "identify_accessed_tensors", None) or wrap.identify_mutated_tensors
    args = {name: _cuda(1, 4, 512, 64) for name in ("Q", "K", "V", "DO")}
    args |= {name: _cuda(1, 4, 512, 64, dtype=torch.float32) for name in ("O", "DQ", "DK", "DV")}
    args |= {name: _cuda(1, 4, 512, dtype=torch.float32) for name in ("LSE", "DELTA")}
    args |= dict(KEEP=_cuda(1, dtype=torch.int8), OFFSETS=_cuda(2, 4, dtype=torch.int32),
                 SEGS=_cuda(9, 2, dtype=torch.int32), BRANCH=1, H=4, N=512, D=64, w=128, r=2, scale=0.125)
    written = {}
    for variant in (dict(has_keep=True, varlen=True), dict(has_keep=False, varlen=False, candidate=True, tma=True)):
        for name in ("_fwd_kernel", "_dq_kernel", "_dkdv_kernel"):
            fn = getattr(kernels, name)
            flags = launch_flags(Config(name, "bf16", 64, 64, 90, True, **variant))
            flags = {key: flags[key] for key in fn.arg_names if key in flags}  # not warps, stages
            result = analyse(fn, {arg: (args | flags)[arg] for arg in fn.arg_names}, {})
            writes = result.read_writes.writes if hasattr(result, "read_writes") else result
            written[name] = sorted(set(written.get(name, [])) | {getattr(dep, "name", dep) for dep in writes})
    return {"kernels": [[name, 1, 0] for name in written], "written": written}


def _triton_longnet(dynamic: bool):
    """The LongNet configuration at N = 65536, as the GPU probe ran it."""
    from dilcompile import dilated_attention

    q, k, v = (_cuda(1, 16, 65536, 128) for _ in range(3))
    return compile_for_sm90(lambda q, k, v: dilated_attention(
        q, k, v, segment_lengths=(2048, 4096, 8192, 16384, 32768), dilation_rates=(1, 2, 4, 8, 16), impl="triton"),
        q, k, v, dynamic=dynamic or None)


def _triton_longnet_tma():
    """The LongNet forward with the tma candidate as the table's choice (``work.KernelConfig.tma``):
    Inductor compiles the kernel that makes tensor descriptors. Adds "tma", the TMA flag of every launch,
    and "tma_loads", how many of the forward kernels built issue TMA loads. It runs after
    "triton-longnet" (the same op call, the default table) with Inductor's caches on: the op's launch
    key (``work.launch_key``) keeps that case's cached graph from being served here."""
    from dataclasses import replace

    import triton

    from dilcompile.dilated import work
    from dilcompile.dilated.impl import triton as launcher

    key, flags, loads = (90, "fwd", "bfloat16", 128), [], []
    saved, real_flags, real_compile = work.CONFIGS[key], launcher.launch_flags, triton.compile

    def spying_compile(*args, **kwargs):
        kernel = real_compile(*args, **kwargs)
        if kernel.name == "_fwd_kernel":
            loads.append("cp.async.bulk.tensor" in kernel.asm["ptx"])
        return kernel

    work.CONFIGS[key] = replace(saved, tma=True)
    launcher.launch_flags = lambda *args, **kwargs: flags.append(real_flags(*args, **kwargs)) or flags[-1]
    triton.compile = spying_compile  # compile_for_sm90 records through it
    try:
        kernels = _triton_longnet(False)
        return {"kernels": kernels, "tma": sorted({bool(f["TMA"]) for f in flags}), "tma_loads": sum(loads)}
    finally:
        work.CONFIGS[key], launcher.launch_flags, triton.compile = saved, real_flags, real_compile


def _sdpa_longnet_dynamic():
    """The LongNet configuration on the sdpa path, all sizes symbolic (the benchmark's compile): a loss
    after it, so Inductor has kernels of its own to build around the op."""
    from dilcompile import dilated_attention

    q, k, v = (_cuda(1, 16, 65536, 128) for _ in range(3))
    return compile_for_sm90(lambda q, k, v: dilated_attention(
        q, k, v, segment_lengths=(2048, 4096, 8192, 16384, 32768), dilation_rates=(1, 2, 4, 8, 16),
        impl="sdpa").float().square().mean(), q, k, v, dynamic=True)


def _triton_packed(training: bool):
    """Packed sequences: the segment table built on the device."""
    from dilcompile import dilated_attention

    q, k, v = (_cuda(1, 8, 4096, 64).requires_grad_(training) for _ in range(3))
    cu = _cuda(33, dtype=torch.int32)
    return compile_for_sm90(lambda q, k, v, cu: dilated_attention(
        q, k, v, segment_lengths=(256, 512, 1024), dilation_rates=(1, 2, 4), impl="triton",
        cu_seqlens=cu).float().square().mean(), q, k, v, cu, backward=training)


def _auto(training: bool):
    """impl="auto", H100, bf16, D = 128: triton where it trains faster."""
    from dilcompile import dilated_attention

    q, k, v = (_cuda(1, 8, 4096, 128).requires_grad_(training) for _ in range(3))
    return compile_for_sm90(lambda q, k, v: dilated_attention(q, k, v, segment_lengths=(1024, 2048),
                                                              dilation_rates=(1, 2)).float().square().mean(),
                            q, k, v, backward=training)


def _triton_backward():
    import dilcompile.dilated.triton_ops  # noqa: F401  registers the ops

    q, k, v, o, do = (_cuda(1, 4, 512, 64) for _ in range(5))
    lse = _cuda(1, 4, 512, dtype=torch.float32)
    bwd = torch.ops.dilcompile.dilated_triton_bwd
    return compile_for_sm90(lambda *t: bwd(t[4], None, *t[:4], lse, [128, 256], [1, 2], "longnet", True, 0.125, None),
                            q, k, v, o, do)


def _block_sparse(block: int, dynamic: bool):
    from dilcompile import block_sparse_attention
    from dilcompile.block_sparse import cache
    from dilcompile.block_sparse.impl.flex import flex_forward
    from dilcompile.patterns import local_window

    pattern = local_window(64)
    prepared = cache.block_mask(pattern, True, 1, 4, 512, block, "cpu")  # made before the fake mode

    def run():
        q, k, v = (_cuda(1, 4, 512, 64) for _ in range(3))
        if dynamic:  # what eager impl="flex" compiles at a second length: all sizes symbolic
            return compile_for_sm90(lambda q, k, v, mask: flex_forward(q, k, v, mask, 0.125), q, k, v,
                                    to_fake_cuda(prepared), dynamic=True)
        cache._get(cache._flex_key(pattern, True, 1, 4, 512, block, "cuda:0"), lambda: to_fake_cuda(prepared), 512)
        return compile_for_sm90(lambda q, k, v: block_sparse_attention(q, k, v, pattern, causal=True,
                                                                      block_size=block, impl="flex"), q, k, v)
    return run


def _decoder(training: bool):
    from dilcompile.models import LongNetConfig, LongNetDecoder

    model = LongNetDecoder(LongNetConfig(vocab_size=97, max_seq_len=256, embed_dim=128, num_heads=4,
                                         segment_lengths=(64, 128, 256), dilation_rates=(1, 2, 4))).to(bf16)

    def run():
        fake = to_fake_cuda(model.requires_grad_(False)).requires_grad_(training)
        idx = _cuda(2, 256, dtype=torch.long)
        return compile_for_sm90(lambda idx: fake(idx, idx)[1], idx, backward=training)
    return run


def _hf(attention: str):
    """A padded batch through a transformers Llama switched to our attention, loss and backward; no KV
    cache: its empty placeholders are real CUDA tensors."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dilcompile.integrations.transformers import register

    register()
    config = LlamaConfig(vocab_size=61, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    config.dilcompile_segment_lengths, config.dilcompile_dilation_rates = [64, 128, 256], [1, 2, 4]
    config.dilcompile_pattern, config.dilcompile_block_size = "local_window(window=64)", 64
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=bf16)

    def run():
        fake = to_fake_cuda(model.train().requires_grad_(False)).requires_grad_(True)
        ids, mask = _cuda(2, 256, dtype=torch.long), _cuda(2, 256, dtype=torch.long)
        return compile_for_sm90(lambda ids, mask: fake(ids, attention_mask=mask, labels=ids, use_cache=False).loss,
                                ids, mask, backward=True)
    return run


def _now(fn, *args):
    """A case that prepares nothing outside the fake mode."""
    return lambda: fn(*args)


# name → a function that prepares (outside the fake mode: real CPU tensors) and returns the compile step
CASES = {
    "multihead-triton": lambda: _multihead("triton", False),
    "multihead-sdpa": lambda: _multihead("sdpa", False),
    "triton-backward": lambda: _now(_triton_backward),
    "triton-outputs": lambda: _now(_triton_outputs),
    "triton-longnet": lambda: _now(_triton_longnet, False),
    "triton-longnet-dynamic": lambda: _now(_triton_longnet, True),
    "triton-longnet-tma": lambda: _now(_triton_longnet_tma),
    "sdpa-longnet-dynamic": lambda: _now(_sdpa_longnet_dynamic),
    "triton-packed": lambda: _now(_triton_packed, False),
    "block-sparse-64": lambda: _block_sparse(64, False),
    "block-sparse-128": lambda: _block_sparse(128, False),
    "block-sparse-128-dynamic": lambda: _block_sparse(128, True),
    "auto-inference": lambda: _now(_auto, False),
    "decoder": lambda: _decoder(False),
    # training: a backward, which needs the fake CUDA runtime
    "triton-packed-training": lambda: _now(_triton_packed, True),
    "auto-training": lambda: _now(_auto, True),
    "multihead-triton-training": lambda: _multihead("triton", True),
    "decoder-training": lambda: _decoder(True),
    "hf-dilcompile_dilated-training": lambda: _hf("dilcompile_dilated"),
    "hf-dilcompile_block_sparse-training": lambda: _hf("dilcompile_block_sparse"),
}
TRAINING = tuple(name for name in CASES if name.endswith("training"))


def run_case(name: str) -> dict:
    """One case: its result as the module doc says."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        step = CASES[name]()
        with fake_h100(), FakeTensorMode(allow_non_fake_inputs=True), torch.set_grad_enabled(name in TRAINING):
            result = step()
        return {"case": name, **(result if isinstance(result, dict) else {"kernels": result})}
    except FakeGpuUnavailable as exc:
        return {"case": name, "unavailable": str(exc)}
    except Exception:  # noqa: BLE001  the next case still runs; the test shows this one's traceback
        return {"case": name, "error": traceback.format_exc()[-6000:]}


def main(argv=None) -> int:
    for name in argv if argv is not None else sys.argv[1:]:
        print(json.dumps(run_case(name)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
