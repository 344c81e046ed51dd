"""Decode by gathered index sets (``dilcompile.decode_gather``): one query's keys read straight out of a
cache, one softmax. The index sets against the geometry (every branch's keys, counted with
multiplicity) and the attention against the float64 reference, on random configurations: segments
(longer and shorter than the keys), rates, both modes, head counts not a multiple of the rates,
positions, pads anywhere, causal and not."""

import math

import pytest
import torch

from dilcompile.decode_gather import attend_gathered, attend_weighted
from dilcompile.dilated.decode_gather import decode_keys, key_weights
from dilcompile.dilated.geometry import multiplicity, plan_parts
from dilcompile.dilated.suffix import suffix_reference


def _config(g):
    m = int(torch.randint(1, 4, (), generator=g))
    segments = tuple(int(x) for x in torch.randint(1, 40, (m,), generator=g))
    rates = tuple(min(int(x), w) for x, w in zip(torch.randint(1, 5, (m,), generator=g), segments))
    mode = ("longnet", "groups")[int(torch.randint(2, (), generator=g))]
    heads = int(torch.randint(max(1, m if mode == "groups" else 1), 7, (), generator=g))
    return segments, rates, mode, heads


@pytest.mark.parametrize("seed", range(40))
def test_index_set_is_every_branch_key_with_multiplicity(seed):
    g = torch.Generator().manual_seed(seed)
    segments, rates, mode, heads = _config(g)
    slots = int(torch.randint(1, 90, (), generator=g))
    positions = torch.randint(0, slots, (3,), generator=g)
    keys, weight = decode_keys(positions, slots, heads, segments, rates, mode)
    assert keys.shape == weight.shape and keys.shape[:2] == (3, heads)
    assert bool(((keys >= 0) & (keys < slots)).all())
    parts = plan_parts(heads, segments, rates, mode)
    for b, p in enumerate(positions.tolist()):
        want = multiplicity(parts, heads, p + 1, causal=True)[:, p]  # (H, p + 1): the query's row
        got = torch.zeros(heads, slots, dtype=torch.int64).scatter_add(1, keys[b], weight[b])
        assert torch.equal(got[:, : p + 1], want) and not got[:, p + 1 :].any(), (b, p)


