"""Compile the fused dilated Triton kernels ahead of time for an NVIDIA target.

No GPU is needed: ``triton.compile`` with an explicit ``GPUTarget`` lowers to
PTX and cubin using the ptxas bundled with the triton wheel. This catches
kernels that cannot compile on a device, e.g. a ``scale`` typed fp64 as
torch.compile types Python floats.
"""

from __future__ import annotations

import os

_POINTERS = {
    "_fwd_kernel": ("Q", "K", "V", "O", "LSE", "KEEP", "BRANCHES", "OFFSETS"),
    "_dq_kernel": ("Q", "K", "V", "DO", "LSE", "DELTA", "DQ", "KEEP", "BRANCHES", "OFFSETS"),
    "_dkdv_kernel": ("Q", "K", "V", "DO", "LSE", "DELTA", "DK", "DV", "KEEP", "BRANCHES", "OFFSETS"),
}
_HALF = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}


def compile_kernel(name: str, dtype: str, head_dim: int, arch: int,
                   scale_type: str = "fp32", causal: bool = True, has_keep: bool = True):
    """Compile one kernel for ``sm_<arch>`` with the launcher's GPU tiles; returns
    triton's compiled kernel (``.asm['cubin']``, ``.n_regs``, ``.n_spills``)."""
    if os.environ.get("TRITON_INTERPRET"):
        raise RuntimeError("TRITON_INTERPRET is set: unset it to compile for a GPU")
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dilcompile.dilated.impl import triton as launcher
    from dilcompile.kernels import triton_dilated as kernels

    fn = getattr(kernels, name)
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    signature = {}
    for arg in fn.arg_names:
        if arg in _POINTERS[name]:
            if arg in ("LSE", "DELTA"):
                signature[arg] = "*fp32"
            elif arg == "KEEP":
                signature[arg] = "*i8"
            elif arg in ("BRANCHES", "OFFSETS"):
                signature[arg] = "*i32"
            else:
                signature[arg] = _HALF[dtype]
        elif arg in ("m", "H", "N", "D"):
            signature[arg] = "i32"
        elif arg == "scale":
            signature[arg] = scale_type
        else:
            signature[arg] = "constexpr"
    blocks = launcher._blocks(head_dim)  # GPU tiles: TRITON_INTERPRET is unset
    num_warps = blocks.pop("num_warps", 4)
    num_stages = blocks.pop("num_stages", 2)
    constexprs = dict(blocks, HAS_KEEP=has_keep, CAUSAL=causal,
                      PREC=launcher._precision(torch_dtype))
    src = ASTSource(fn, signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages))
