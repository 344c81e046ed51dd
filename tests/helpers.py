"""Fixtures shared by several test files: the block-sparse pattern table and
the float64 comparison of out, lse and their gradients."""

import torch

from dilcompile.patterns import (dilated, global_local, hierarchical, hilbert, intersection, local_window,
                                 random_blocks, union)

_HILBERT_SIDE = {100: 10, 128: 8, 1000: 25}

#: name → pattern for a sequence of n positions (n in 100, 128, 1000 for hilbert).
PATTERNS = {
    "local_window": lambda n: local_window(7),
    "dilated": lambda n: dilated((16, 48), (1, 3)),
    "global_local": lambda n: global_local(5, 3),
    "random_blocks": lambda n: random_blocks(0.3, 24, 1),
    "hierarchical": lambda n: hierarchical(((1, 4), (8, 3))),
    "hilbert": lambda n: hilbert(_HILBERT_SIDE[n], n // _HILBERT_SIDE[n], 1),
    "union": lambda n: union(local_window(3), random_blocks(0.1, 16, 2)),
    "intersection": lambda n: intersection(local_window(40), hierarchical()),
}


def assert_out_lse_and_gradients_match(out, lse, ref, ref_lse, inputs, msg=""):
    """out, lse equal ref, ref_lse to 1e-10 (lse where the reference is finite,
    non-finite at the same rows); gradients of a random loss through both with
    respect to ``inputs`` (q, k, v) equal to 1e-9 and free of NaN."""
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10, msg=msg or None)
    assert torch.equal(lse.isfinite(), ref_lse.isfinite()), msg
    covered = ref_lse.isfinite()
    torch.testing.assert_close(lse[covered], ref_lse[covered], rtol=1e-10, atol=1e-10, msg=msg or None)

    grad_out = torch.randn_like(out)
    grad_lse = torch.randn_like(lse) * covered
    def loss(o, l):
        return (o * grad_out).sum() + (l.nan_to_num(0.0, 0.0, 0.0) * grad_lse).sum()
    got = torch.autograd.grad(loss(out, lse), inputs)
    want = torch.autograd.grad(loss(ref, ref_lse), inputs)
    for name, g, w in zip("qkv", got, want):
        assert not g.isnan().any(), f"d{name} NaN: {msg}"
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, msg=f"d{name}: {msg}")
