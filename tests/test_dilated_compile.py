"""Compile contract: fullgraph, no graph breaks, ≤ 1 recompile over an N sweep,
compiled == eager, and the custom ops pass torch.library.opcheck."""

import pytest
import torch
from torch._dynamo.utils import counters

from dilcompile import DilatedAttention, dilated_attention
from dilcompile.testing import random_qkv

KW = dict(segment_lengths=(64, 128), dilation_rates=(1, 2))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def test_function_compiles_fullgraph_one_graph_over_n_sweep_with_grads(device):
    def fn(q, k, v):
        return dilated_attention(q, k, v, causal=True, **KW)

    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    for n in (128, 200, 256, 1000):
        q, k, v = random_qkv(1, 4, n, 16, dtype=torch.float32, device=device, requires_grad=True)
        out = compiled(q, k, v)
        got = torch.autograd.grad(out.square().sum(), (q, k, v))
        want_out = fn(q, k, v)
        want = torch.autograd.grad(want_out.square().sum(), (q, k, v))
        torch.testing.assert_close(out, want_out, rtol=1e-6, atol=1e-6)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_module_compiles_fullgraph_and_return_lse(device):
    module = DilatedAttention(segment_lengths=(32, 64), dilation_rates=(1, 2), mode="groups")
    compiled = torch.compile(module, fullgraph=True)
    q, k, v = random_qkv(2, 3, 97, 8, dtype=torch.float32, device=device)
    torch.testing.assert_close(compiled(q, k, v), module(q, k, v), rtol=1e-6, atol=1e-6)

    fn = torch.compile(lambda q, k, v: dilated_attention(q, k, v, return_lse=True, **KW), fullgraph=True)
    out, lse = fn(q, k, v)
    want_out, want_lse = dilated_attention(q, k, v, return_lse=True, **KW)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


def test_custom_ops_pass_opcheck(device):
    q, k, v = random_qkv(1, 4, 50, 8, dtype=torch.float32, device=device, requires_grad=True)
    args = (q, k, v, [16, 32], [1, 2], "longnet", True, 0.25, torch.rand(1, 50, device=device) < 0.2)
    torch.library.opcheck(torch.ops.dilcompile.dilated_fwd.default, args)
    out, lse = torch.ops.dilcompile.dilated_fwd(*args)
    bwd_args = (torch.randn_like(out), None, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
                [16, 32], [1, 2], "longnet", True, 0.25, args[-1])
    torch.library.opcheck(torch.ops.dilcompile.dilated_bwd.default, bwd_args)


def test_key_padding_mask_compiles_fullgraph(device):
    fn = lambda q, k, v, m: dilated_attention(q, k, v, key_padding_mask=m, causal=True, **KW)  # noqa: E731
    q, k, v = random_qkv(2, 4, 150, 8, dtype=torch.float32, device=device)
    mask = torch.rand(2, 150, device=device) < 0.3
    torch.testing.assert_close(torch.compile(fn, fullgraph=True)(q, k, v, mask), fn(q, k, v, mask))
