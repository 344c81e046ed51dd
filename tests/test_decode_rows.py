"""A decode step of a padded batch (one query per row, rows of different real
lengths: left-padded generation) or of several packed sequences runs as one
call (``decode_rows_forward``), not one call per sequence; each sequence still
equals itself alone. Against the float64 reference of each row's real tokens
alone and against the per-sequence path, on random paddings, lengths, branch
configurations and modes."""

import random

import pytest
import torch

from dilcompile import dilated_attention
from dilcompile.dilated import varlen_ops
from dilcompile.dilated.impl import decode


def _random_case(seed):
    rng = random.Random(seed)
    m = rng.randint(1, 3)
    segments = tuple(sorted(rng.sample(range(1, 40), m)))
    config = dict(segment_lengths=segments, dilation_rates=tuple(rng.randint(1, 5) for _ in range(m)),
                  mode=rng.choice(["longnet", "groups"]), causal=rng.random() < 0.5)
    heads = max(rng.randint(1, 6), m if config["mode"] == "groups" else 1)
    batch, slots = rng.randint(2, 5), rng.randint(1, 70)
    pads = torch.zeros(batch, slots, dtype=torch.bool)
    for b in range(batch):  # left padding mostly (generation), a gap or none sometimes; the last slot is real
        kind = rng.choice(["left", "left", "gap", "none"])
        cut = rng.randint(0, slots - 1)
        if kind == "left":
            pads[b, :cut] = True
        elif kind == "gap":
            pads[b, cut // 2 : cut] = True
    return config, heads, pads


@pytest.mark.parametrize("seed", range(12))
def test_a_padded_decode_step_is_one_call_equal_to_each_row_alone(seed, monkeypatch):
    config, heads, pads = _random_case(seed)
    batch, slots = pads.shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, 1, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(batch, heads, slots, 8, generator=g, dtype=torch.float64) for _ in range(2))
    calls = []
    real = decode.decode_rows_forward
    monkeypatch.setattr(varlen_ops, "decode_rows_forward", lambda *a: calls.append(1) or real(*a))
    out, lse = dilated_attention(q, k, v, key_padding_mask=pads, return_lse=True, **config)
    assert calls == [1]
    for b in range(batch):
        keep = ~pads[b]
        want, want_lse = dilated_attention(q[b : b + 1], k[b : b + 1, :, keep], v[b : b + 1, :, keep],
                                           impl="reference", return_lse=True, **config)
        torch.testing.assert_close(out[b : b + 1], want, rtol=1e-12, atol=1e-12, msg=f"row {b}")
        covered = want_lse.isfinite()
        assert torch.equal(lse[b : b + 1].isfinite(), covered)
        torch.testing.assert_close(lse[b : b + 1][covered], want_lse[covered], rtol=1e-12, atol=1e-12)


def test_several_packed_sequences_decoding_at_once():
    """cu_seqlens_q / cu_seqlens_k with one query each (decoding several sequences): one call."""
    lengths = [9, 1, 30, 17]
    cu_k = torch.tensor([0] + lengths).cumsum(0)
    cu_q = torch.arange(len(lengths) + 1)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, len(lengths), 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 4, sum(lengths), 8, generator=g, dtype=torch.float64) for _ in range(2))
    kw = dict(segment_lengths=(4, 16), dilation_rates=(1, 4), causal=True)
    out = dilated_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw)
    for i in range(len(lengths)):
        keys = slice(int(cu_k[i]), int(cu_k[i + 1]))
        want = dilated_attention(q[:, :, i : i + 1], k[:, :, keys], v[:, :, keys], impl="reference", **kw)
        torch.testing.assert_close(out[:, :, i : i + 1], want, rtol=1e-12, atol=1e-12, msg=f"sequence {i}")


def test_gradients_of_a_decode_step_equal_each_row_alone():
    config, heads, pads = _random_case(3)
    batch, slots = pads.shape
    q = torch.randn(batch, heads, 1, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(batch, heads, slots, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = dilated_attention(q, k, v, key_padding_mask=pads, **config)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for b in range(batch):
        keep = ~pads[b]
        alone = [q[b : b + 1].detach().requires_grad_(), k[b : b + 1, :, keep].detach().requires_grad_(),
                 v[b : b + 1, :, keep].detach().requires_grad_()]
        want = torch.autograd.grad(dilated_attention(*alone, impl="reference", **config).sum(), alone)
        torch.testing.assert_close(grads[0][b : b + 1], want[0], rtol=1e-11, atol=1e-12)
        torch.testing.assert_close(grads[1][b : b + 1, :, keep], want[1], rtol=1e-11, atol=1e-12)
        torch.testing.assert_close(grads[2][b : b + 1, :, keep], want[2], rtol=1e-11, atol=1e-12)
