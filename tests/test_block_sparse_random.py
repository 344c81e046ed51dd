"""Randomized configurations: every pattern of the library and the
combinators, with random parameters, sequence lengths, block sizes, heads
and causal, through the gather backend against the float64 reference —
outputs and dq, dk, dv. The master seed is fixed, so a failure reproduces;
its case id names the configuration."""

import random

import pytest
import torch

from dilcompile import block_sparse_attention
from dilcompile.patterns import (
    adaptive, causal, dilated, global_local, hierarchical, hilbert, intersection, local_window, random_blocks, union,
)
from dilcompile.testing import random_qkv

MASTER_SEED = 20240517
CASES_PER_KIND = 12


def _local_window(rng, n):
    return local_window(rng.choice([0, 1, rng.randrange(n + 8), rng.randrange(2 * n + 2)]))


def _dilated(rng, n):
    branches = rng.randint(1, 3)
    segments = sorted(rng.randint(1, 2 * n) for _ in range(branches))
    return dilated(tuple(segments), tuple(rng.randint(1, 4) for _ in range(branches)),
                   mode=rng.choice(["longnet", "groups"]))


def _global_local(rng, n):
    return global_local(rng.randrange(n + 4), rng.choice([0, 1, rng.randrange(n + 4)]))


def _random_blocks(rng, n):
    density = rng.choice([0.0, 0.02, 0.05, 0.1, rng.random(), 1.0])
    return random_blocks(density, rng.randint(1, 80), rng.randrange(1000))


def _hierarchical(rng, n):
    return hierarchical(tuple((rng.randint(1, 40), rng.randrange(12)) for _ in range(rng.randint(1, 3))))


def _hilbert(rng, n):
    return hilbert(rng.randint(1, 24), rng.randint(1, 24), rng.randrange(4))


def _leaf(rng, n):
    return rng.choice([_local_window, _dilated, _global_local, _random_blocks, _hierarchical])(rng, n)


def _union(rng, n):
    return union(*(_leaf(rng, n) for _ in range(rng.randint(1, 3))))


def _intersection(rng, n):
    return intersection(*(_leaf(rng, n) for _ in range(rng.randint(1, 3))))


def _causal(rng, n):
    return causal(rng.choice([_leaf, _union])(rng, n))


KINDS = {"local_window": _local_window, "dilated": _dilated, "global_local": _global_local,
         "random_blocks": _random_blocks, "hierarchical": _hierarchical, "hilbert": _hilbert, "union": _union,
         "intersection": _intersection, "causal": _causal}


def _cases():
    rng = random.Random(MASTER_SEED)
    cases = []
    for kind, make in KINDS.items():
        for i in range(CASES_PER_KIND):
            n = rng.choice([1, 2, rng.randint(3, 130), rng.randint(130, 700)])
            pattern = make(rng, n)
            if kind == "hilbert":
                n = pattern.num_tokens  # the curve is laid over exactly height · width tokens
            block_size = rng.choice([1, 3, 8, 16, 32, 64, 128, rng.randint(2, 200)])
            cases.append(pytest.param(pattern, n, block_size, rng.randint(1, 3), rng.random() < 0.5,
                                      rng.randrange(1 << 30), id=f"{kind}-{i}"))
    return cases


@pytest.mark.parametrize("pattern, n, block_size, heads, is_causal, data_seed", _cases())
def test_gather_matches_reference_on_random_configs(pattern, n, block_size, heads, is_causal, data_seed):
    torch.manual_seed(data_seed)
    q, k, v = random_qkv(1, heads, n, 4, requires_grad=True, seed=data_seed)
    got = block_sparse_attention(q, k, v, pattern, causal=is_causal, block_size=block_size, impl="gather")
    want = block_sparse_attention(q, k, v, pattern, causal=is_causal, block_size=block_size, impl="reference")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(got)
    for name, g, w in zip("qkv", torch.autograd.grad((got * grad).sum(), (q, k, v)),
                          torch.autograd.grad((want * grad).sum(), (q, k, v))):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, msg=lambda m, name=name: f"d{name}: {m}")


