"""Block-sparse decode (Nq ≤ 64 < Nk) with a block_size past Nk: the answer
of the full call's last rows, with memory bounded by N — ``candidate_keys``
built ``torch.arange(block_size)`` (2.2 GB at 2**27 and N = 10, an 8.8 TB
request at 2**40); the full-length path already clamps block_size to N."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from dilcompile import block_sparse_attention
from dilcompile.block_sparse.suffix import candidate_keys
from dilcompile.patterns import causal as causal_of
from dilcompile.patterns import local_window
from dilcompile.testing import random_qkv

HUGE = [2 ** 27, 2 ** 40, 2 ** 62]


@pytest.mark.parametrize("block_size", HUGE)
def test_decode_with_block_size_past_n_is_the_full_calls_last_row(block_size):
    """Probe: N = 10, local_window(2), causal, q[:, :, -1:]; float32 against
    the full call with the same block_size, float64 (out and gradients)
    against the full-length reference."""
    q, k, v = random_qkv(1, 2, 10, 4, dtype=torch.float32, seed=0)
    full = block_sparse_attention(q, k, v, local_window(2), block_size=block_size, causal=True)
    got = block_sparse_attention(q[:, :, -1:], k, v, local_window(2), block_size=block_size, causal=True)
    torch.testing.assert_close(got, full[:, :, -1:])

    q, k, v = random_qkv(2, 3, 10, 4, seed=1, requires_grad=True)
    q_last = q[:, :, -1:].detach().clone().requires_grad_()
    got = block_sparse_attention(q_last, k, v, local_window(2), block_size=block_size, causal=True)
    ref = block_sparse_attention(torch.cat([q[:, :, :-1].detach(), q_last], 2), k, v, local_window(2), causal=True,
                                 impl="reference")[:, :, -1:]
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(got)
    for g, w in zip(torch.autograd.grad((got * grad).sum(), (q_last, k, v)),
                    torch.autograd.grad((ref * grad).sum(), (q_last, k, v))):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("block_size", HUGE)
def test_decode_memory_is_bounded_by_n_not_block_size(block_size):
    """No single op of the N = 10 decode call allocates more than 64 KiB
    (at 2**27 one arange took 1 GiB)."""
    q, k, v = random_qkv(1, 2, 10, 4, dtype=torch.float32, seed=2)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        block_sparse_attention(q[:, :, -1:], k, v, local_window(2), block_size=block_size, causal=True)
    events = prof.events()
    assert events, "the profiler recorded no op"
    biggest = max(e.self_cpu_memory_usage for e in events)
    assert biggest <= 64 << 10, f"an op allocated {biggest} bytes"


@pytest.mark.parametrize("block_size", HUGE)
def test_candidate_keys_past_n_are_the_keys(block_size):
    keys = candidate_keys(causal_of(local_window(2)), 1, 10, block_size, "cpu")
    assert keys.tolist() == list(range(10))
