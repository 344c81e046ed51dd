"""Block-sparse attention with queries shorter than keys: the last Nq rows of
the full-length float64 reference, forward and backward, every pattern."""

import random

import pytest
import torch

from dilcompile import block_sparse_attention
from dilcompile.block_sparse.suffix import candidate_keys
from dilcompile.patterns import (adaptive, causal as causal_of, dilated, global_local, hilbert, local_window,
                                 random_blocks, union)
from dilcompile.testing import random_qkv
from helpers import PATTERNS

# At N = 1000 a 10-wide Hilbert tiling (the shared table uses 25).
PATTERNS = {**PATTERNS, "hilbert": lambda n: hilbert(10, n // 10, 1)}


def _check(pattern, nq, nk, heads, causal, block_size, seed=0):
    q_all, k, v = random_qkv(2, heads, nk, 8, seed=seed)
    q = q_all[:, :, nk - nq :].clone().requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    out = block_sparse_attention(q, k, v, pattern, causal=causal, block_size=block_size)
    full = block_sparse_attention(torch.cat([q_all[:, :, : nk - nq], q], 2), k, v, pattern, causal=causal,
                                  impl="reference")
    ref = full[:, :, nk - nq :]
    msg = f"{pattern!r} nq={nq} nk={nk} causal={causal} bs={block_size}"
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10, msg=msg)
    grad = torch.randn_like(out)
    got = torch.autograd.grad((out * grad).sum(), (q, k, v))
    want = torch.autograd.grad((ref * grad).sum(), (q, k, v))
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, msg=f"d{name}: {msg}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(PATTERNS))
def test_every_pattern_last_rows_of_full_reference(name, causal):
    for nq, nk, block_size in [(1, 100, 16), (3, 100, 32), (64, 100, 16), (70, 100, 16), (1, 1000, 64)]:
        _check(PATTERNS[name](nk), nq, nk, 3, causal, block_size)


@pytest.mark.parametrize("seed", range(10))
def test_random_patterns(seed):
    rng = random.Random(seed)
    nk = rng.choice([37, 100, 257])
    candidates = [local_window(rng.randint(0, 30)), global_local(rng.randint(0, 20), rng.randint(0, 5)),
                  random_blocks(rng.uniform(0.05, 0.6), rng.choice([4, 16, 24]), rng.randint(0, 99)),
                  dilated(tuple(rng.choice([8, 16, 40]) for _ in range(2)),
                          tuple(rng.choice([1, 2, 3]) for _ in range(2)))]
    pattern = rng.choice(candidates)
    if rng.random() < 0.3:
        pattern = union(pattern, rng.choice(candidates))
    _check(pattern, rng.choice([1, 2, 9, 64, 80]) if nk > 80 else rng.choice([1, 2, 9]), nk, rng.choice([1, 2, 5]),
           rng.random() < 0.5, rng.choice([8, 16, 64]), seed=seed)


def test_decode_gathers_only_candidate_blocks():
    keys = candidate_keys(causal_of(local_window(100)), 1, 1 << 20, 128, "cpu")
    assert keys.numel() <= 2 * 128 + 100 and keys.max() == (1 << 20) - 1


def test_adaptive_pattern_refuses_shorter_queries():
    q, k, v = random_qkv(1, 2, 128, 64)
    with pytest.raises(ValueError, match="adaptive"):
        block_sparse_attention(q[:, :, -1:], k, v, adaptive(head_dim=64))
