"""Patterns: analytic block lists against the block mask derived from the
dense mask, exact nnz, spec round-trip, Hilbert permutation, bad input."""

import importlib
import itertools

import pytest
import torch

from dilcompile.patterns import (
    PATTERNS, causal, dilated, from_spec, global_local, hierarchical, hilbert, intersection, local_window,
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
    assert set(PATTERNS) >= {"local_window", "dilated", "global_local", "random_blocks", "hierarchical",
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


# -- candidate blocks (patterns with no band: random tiles, 2-D neighbourhoods) -----------------

CANDIDATES = [  # (pattern, n, block size): tiles that match the blocks or not, odd N, grids not a power of 2
    (random_blocks(0.2, 16, 3), 1000, 16),
    (random_blocks(0.3, 24, 1), 997, 16),
    (random_blocks(0.02, 5, 2), 203, 16),
    (hilbert(32, 32, 1), 1024, 16),
    (hilbert(20, 50, 2), 1000, 16),
    (hilbert(13, 31, 0), 403, 8),
    (union(local_window(20), random_blocks(0.05, 16)), 1000, 16),
    (union(global_local(8, 3), hilbert(25, 40, 1)), 1000, 16),
    (intersection(random_blocks(0.4, 32, 5), local_window(200)), 777, 16),
    (causal(random_blocks(0.3, 16, 4)), 500, 16),
    (causal(union(local_window(9), hilbert(19, 21, 1))), 399, 16),
]


@pytest.fixture(params=[0, 8], ids=["enumerate-boxes", "box-test"])
def box_factor(request, monkeypatch):
    """hilbert's two candidate paths: enumerate every grown box (0), or the
    default rule, which at these small N mostly tests boxes per block."""
    monkeypatch.setattr(importlib.import_module("dilcompile.patterns.hilbert"), "_BOX_TEST_FACTOR", request.param)
    return request.param


@pytest.mark.parametrize("pattern, n, bs", CANDIDATES, ids=lambda p: repr(p)[:40] if not isinstance(p, int) else None)
def test_candidate_blocks_cover_every_allowed_block_and_prune(pattern, n, bs, box_factor):
    assert pattern.has_candidates
    nb = -(-n // bs)
    want_any, want_full = _dense_block_state(pattern.dense_mask(1, n), n, bs)
    for transpose in (False, True):
        w_any, w_full = (x[0].T for x in (want_any, want_full)) if transpose else (want_any[0], want_full[0])
        cand = pattern.candidate_blocks(torch.arange(nb), bs, n, transpose)
        assert cand.shape == (nb, nb) and cand.dtype == torch.bool
        assert (cand >= w_any).all(), "a block with an allowed pair is not a candidate"
        assert cand.sum() < 0.75 * nb * nb, "candidates should prune most block pairs"
        got_any, got_full = _listed(pattern.block_lists(1, n, bs, transpose=transpose), nb)
        assert (got_any[0] >= w_any).all() and (got_full[0] <= w_full).all()
        assert (got_any[0] <= cand).all()


@pytest.mark.parametrize("pattern, n, bs", [CANDIDATES[i] for i in (0, 1, 2, 6, 9)], ids=lambda p: repr(p)[:40]
                         if not isinstance(p, int) else None)
def test_random_block_candidates_are_exact(pattern, n, bs):
    """random_blocks' candidates are its exact any: every listed block holds an allowed pair."""
    nb = -(-n // bs)
    want_any, want_full = _dense_block_state(pattern.dense_mask(1, n), n, bs)
    for transpose in (False, True):
        got_any, got_full = _listed(pattern.block_lists(1, n, bs, transpose=transpose), nb)
        w_any, w_full = (x.transpose(1, 2) for x in (want_any, want_full)) if transpose else (want_any, want_full)
        assert torch.equal(got_any, w_any)
        if pattern.name != "union":  # union's full is sound only (a block full by mixing rules reads partial)
            assert torch.equal(got_full, w_full)


@pytest.mark.parametrize("pattern, n, bs", [CANDIDATES[i] for i in (3, 4, 5, 7)], ids=lambda p: repr(p)[:40]
                         if not isinstance(p, int) else None)
def test_candidates_list_a_subset_of_the_all_pairs_build_with_the_same_full_blocks(pattern, n, bs, monkeypatch,
                                                                                    box_factor):
    """Against the build that tests every block pair: candidates only drop
    blocks (never a full one), and each dropped block has no allowed pair."""
    nb = -(-n // bs)
    want_any, _ = _dense_block_state(pattern.dense_mask(1, n), n, bs)
    fast = pattern.block_lists(1, n, bs)
    monkeypatch.setattr(type(pattern), "has_candidates", False)
    for p in getattr(pattern, "patterns", ()):
        monkeypatch.setattr(type(p), "has_candidates", False)
    slow = pattern.block_lists(1, n, bs)
    fast_any, fast_full = _listed(fast, nb)
    slow_any, slow_full = _listed(slow, nb)
    assert torch.equal(fast_full, slow_full)
    assert (fast_any <= slow_any).all() and (fast_any >= want_any).all()


def test_candidate_builds_do_not_depend_on_chunking(monkeypatch):
    from dilcompile.patterns import blocks

    rb_module = importlib.import_module("dilcompile.patterns.random_blocks")  # the package rebinds the name
    pats = [union(local_window(30), random_blocks(0.1, 32, 9)), hilbert(30, 41, 2), causal(random_blocks(0.2, 8))]
    n, bs = 1230, 16
    nb = -(-n // bs)  # 77
    want = [[p.block_lists(2, n, bs, transpose=t, partial_only=t) for t in (False, True)] for p in pats]
    want_q = [p.block_mask(1, 2, n, bs) for p in pats]
    monkeypatch.setattr(blocks, "CHUNK_ELEMENTS", 4 * nb)  # 4 rows per chunk, one in the last
    monkeypatch.setattr(rb_module, "_HASH_PIECE", 100)
    for p, lists in zip(pats, want):
        for t, w in zip((False, True), lists):
            got = p.block_lists(2, n, bs, transpose=t, partial_only=t)
            assert torch.equal(got.num, w.num) and torch.equal(got.full_num, w.full_num)
            assert all(torch.equal(a, b) for a, b in zip(_listed(got, nb), _listed(w, nb)))
    for p, w in zip(pats, want_q):  # the transposition runs in row chunks too
        got = p.block_mask(1, 2, n, bs)  # (index lists are padded to nb wide only below _CHUNK_ELEMENTS)
        for kind in ("", "full_"):
            num, idx = getattr(got, f"{kind}q_num_blocks")[0], getattr(got, f"{kind}q_indices")[0]
            w_num, w_idx = getattr(w, f"{kind}q_num_blocks")[0], getattr(w, f"{kind}q_indices")[0]
            assert torch.equal(num, w_num) and torch.equal(_sets(num, idx, nb), _sets(w_num, w_idx, nb)), kind


def test_tile_hits_equal_tile_hash():
    from dilcompile.patterns.random_blocks import tile_hash, tile_hits

    g = torch.Generator().manual_seed(0)
    i = torch.randint(0, 1 << 40, (300, 1), generator=g)
    j = torch.randint(0, 1 << 40, (1, 200), generator=g)
    for seed, threshold in ((0, 1 << 30), (12345, 7), (2 ** 33 + 1, (1 << 31) - 5), (3, 0), (4, 1 << 31)):
        assert torch.equal(tile_hits(i, j, seed, threshold), tile_hash(i, j, seed) < threshold)


def test_hilbert_block_state_of_a_short_last_block_alone():
    """A chunk may hold only the last (short) block paired with itself; its size
    is then not the block size, and its box must still be its own cells'."""
    for pat, n, bs in ((hilbert(13, 31, 0), 403, 8), (hilbert(6, 11, 1), 66, 16), (hilbert(5, 5, 3), 25, 7)):
        lo, hi = torch.tensor([(n - 1) // bs * bs]), torch.tensor([n - 1])
        mask = pat.dense_mask(1, n)[0, lo:, lo:]
        anyb, full = pat.block_state(torch.zeros(1, 1, dtype=torch.long), lo, hi, lo, hi, n)
        assert bool(anyb.all()) == bool(mask.any())
        assert not bool(full.any()) or bool(mask.all())
        assert bool(full.all()) == bool(mask.all())  # boxes of a handful of cells: exact here


def _sets(num, idx, nb):
    """(H, R) counts and (H, R, K) ids → (H, R, nb) bool."""
    out = torch.zeros(*num.shape, nb, dtype=torch.bool)
    for row in itertools.product(*map(range, num.shape)):
        out[row][idx[row][: num[row]].long()] = True
    return out


@pytest.mark.parametrize("pattern, causal_, exact", [
    (random_blocks(0.2, 16, 3), False, True),
    (dilated((32, 64), (1, 2)), True, True),
    (union(local_window(20), hilbert(25, 40, 1)), False, False),
    (global_local(8, 3), True, True),
], ids=["random_blocks", "causal-dilated", "union-hilbert", "causal-global_local"])
def test_block_mask_q_lists_are_its_kv_lists_transposed(pattern, causal_, exact):
    """FlexAttention's backward reads the q lists: the same blocks as the kv
    lists (as create_block_mask makes them), partial and full apart."""
    n, bs, heads = 1000, 16, 4
    nb = -(-n // bs)
    bm = pattern.block_mask(1, heads, n, bs, causal=causal_)
    for kind in ("", "full_"):
        kv = _sets(getattr(bm, f"{kind}kv_num_blocks")[0], getattr(bm, f"{kind}kv_indices")[0], nb)
        q = _sets(getattr(bm, f"{kind}q_num_blocks")[0], getattr(bm, f"{kind}q_indices")[0], nb)
        assert torch.equal(q, kv.transpose(1, 2)), kind
        idx = getattr(bm, f"{kind}q_indices")[0]
        num = getattr(bm, f"{kind}q_num_blocks")[0]
        listed = torch.arange(idx.shape[-1]) < num[..., None]
        assert (idx[..., 1:] > idx[..., :-1])[listed[..., 1:]].all(), "q lists must be ascending"
    if exact:  # exact any: the same lists as building the transposed orientation on its own
        bound = (causal(pattern) if causal_ else pattern).with_heads(heads)
        alone = bound.block_lists(heads, n, bs, transpose=True, partial_only=True)
        want = _sets(alone.num, alone.indices, nb).expand(heads, nb, nb)
        assert torch.equal(_sets(bm.q_num_blocks[0], bm.q_indices[0], nb), want)


@pytest.mark.parametrize("n", [200, 333])
def test_candidate_build_of_a_head_dependent_union_matches_dense_mask(n):
    pat = union(dilated((32, 64), (1, 2)), random_blocks(0.1, 16, 4))
    heads, bs = 3, 16
    bound = pat.with_heads(heads)
    assert bound.has_candidates and bound.head_dependent
    want_any, want_full = _dense_block_state(bound.dense_mask(heads, n), n, bs)
    for transpose in (False, True):
        got_any, got_full = _listed(bound.block_lists(heads, n, bs, transpose=transpose), -(-n // bs))
        w_any, w_full = (x.transpose(1, 2) for x in (want_any, want_full)) if transpose else (want_any, want_full)
        assert torch.equal(got_any, w_any)  # both anys are exact, so the union's is
        assert (got_full <= w_full).all()
    bm = pat.block_mask(1, heads, n, bs, causal=True)
    assert torch.equal(bm.to_dense()[0].bool(), _dense_block_state(causal(bound).dense_mask(heads, n), n, bs)[0])


def _hilbert_d2xy(order: int, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell (x, y) of curve index d on a 2^order square: the classic
    rotate-and-flip walk up from the bottom level, the test's independent oracle."""
    x = torch.zeros_like(d)
    y = torch.zeros_like(d)
    t = d.clone()
    s = 1
    while s < (1 << order):
        rx = 1 & (t // 2)
        ry = 1 & (t ^ rx)
        flip = (ry == 0) & (rx == 1)
        x, y = torch.where(flip, s - 1 - x, x), torch.where(flip, s - 1 - y, y)
        swap = ry == 0
        x, y = torch.where(swap, y, x), torch.where(swap, x, y)
        x, y = x + s * rx, y + s * ry
        t = t // 4
        s *= 2
    return x, y


def test_hilbert_curve_by_sorting_cells_equals_walking_the_square():
    from dilcompile.patterns.hilbert import _curve, hilbert_xy2d

    for order in range(1, 7):
        d = torch.arange(1 << (2 * order))
        assert torch.equal(hilbert_xy2d(order, *_hilbert_d2xy(order, d)), d), order
    for height, width in ((1, 1), (6, 11), (13, 31), (64, 64), (100, 163), (1, 37), (40, 3)):
        order = max(1, (max(height, width) - 1).bit_length())
        x, y = _hilbert_d2xy(order, torch.arange(1 << (2 * order)))
        keep = (x < width) & (y < height)
        ys, xs = _curve(height, width)
        assert torch.equal(ys, y[keep]) and torch.equal(xs, x[keep]), (height, width)


@pytest.mark.parametrize("pattern", [dilated((8, 32, 20), (1, 4, 3)), causal(dilated((8, 32), (1, 4))),
                                     union(dilated((16, 48), (2, 3)), causal(dilated((24,), (4,))))])
def test_attended_keys_closed_form_equals_any_query_of_mask_mod(pattern):
    """``attended_keys`` (the gather plan's per-key shortcut) against mask_mod
    over every query of random intervals, odd N, every head; patterns with no
    closed form say None."""
    heads, n = 4, 97
    bound = pattern.with_heads(heads)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, n, (2, 200), generator=gen)
    q_lo, q_hi = torch.minimum(a, b)[:, None], torch.maximum(a, b)[:, None]  # (R, 1)
    q_hi[::7] = q_lo[::7] - 1  # some empty intervals
    h = torch.randint(0, heads, (200, 1), generator=gen)
    kv = torch.arange(n)[None, :]  # (1, N)
    got = bound.attended_keys(h, q_lo, q_hi, kv)
    q = torch.arange(n)[None, :, None]  # (1, N, 1): every query, then kept in each interval
    inside = (q >= q_lo[:, :, None]) & (q <= q_hi[:, :, None])
    want = (bound.mask_mod(torch.zeros(()), h[:, :, None], q, kv[:, None]) & inside).any(1)
    assert got is not None and torch.equal(got, want)
    assert union(local_window(3), bound).attended_keys(h, q_lo, q_hi, kv) is None


def test_hilbert_reference_refuses_the_wrong_length_as_gather_does():
    from dilcompile import block_sparse_attention
    from dilcompile.patterns import hilbert

    q = torch.randn(1, 2, 16, 8)
    for impl in ("gather", "reference"):  # reference answered for N=16 with a 3×3 grid's curve, clamped
        with pytest.raises(ValueError, match="hilbert pattern is for N"):
            block_sparse_attention(q, q, q, hilbert(3, 3, 1), impl=impl)


@pytest.mark.parametrize("pattern", [
    hierarchical(((1, 2), (153092023, 60247241208))),  # 153092023 · 60247241209 = 2**63 − 1: hi + reach wrapped
    hierarchical(((2**40, 2**40),)),  # OverflowError: int too big to convert
    union(hierarchical(((2**40, 2**40),)), local_window(3)),
], ids=["wraps", "overflows", "in-union"])
def test_hierarchical_levels_whose_reach_passes_int64(pattern):
    """Levels in the documented range (sizes ≤ 2**40) whose stride·(window + 1) passes 2**63: the block lists
    dropped blocks (gather off by 2.8, nnz 138 of 375) or raised; the reach is capped at N."""
    from dilcompile import block_sparse_attention
    from dilcompile.testing import random_qkv

    q, k, v = random_qkv(1, 1, 64, 8, seed=0)
    want = block_sparse_attention(q, k, v, pattern, impl="reference", block_size=16)
    got = block_sparse_attention(q, k, v, pattern, impl="gather", block_size=16)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert pattern.nnz(1, 64, block_size=16) == int(pattern.dense_mask(1, 64).sum())
