"""Queries shorter than keys (prefill / decode): the result is the last Nq rows
of the full-length float64 reference call, forward and backward, on random
configs; work independent of Nk; the bad-input contract."""

import random

import pytest
import torch

from dilcompile import dilated_attention
from dilcompile.dilated import suffix
from dilcompile.dilated.geometry import plan_parts
from dilcompile.dilated.impl import decode
from dilcompile.testing import random_qkv
from helpers import assert_out_lse_and_gradients_match


def _config(rng: random.Random, nk: int, heads: int):
    m = rng.randint(1, 3)
    segments = tuple(rng.choice([3, 5, 8, 16, 24, 50, nk, 2 * nk]) for _ in range(m))
    rates = tuple(rng.choice([1, 2, 3, 4, 5]) for _ in range(m))
    return segments, rates


def _check_suffix(nq, nk, heads, segments, rates, causal, mode, padded, impl="auto", seed=0):
    """Compare against the last nq rows of the full reference call, with gradients through out and lse."""
    q_all, k, v = random_qkv(2, heads, nk, 8, seed=seed)
    q = q_all[:, :, nk - nq :].clone().requires_grad_()
    prefix = q_all[:, :, : nk - nq]
    k.requires_grad_()
    v.requires_grad_()
    mask = None
    if padded:
        gen = torch.Generator().manual_seed(seed)
        mask = torch.rand(2, nk, generator=gen) < 0.3
    kw = dict(segment_lengths=segments, dilation_rates=rates, causal=causal, mode=mode, key_padding_mask=mask,
              return_lse=True)
    out, lse = dilated_attention(q, k, v, impl=impl, **kw)
    full, full_lse = dilated_attention(torch.cat([prefix, q], 2), k, v, impl="reference", **kw)
    ref, ref_lse = full[:, :, nk - nq :], full_lse[:, :, nk - nq :]
    msg = f"nq={nq} nk={nk} H={heads} {segments} {rates} causal={causal} {mode} padded={padded}"
    assert out.shape == q.shape and lse.shape == q.shape[:-1], msg
    assert_out_lse_and_gradients_match(out, lse, ref, ref_lse, (q, k, v), msg)


@pytest.mark.parametrize("seed", range(24))
def test_decode_equals_last_rows_of_full_reference_random_configs(seed):
    rng = random.Random(seed)
    nk = rng.choice([2, 7, 33, 97, 130])
    heads = rng.choice([1, 3, 4, 6])
    segments, rates = _config(rng, nk, heads)
    nq = rng.choice([1, 1, 2, 5, min(nk, 64)])
    nq = min(nq, nk)
    if nq == nk:
        nq = nk - 1
    _check_suffix(nq, nk, heads, segments, rates, rng.random() < 0.5, rng.choice(["longnet", "groups"]),
                  rng.random() < 0.3, seed=seed)


@pytest.mark.parametrize("seed", range(8))
def test_prefill_region_equals_last_rows_of_full_reference_random_configs(seed):
    """Nq above DECODE_MAX_QUERIES: the full-length kernels on a suffix of the keys."""
    rng = random.Random(100 + seed)
    nk = rng.choice([150, 211, 300])
    nq = rng.randint(suffix.DECODE_MAX_QUERIES + 1, nk - 1)
    heads = rng.choice([2, 3, 5])
    segments, rates = _config(rng, nk, heads)
    _check_suffix(nq, nk, heads, segments, rates, rng.random() < 0.5, rng.choice(["longnet", "groups"]),
                  rng.random() < 0.3, seed=seed)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "groups"])
def test_fixed_awkward_configs(causal, mode):
    for nq, nk, heads, segments, rates in [(1, 97, 6, (16, 32, 64), (1, 3, 4)), (3, 1025, 8, (100, 300), (3, 7)),
                                           (2, 97, 3, (200,), (5,)), (65, 97, 5, (4, 8), (1, 3))]:
        _check_suffix(nq, nk, heads, segments, rates, causal, mode, False)


def test_reference_impl_takes_shorter_queries():
    _check_suffix(5, 40, 4, (8, 16), (1, 2), True, "longnet", True, impl="reference")


def test_equal_lengths_unchanged():
    q, k, v = random_qkv(1, 4, 50, 8)
    kw = dict(segment_lengths=(8, 16), dilation_rates=(1, 2), causal=True)
    torch.testing.assert_close(dilated_attention(q, k, v, **kw), dilated_attention(q, k, v, impl="reference", **kw),
                               rtol=1e-10, atol=1e-10)


def test_decode_touches_only_the_querys_segment():
    """A decode query reads at most ceil(w / r) keys per part it is kept by, whatever Nk."""
    parts = plan_parts(8, (2048, 4096, 8192), (1, 2, 4))
    for nk in (4096, 65536, 1 << 20, (1 << 20) + 17):
        keys = [len(range(*k.indices(nk))) for part in parts for _, k, _, _ in decode.pieces(part, 1, nk)]
        assert len(keys) <= 3  # one part per branch keeps the position
        assert all(n <= -(-w // r) for n, w, r in zip(keys, (2048, 4096, 8192), (1, 2, 4)))


def test_decode_op_compiles_without_recompiles_as_keys_grow():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    fn = torch.compile(lambda q, k, v: dilated_attention(q, k, v, segment_lengths=(8, 16), dilation_rates=(1, 2),
                                                         causal=True), backend=counter, fullgraph=True, dynamic=True)
    q, k, v = random_qkv(1, 4, 80, 8)
    for nk in range(30, 80, 7):
        got = fn(q[:, :, nk - 1 : nk], k[:, :, :nk], v[:, :, :nk])
        want = dilated_attention(q[:, :, :nk], k[:, :, :nk], v[:, :, :nk], segment_lengths=(8, 16),
                                 dilation_rates=(1, 2), causal=True, impl="reference")[:, :, -1:]
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert counter.frame_count == 1, counter.frame_count
    torch._dynamo.reset()


def test_decode_op_opcheck():
    q, k, v = random_qkv(2, 4, 20, 8, requires_grad=True)
    args = (q[:, :, -3:].detach().requires_grad_(), k, v, [8, 16], [1, 2], "longnet", True, 0.3, None)
    torch.library.opcheck(torch.ops.dilcompile.dilated_decode_fwd, args)


@pytest.mark.parametrize("bad, match", [
    (lambda q, k, v: (torch.zeros(1, 4, 30, 8, dtype=torch.float64), k, v), "Nq ≤ Nk"),
    (lambda q, k, v: (q, k[:, :3], v[:, :3]), "k has shape"),
    (lambda q, k, v: (q, k, v[:, :, :-1]), "v has shape"),
    (lambda q, k, v: (q[..., :4], k, v), "k has shape"),
])
def test_bad_shapes_are_value_errors(bad, match):
    q, k, v = random_qkv(1, 4, 20, 8)
    q = q[:, :, -2:]
    with pytest.raises(ValueError, match=match):
        dilated_attention(*bad(q, k, v), segment_lengths=(8,), dilation_rates=(1,))
    with pytest.raises(ValueError, match="key_padding_mask"):
        dilated_attention(q, k, v, segment_lengths=(8,), dilation_rates=(1,),
                          key_padding_mask=torch.zeros(1, 2, dtype=torch.bool))
