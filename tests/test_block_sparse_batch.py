"""impl="gather" over a batch: when a plan's calls are the same for every head,
the batch rows fold into the heads and each call runs once for the whole batch —
a group of same-length packed documents too, which ran the calls once per
document in a Python loop (~1 ms a document: 8000 one-token documents took 5 s).
Exact either way, against float64."""

import pytest
import torch

from dilcompile import block_sparse_attention
from dilcompile.block_sparse.impl import gather
from dilcompile.patterns import dilated, hierarchical, local_window
from dilcompile.testing import random_qkv


def _count_kernel_calls(monkeypatch):
    calls = []
    real_fwd, real_bwd = gather.bias_attention_forward, gather.bias_attention_backward
    monkeypatch.setattr(gather, "bias_attention_forward", lambda *a: calls.append("fwd") or real_fwd(*a))
    monkeypatch.setattr(gather, "bias_attention_backward", lambda *a: calls.append("bwd") or real_bwd(*a))
    return calls


def test_same_length_packed_documents_share_each_call(monkeypatch):
    lengths = [40] * 25
    q, k, v = random_qkv(1, 2, sum(lengths), 8, requires_grad=True, seed=3)
    cu = torch.tensor([0] + lengths).cumsum(0)
    kw = dict(causal=True, impl="gather", block_size=16)
    calls = _count_kernel_calls(monkeypatch)
    packed = block_sparse_attention(q, k, v, local_window(5), cu_seqlens=cu, **kw)
    packed.sum().backward()
    packed_calls = list(calls)
    calls.clear()
    first = [t[:, :, :40].detach().requires_grad_() for t in (q, k, v)]
    alone = block_sparse_attention(*first, local_window(5), **kw)
    alone.sum().backward()
    # once per call for all 25 documents (the packed backward recomputes its forward: twice the forward calls)
    assert packed_calls.count("fwd") == 2 * calls.count("fwd") and packed_calls.count("bwd") == calls.count("bwd"), \
        (packed_calls, calls)
    torch.testing.assert_close(packed[:, :, :40], alone, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(q.grad[:, :, :40], first[0].grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pattern", [local_window(6), dilated((16, 32), (1, 2)), hierarchical(((1, 4), (8, 3)))],
                         ids=["local_window", "dilated", "hierarchical"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_batch_equals_float64_with_gradients(pattern, causal):
    q, k, v = random_qkv(3, 2, 70, 8, requires_grad=True, seed=5)
    got = block_sparse_attention(q, k, v, pattern, causal=causal, impl="gather", block_size=16)
    want = block_sparse_attention(q, k, v, pattern, causal=causal, impl="reference")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(want)
    for g, w in zip(torch.autograd.grad(got, (q, k, v), grad), torch.autograd.grad(want, (q, k, v), grad)):
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-11)