def _adaptive_cases():
    rng = random.Random(MASTER_SEED + 1)
    return [pytest.param(rng.choice([1, rng.randint(2, 300)]), rng.randint(1, 70), rng.randint(1, 6),
                         rng.random() < 0.5, rng.randrange(1 << 30), id=f"adaptive-{i}")
            for i in range(CASES_PER_KIND)]


@pytest.mark.parametrize("n, block_size, top_k, is_causal, data_seed", _adaptive_cases())
@pytest.mark.parametrize("training", [False, True])
def test_adaptive_gather_matches_reference_on_random_configs(n, block_size, top_k, is_causal, data_seed, training):
    """The learned pattern, outputs and gradients. Eval: no straight-through
    bias, the same selection on both paths. Training: the bias (zero in value)
    carries the scorer's gradient, on the reference path too (it dropped it)."""
    torch.manual_seed(data_seed)
    pattern = adaptive(head_dim=4, block_size=block_size, top_k=top_k).double().train(training)
    q, k, v = random_qkv(2, 2, n, 4, requires_grad=True, seed=data_seed)
    got = block_sparse_attention(q, k, v, pattern, causal=is_causal, impl="gather")
    want = block_sparse_attention(q, k, v, pattern, causal=is_causal, impl="reference")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(got)
    inputs = (q, k, v, pattern.q_proj.weight, pattern.k_proj.weight)
    got_grads = torch.autograd.grad((got * grad).sum(), inputs, allow_unused=True)
    want_grads = torch.autograd.grad((want * grad).sum(), inputs, allow_unused=True)
    for name, g, w in zip(("q", "k", "v", "q_proj", "k_proj"), got_grads, want_grads):
        if name.endswith("proj") and not training:
            assert g is None and w is None  # eval: the selection is not differentiated
            continue
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("n, density, seed, is_causal", [(512, 0.1, 0, False), (512, 0.1, 4, True), (256, 0.05, 0, False),
                                                          (1024, 0.05, 0, False), (2048, 0.02, 0, True),
                                                          (512, 0.0, 0, False), (512, 0.0, 0, True)])
def test_random_blocks_with_rows_that_have_no_band(n, density, seed, is_causal):
    """Rows with no run of two dense blocks next to rows with one (the plan's
    band search once indexed past a one-block list): exact at the default
    block size."""
    q, k, v = random_qkv(1, 1, n, 8, requires_grad=True, seed=seed)
    pattern = random_blocks(density, seed=seed)
    got = block_sparse_attention(q, k, v, pattern, causal=is_causal, impl="gather")
    want = block_sparse_attention(q, k, v, pattern, causal=is_causal, impl="reference")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for g, w in zip(torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def _strided(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x (B, H, N, D) with the same values in another memory layout, as callers hand it over: a transposed
    (B, N, H, D) projection, a slice of a longer (B, H, M, D) KV cache, or a key head broadcast (stride 0)."""
    b, h, n, d = x.shape
    if layout == "transposed":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "cache":
        cache = torch.full((b, h, n + 7, d), float("nan"), dtype=x.dtype)
        cache[:, :, :n] = x
        return cache[:, :, :n]
    return x[:, :1].expand(b, h, n, d)  # "broadcast": every head reads head 0


@pytest.mark.parametrize("pattern, n, block_size, heads, is_causal, data_seed", _cases()[::2])
def test_gather_reads_strided_inputs_in_place(pattern, n, block_size, heads, is_causal, data_seed):
    """The forward reads q, k, v where they lie (rows of D contiguous: no whole copy of any of them) and
    equals the float64 reference on them, whatever the strides: per-token reads where they are not
    contiguous, whole blocks where they are."""
    rng = random.Random(data_seed)
    batch = rng.choice([1, 1, 2])
    q, k, v = random_qkv(batch, heads, n, 4, seed=data_seed)
    q, k, v = (_strided(x, rng.choice(["transposed", "cache", "broadcast"])) for x in (q, k, v))
    got = block_sparse_attention(q, k, v, pattern, causal=is_causal, block_size=block_size, impl="gather")
    want = block_sparse_attention(q.contiguous(), k.contiguous(), v.contiguous(), pattern, causal=is_causal,
                                  block_size=block_size, impl="reference")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
