"""Patterns: analytic block lists against the block mask derived from the
dense mask, exact nnz, spec round-trip, Hilbert permutation, bad input."""

import itertools

import pytest
import torch

from dilcompile.patterns import (
    PATTERN_NAMES, causal, dilated, from_spec, global_local, hierarchical, hilbert, intersection, local_window,
    random_blocks, union,
)

# (pattern, any is exact, full is exact) — the rest are sound (any ⊇, full ⊆).
STATIC = [
    (local_window(5), True, True),
    (global_local(3, 7), True, False),
    (dilated((8, 32, 20), (1, 4, 3)), True, False),
    (random_blocks(0.3, 8, 1), True, True),
    (random_blocks(0.3, 40, 2), True, True),
    (hierarchical(((1, 3), (4, 2), (16, 1))), True, False),
    (union(local_window(2), random_blocks(0.2, 16)), True, False),
    (intersection(local_window(20), hierarchical()), False, False),
    (causal(dilated((8, 32), (1, 4))), True, False),
]


def _dense_block_state(mask, n, bs):
    h = mask.shape[0]
    nb = -(-n // bs)
    padded = torch.nn.functional.pad(mask, (0, nb * bs - n, 0, nb * bs - n)).view(h, nb, bs, nb, bs)
    inside = torch.zeros(nb * bs, dtype=torch.bool)
    inside[:n] = True
    inside = (inside[:, None] & inside[None]).view(nb, bs, nb, bs)
    anyb = padded.any(4).any(2)
    return anyb, (padded | ~inside).all(4).all(2) & anyb


def _listed(lists, nb):
    hp = lists.num.shape[0]
    anyb, full = (torch.zeros(hp, nb, nb, dtype=torch.bool) for _ in range(2))
    for h in range(hp):
        for r in range(nb):
            anyb[h, r, lists.indices[h, r, : lists.num[h, r]].long()] = True
            full[h, r, lists.full_indices[h, r, : lists.full_num[h, r]].long()] = True
    return anyb, full


@pytest.mark.parametrize("n", [37, 100, 128])
@pytest.mark.parametrize("pattern, any_exact, full_exact", STATIC, ids=lambda p: repr(p)[:30])
def test_analytic_block_lists_match_dense_mask(pattern, any_exact, full_exact, n):
    heads, bs = 5, 16
    bound = pattern.with_heads(heads)
    mask = bound.dense_mask(heads, n)
    want_any, want_full = _dense_block_state(mask, n, bs)
    for transpose in (False, True):
        got_any, got_full = _listed(bound.block_lists(heads, n, bs, transpose=transpose), -(-n // bs))
        w_any, w_full = (x.transpose(1, 2) for x in (want_any, want_full)) if transpose else (want_any, want_full)
        w_any, w_full = w_any[: got_any.shape[0]], w_full[: got_any.shape[0]]
        assert (got_any >= w_any).all(), "a block with an allowed pair is missing"
        assert (got_full <= w_full).all(), "a block called full has a forbidden pair"
        if any_exact:
            assert torch.equal(got_any, w_any)
        if full_exact:
            assert torch.equal(got_full, w_full)
    assert pattern.nnz(heads, n, block_size=bs) == int(mask.sum())
    assert pattern.density(n, heads) == pytest.approx(mask.float().mean().item())


@pytest.mark.parametrize("pat", [dilated((32, 64), (1, 2)), local_window(40)], ids=repr)
def test_block_mask_is_a_flex_block_mask_equal_to_create_block_mask(pat):
    """Same partial and full block sets as FlexAttention's own builder: a block
    listed in both would be computed twice by the kernel."""
    from torch.nn.attention.flex_attention import create_block_mask

    ours = pat.block_mask(1, 4, 256, 32, causal=True)
    bound = causal(pat).with_heads(4)
    theirs = create_block_mask(lambda b, h, q, kv: bound.mask_mod(b, h, q, kv), 1, 4, 256, 256, device="cpu", BLOCK_SIZE=32)
    assert torch.equal(ours.to_dense(), theirs.to_dense())
    for kind in ("kv", "full_kv", "q", "full_q"):
        got_num, want_num = getattr(ours, f"{kind}_num_blocks"), getattr(theirs, f"{kind}_num_blocks")
        assert torch.equal(got_num, want_num), kind
        got_idx, want_idx = getattr(ours, f"{kind}_indices"), getattr(theirs, f"{kind}_indices")
        for row in itertools.product(*map(range, got_num.shape)):
            m = int(got_num[row])
            assert sorted(got_idx[row][:m].tolist()) == sorted(want_idx[row][:m].tolist()), (kind, row)


def test_hilbert_is_raster_attention_up_to_the_permutation():
    from dilcompile import block_sparse_attention
    from dilcompile.block_sparse.impl.reference import masked_attention_reference
    from dilcompile.testing import random_qkv

    pat = hilbert(6, 11, 1)
    perm, inv = pat.permutation(), pat.inverse()
    assert torch.equal(torch.sort(perm).values, torch.arange(66)) and torch.equal(perm[inv], torch.arange(66))
    q, k, v = random_qkv(1, 2, 66, 8)
    got = block_sparse_attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], pat, block_size=16)[:, :, inv]
    i = torch.arange(66)
    raster = pat.raster_mask_mod(0, 0, i[:, None], i[None, :])
    torch.testing.assert_close(got, masked_attention_reference(q, k, v, raster, 8 ** -0.5), rtol=1e-10, atol=1e-10)
    # Bounding-box block lists are sound (never miss an allowed pair).
    want_any, _ = _dense_block_state(pat.dense_mask(1, 66), 66, 16)
    got_any, _ = _listed(pat.block_lists(1, 66, 16), 5)
    assert (got_any >= want_any).all()


def test_spec_round_trip_and_defaults():
    assert set(PATTERN_NAMES) >= {"local_window", "dilated", "global_local", "random_blocks", "hierarchical",
                                  "adaptive", "hilbert", "union", "intersection", "causal"}
    for pat, _, _ in STATIC:
        assert from_spec(repr(pat)) == pat
    assert from_spec("local_window") == local_window()
    assert from_spec("local_window(window=64)") == local_window(64) == from_spec("local_window(64)")
    assert from_spec("dilated(segment_lengths=(2048,4096),dilation_rates=(1,2))") == dilated((2048, 4096), (1, 2))
    assert from_spec("union(local_window(8), random_blocks(density=0.05, seed=3))") == union(
        local_window(8), random_blocks(0.05, seed=3))
    assert repr(local_window(64)) == "local_window(window=64)"


@pytest.mark.parametrize("spec, err", [
    ("nope(1)", ValueError), ("local_window(window=-1)", ValueError), ("local_window(window=1.5)", ValueError),
    ("random_blocks(density=2)", ValueError), ("dilated(segment_lengths=(8,16), dilation_rates=(1,))", ValueError),
    ("1 + 2", ValueError), ("", TypeError), ("union(3)", ValueError),
])
def test_bad_specs_raise_naming_the_problem(spec, err):
    with pytest.raises(err):
        from_spec(spec)


def test_large_block_mask_builds_without_n_squared_memory():
    n = 1 << 18  # 262,144 tokens: a dense bool mask would be 64 GiB
    bm = local_window(256).block_mask(1, 1, n, 128)
    assert int((bm.kv_num_blocks + bm.full_kv_num_blocks).max()) == 5 and bm.kv_indices.numel() * 4 <= 64 << 20


def test_pattern_pictures_figure_and_png(tmp_path):
    import zlib

    from dilcompile.patterns.plot import pattern_figure, pattern_grid, write_png

    pat = dilated((32, 64), (1, 2))
    grid, level = pattern_grid(pat, 200, num_heads=4, head=3, causal=True)
    assert level == "token" and torch.equal(grid.bool(), causal(pat).with_heads(4).dense_mask(4, 200)[3])
    grid, level = pattern_grid(local_window(600), 4096, block_size=256)
    assert level == "block" and grid.shape == (16, 16) and set(grid.unique().tolist()) == {0, 1, 2}
    fig = pattern_figure(local_window(100), 4096, block_size=256)
    assert fig.data[0].z.shape == (16, 16)
    path = write_png(tmp_path / "p.png", local_window(3), 20, scale=2)
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    raw = zlib.decompress(data[data.index(b"IDAT") + 4:-16])
    assert len(raw) == 40 * (1 + 40 * 3)
