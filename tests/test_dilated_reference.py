"""The reference is the spec: check it against docs/design.md computed the long way
(per branch, per head, per segment, then the LSE merge formula), written
without the geometry module."""

import math

import pytest
import torch

from dilcompile import dilated_attention
from dilcompile.testing import random_qkv


def brute_force(q, k, v, segments, rates, causal, mode):
    B, H, N, D = q.shape
    scale = 1 / math.sqrt(D)
    m = len(segments)
    if mode == "longnet":
        # per head: list of (w, r, offset) branches
        branches = {h: [(w, r, h // math.ceil(H / r)) for w, r in zip(segments, rates)] for h in range(H)}
    else:
        sizes = [H // m + (1 if i < H % m else 0) for i in range(m)]
        heads = [h for i, s in enumerate(sizes) for h in [i] * s]  # group of each head
        branches = {h: [(segments[g], rates[g], g % rates[g])] for h, g in enumerate(heads)}
    out = torch.zeros(B, H, N, D, dtype=torch.float64)
    lse_out = torch.full((B, H, N), float("-inf"), dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            outs, lses = [], []
            for w, r, o in branches[h]:
                o_b = torch.zeros(N, D, dtype=torch.float64)
                l_b = torch.full((N,), float("-inf"), dtype=torch.float64)
                for start in range(0, N, min(w, N)):
                    rows = [p for p in range(start, min(start + w, N)) if (p - start) % r == o]
                    for i in rows:
                        keys = [j for j in rows if not causal or j <= i]
                        s = torch.stack([q[b, h, i] @ k[b, h, j] * scale for j in keys])
                        l_b[i] = torch.logsumexp(s, 0)
                        o_b[i] = (torch.softmax(s, 0)[:, None] * v[b, h, keys]).sum(0)
                outs.append(o_b)
                lses.append(l_b)
            lse = torch.logsumexp(torch.stack(lses), 0)
            for o_b, l_b in zip(outs, lses):
                weight = torch.where(lse.isfinite(), (l_b - lse).exp(), torch.zeros_like(lse))
                out[b, h] += weight[:, None] * o_b
            lse_out[b, h] = lse
    if mode == "groups":
        out = out / m
    return out, lse_out


@pytest.mark.parametrize("mode", ["longnet", "groups"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "n, heads, segments, rates",
    [(13, 3, (4, 8), (1, 3)), (10, 5, (3, 20), (2, 4)), (7, 2, (5,), (2,)), (1, 3, (2, 4), (1, 2))],
)
def test_reference_matches_spec_computed_the_long_way(n, heads, segments, rates, causal, mode):
    q, k, v = random_qkv(1, heads, n, 4)
    ref, lse = dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, causal=causal,
                                 mode=mode, impl="reference", return_lse=True)
    want, want_lse = brute_force(q, k, v, segments, rates, causal, mode)
    torch.testing.assert_close(ref, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(lse.isfinite(), want_lse.isfinite())
    finite = want_lse.isfinite()
    torch.testing.assert_close(lse[finite], want_lse[finite], rtol=1e-12, atol=1e-12)
