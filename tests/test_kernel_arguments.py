"""What the CUDA attention kernels receive, checked without a GPU: the
wrappers of ``kernels/attention.py`` call ATen's CUDA kernels with the
arguments PyTorch's own autograd passes them (docs/gpu.md, "CUDA kernels")."""

import types

import torch

from dilcompile.kernels import attention

aten = torch.ops.aten


def test_flash_backward_gets_undefined_cum_seq_as_the_dense_forward_returns():
    # A defined cum_seq tensor, even empty, sends ATen's flash backward down its varlen path, which
    # refused our int64 placeholders on the GPU ("cu_seqlens_q must have dtype int32").
    q, k, v, do = (torch.randn(1, 2, 16, 64, dtype=torch.bfloat16, device="meta") for _ in range(4))
    forward = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=0.125)
    out, lse, cum_seq_q, cum_seq_k = forward[:4]
    calls = []

    def record(*args, **kwargs):
        calls.append(args)
        return aten._scaled_dot_product_flash_attention_backward(*args, **kwargs)  # the meta rule

    stub = types.SimpleNamespace(_scaled_dot_product_flash_attention_backward=record)
    real_aten, real_backend = attention.aten, attention.backend_for
    attention.aten, attention.backend_for = stub, lambda *args, **kwargs: "cuda_flash"
    try:
        dq, dk, dv = attention.attention_backward(do, q, k, v, out, lse, True, 0.125)
    finally:
        attention.aten, attention.backend_for = real_aten, real_backend
    (args,) = calls
    assert cum_seq_q is None and cum_seq_k is None  # what the forward gives autograd for dense input
    assert args[6] is None and args[7] is None
    assert (args[8], args[9], args[10], args[11]) == (16, 16, 0.0, True)
    assert dq.shape == dk.shape == dv.shape == q.shape