@pytest.mark.parametrize("seed", range(24))
@pytest.mark.parametrize("form", ["gathered", "weighted"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_gathered_decode_equals_the_float64_reference(seed, form, dtype):
    """Pads anywhere in the keys (the query's slot real), GQA heads read without a repeated copy; the
    index set gathered, or every slot read in place with its weight (the form of short caches). Float
    on the CPU sums products for the scores and the values by ``embedding_bag`` in both forms (the
    dense-kernel form of other devices is checked against it below), half precision writes the weighted
    softmax out: each against float64 on the same (rounded) inputs."""
    g = torch.Generator().manual_seed(100 + seed)
    segments, rates, mode, heads = _config(g)
    batch, slots, dim = int(torch.randint(1, 5, (), generator=g)), int(torch.randint(2, 80, (), generator=g)), 8
    divisors = [h for h in range(1, heads + 1) if heads % h == 0]
    kv_heads = divisors[int(torch.randint(len(divisors), (), generator=g))]
    causal = bool(seed % 2)
    q = torch.randn(batch, heads, 1, dim, generator=g, dtype=torch.float64)
    k, v = (torch.randn(batch, kv_heads, slots, dim, generator=g, dtype=torch.float64) for _ in range(2))
    pads = torch.rand(batch, slots, generator=g) < 0.3
    pads[:, -1] = False  # the query's own slot
    scale = dim**-0.5
    real = ~pads
    position = real.sum(1) - 1
    q, k, v = (t.to(dtype).double() for t in (q, k, v))  # the reference sees the inputs the kernel sees
    if form == "gathered":  # a slot outside the index set is never read: NaN in the pads reaches nothing
        k[pads[:, None].expand(-1, kv_heads, -1)] = v[pads[:, None].expand(-1, kv_heads, -1)] = float("nan")
        keys, weight = decode_keys(position, slots, heads, segments, rates, mode)
        index = torch.stack([real[b].nonzero()[:, 0][keys[b].clamp(max=int(real[b].sum()) - 1)]
                             for b in range(batch)])  # the slot of each key position
        out = attend_gathered(q.to(dtype), k.to(dtype), v.to(dtype), index, weight, scale)
    else:
        ranks = torch.where(real, real.cumsum(1) - 1, -1)[:, None, :]  # each slot's position, −1 for a pad
        weight = key_weights(position, ranks, heads, segments, rates, mode)
        out = attend_weighted(q.to(dtype), k.to(dtype), v.to(dtype), weight, scale)
    out = out.double()
    if mode == "groups":
        out = out / len(segments)
    groups = heads // kv_heads
    kk, vv = (t.repeat_interleave(groups, 1) for t in (k, v))
    # Padding is absence: each row is its real keys alone, the query the last of them.
    want = torch.cat([suffix_reference(q[b : b + 1], kk[b : b + 1, :, real[b]], vv[b : b + 1, :, real[b]], segments,
                                       rates, mode, causal, scale, None)[0] for b in range(batch)])
    if mode == "groups":
        want = want / len(segments)
    # float32: its rounding of the sums; bfloat16: its rounding of the output and weights
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(out, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("seed", range(6))
def test_the_dense_kernel_form_equals_the_cpu_form(seed):
    """Float off the CPU runs sdpa's kernel with log w added to each score (``_dense_kernel``), on the
    CPU the products and ``embedding_bag``: the same weighted softmax, GQA heads, multiplicities 0-3,
    a (row, head) with no key at all (0)."""
    from dilcompile import decode_gather

    g = torch.Generator().manual_seed(200 + seed)
    batch, kv_heads, groups, slots, dim = 2, 2, 1 + seed % 3, 5 + 7 * seed, 8
    q = torch.randn(batch, kv_heads * groups, 1, dim, generator=g, dtype=torch.float64)
    k, v = (torch.randn(batch, kv_heads, slots, dim, generator=g, dtype=torch.float64) for _ in range(2))
    weight = torch.randint(0, 4, (batch, kv_heads * groups, slots), generator=g)
    weight[0, 0] = 0
    want = decode_gather._dense_kernel(q, k, v, weight, 0.3)
    torch.testing.assert_close(attend_weighted(q, k, v, weight, 0.3), want, rtol=1e-12, atol=1e-12)
    assert not want[0, 0].any()


def test_a_dense_config_gathers_the_whole_row_once():
    """One segment covering the cache, rate 1: the window form, every key once — sdpa's attention."""
    keys, weight = decode_keys(torch.tensor([5, 0]), 8, 2, (16,), (1,), "longnet")
    assert keys.shape == (2, 2, 8)
    assert weight[0].sum(-1).tolist() == [6, 6] and weight[1].sum(-1).tolist() == [1, 1]


def test_long_segments_against_the_rates_take_the_branch_form():
    """At a long cache the per-branch lists (Σ ⌈w / r⌉) are shorter than one window of the longest segment."""
    keys, _ = decode_keys(torch.tensor([5000]), 1 << 14, 4, (1024, 2048, 4096), (1, 2, 4), "longnet")
    assert keys.shape[-1] == 3 * 1024 < 4096
    keys, _ = decode_keys(torch.tensor([1000]), 1056, 4, (1024, 2048, 4096), (1, 2, 4), "longnet")
    assert keys.shape[-1] == 1056 < 1024 + math.ceil(1056 / 2) + math.ceil(1056 / 4)


SPECS = ("local_window(window=5)", "global_local(window=3, global_tokens=2)",
         "dilated(segment_lengths=(8, 16), dilation_rates=(1, 2))",
         "union(global_local(window=3, global_tokens=2), dilated(segment_lengths=(8,), dilation_rates=(2,)))",
         "random_blocks(density=0.4, block_size=4, seed=3)", "hierarchical(levels=((1, 4), (4, 8)))",
         "hilbert(height=4, width=8, radius=1)")


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("causal", [True, False])
def test_block_sparse_index_set_is_the_query_row_of_the_mask(spec, causal):
    """Every key the pattern allows the query (keys after it do not exist), once; block sizes that do
    and do not divide the cache; the blocks fit the pattern's own block-list bound."""
    from dilcompile.block_sparse.decode_gather import decode_keys as block_keys
    from dilcompile.patterns.spec import from_spec

    pattern = from_spec(spec)
    g = torch.Generator().manual_seed(len(spec) + causal)
    for slots, block_size, heads in ((32, 4, 3), (29, 8, 4), (32, 64, 2)):
        if pattern.name == "hilbert" and slots != 32:
            continue  # a Hilbert grid is for its own N = height · width only
        positions = torch.randint(0, slots, (4,), generator=g)
        keys, weight = block_keys(positions, slots, heads, pattern, causal, min(block_size, slots))
        assert keys.shape[1] in (1, heads) and bool(((keys >= 0) & (keys < slots)).all())
        mask = pattern.dense_mask(heads, slots)  # (H, S, S)
        for b, p in enumerate(positions.tolist()):
            got = torch.zeros(keys.shape[1], slots, dtype=torch.int64).scatter_add(1, keys[b], weight[b])
            want = mask[:, p].clone()
            want[:, p + 1 :] = False
            assert torch.equal(got.expand(heads, -1), want.long()), (slots, block_size, p)


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.startswith("hilbert")])  # Hilbert: one N only
def test_block_sparse_index_set_traced_for_any_cache_length_is_the_same_keys(spec):
    """A second cache length makes Dynamo trace for any length (automatic dynamic shapes, as a static
    cache's second size does): the block count is then the pattern's at the model's longest sequence.
    The same keys as eager at each length; K that count's blocks at most (a local pattern still reads a
    few blocks); the third length runs the second graph."""
    from torch._dynamo.testing import CompileCounter

    from dilcompile.block_sparse.decode_gather import block_bound
    from dilcompile.block_sparse.decode_gather import decode_keys as block_keys
    from dilcompile.patterns.spec import from_spec

    pattern, heads, block_size, longest = from_spec(spec), 2, 4, 96
    counter = CompileCounter()
    torch._dynamo.reset()
    traced = torch.compile(lambda p, cache: block_keys(p, cache.shape[0], heads, pattern, True, block_size,
                                                       longest=longest), backend=counter, fullgraph=True)
    g = torch.Generator().manual_seed(len(spec))
    for slots, counted_at in ((40, 40), (57, longest), (96, longest)):
        positions = torch.randint(0, slots, (3,), generator=g)
        keys, weight = traced(positions, torch.empty(slots))
        bound = block_bound(pattern._structure, pattern._number_values, True, heads, counted_at, block_size)
        assert keys.shape[-1] == min(bound, -(-slots // block_size)) * block_size, slots
        want_keys, want_weight = block_keys(positions, slots, heads, pattern, True, block_size)
        for b in range(3):
            got = torch.zeros(keys.shape[1], slots, dtype=torch.int64).scatter_add(1, keys[b], weight[b])
            want = torch.zeros(want_keys.shape[1], slots, dtype=torch.int64).scatter_add(1, want_keys[b],
                                                                                        want_weight[b])
            assert torch.equal(got.expand(heads, -1), want.expand(heads, -1)), (slots, b)
    assert counter.frame_count == 2
    torch._dynamo.reset()


def test_a_pattern_built_while_tracing_is_not_handed_to_a_later_eager_call():
    """Dynamo calls decode's block bound while it traces, and the bound rebuilds the pattern from its
    template there, without op arguments. Cached, that pattern reached the next eager call of the same
    pattern ("was built inside torch.compile"): a compiled decode step broke eager calls after it."""
    from dilcompile.block_sparse.decode_gather import block_bound
    from dilcompile.patterns import local_window
    from dilcompile.patterns.spec import from_template, template

    structure, numbers = template(local_window(window=13))
    numbers = tuple(numbers)  # numbers no other test builds
    torch._dynamo.reset()
    torch.compile(lambda x: x + block_bound(structure, numbers, True, 2, 64, 4), backend="eager",
                  fullgraph=True)(torch.zeros(2))
    assert from_template(structure, numbers)._structure == structure
    torch._dynamo.reset()
