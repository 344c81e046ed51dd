"""block_sparse_attention against masked SDPA in float64 (outputs and
gradients), empty rows, low precision, compile contract, adaptive, flex."""

import pytest
import torch
from torch._dynamo.utils import counters

from dilcompile import BlockSparseAttention, block_sparse_attention
from dilcompile.patterns import (adaptive, dilated, global_local, hierarchical, hilbert, local_window, random_blocks,
                                 union)
from dilcompile.testing import (assert_forward_and_gradients_within_budget, assert_within_low_precision_budget,
                                random_qkv)
from helpers import PATTERNS


def _sdpa_masked(q, k, v, pattern, causal):
    """F.scaled_dot_product_attention with the dense mask (float64), empty rows → 0."""
    from dilcompile.patterns import causal as causal_of

    h, n = q.shape[1], q.shape[2]
    mask = (causal_of(pattern) if causal else pattern).with_heads(h).dense_mask(h, n).to(q.device)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return torch.where(mask.any(-1, keepdim=True), out, 0.0)


def _run_plan(q, k, v, plan):
    """The gather backend's output on ``plan`` (built with non-default PlanOptions),
    differentiable: the eager path that ``block_sparse_attention`` takes."""
    from dilcompile.block_sparse.ops import _Gather

    return _Gather.apply(q, k, v, plan, q.shape[-1] ** -0.5)


@pytest.mark.parametrize("name", ["local_window", "global_local", "hierarchical", "union"])
def test_run_plan_is_the_public_path_at_default_options(name):
    """``_run_plan`` (which the option tests use) on a default-options plan gives
    exactly what ``block_sparse_attention(impl="gather")`` gives, outputs and
    gradients: the option tests exercise the public path's code."""
    from dilcompile.block_sparse.impl.plan import PlanOptions, make_plan

    n, h = 1000, 2
    pattern = PATTERNS[name](n)
    q, k, v = random_qkv(1, h, n, 16, requires_grad=True, seed=3)
    public = block_sparse_attention(q, k, v, pattern, impl="gather", block_size=64)
    plan = make_plan(pattern.with_heads(h), h, n, 64, torch.device("cpu"), PlanOptions())
    mine = _run_plan(q, k, v, plan)
    assert torch.equal(public, mine)
    g = torch.randn_like(public)
    for a, b in zip(torch.autograd.grad(public, (q, k, v), g), torch.autograd.grad(mine, (q, k, v), g)):
        assert torch.equal(a, b)


def _band(c):
    from dilcompile.block_sparse.impl.plan import BandCall

    return isinstance(c, BandCall)


def _sub_rows(c, block_size):
    """A band call split into sub-rows (rows of fewer queries than a block)."""
    return _band(c) and c.unit < block_size


def _tokens(c):
    from dilcompile.block_sparse.impl.plan import TokenCall

    return isinstance(c, TokenCall)


def _assert_matches_with_grads(out, ref, q, k, v):
    """Output and dq, dk, dv equal the float64 reference (no NaN)."""
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(out)
    got = torch.autograd.grad((out * grad).sum(), (q, k, v))
    want = torch.autograd.grad((ref * grad).sum(), (q, k, v))
    for name, g, w in zip("qkv", got, want):
        assert not g.isnan().any()
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, msg=f"d{name}")


@pytest.mark.parametrize("n", [100, 128, 1000])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(PATTERNS))
def test_gather_matches_masked_sdpa_float64_with_gradients(name, causal, n, device):
    pattern = PATTERNS[name](n)
    q, k, v = random_qkv(2 if n < 500 else 1, 3, n, 8, device=device, requires_grad=True)
    out = block_sparse_attention(q, k, v, pattern, causal=causal, block_size=16 if n < 500 else 64)
    ref = _sdpa_masked(q, k, v, pattern, causal)
    _assert_matches_with_grads(out, ref, q, k, v)


def test_rows_with_no_key_output_zero_and_finite_gradients():
    pattern = random_blocks(0.15, 16, 5)
    q, k, v = random_qkv(1, 2, 100, 8, requires_grad=True)
    mask = pattern.dense_mask(2, 100)
    empty = ~mask.any(-1)
    assert empty.any() and not empty.all()
    out = block_sparse_attention(q, k, v, pattern, block_size=16)
    assert (out[0][empty] == 0).all() and not out.isnan().any()
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(g.isfinite().all() for g in grads)
    assert (grads[0][0][empty] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pattern", [union(local_window(20), random_blocks(0.2, 32, 0)), dilated((32, 128), (1, 4)),
                                     hierarchical(((1, 8), (8, 4)))], ids=["union", "dilated", "hierarchical"])
def test_low_precision_within_twice_plain_pytorch_error(dtype, pattern, device):
    """Band, whole-block and token calls (per head, query-compressed) in low precision."""
    from dilcompile.patterns import causal as causal_of

    q, k, v = random_qkv(1, 4, 300, 32, dtype=dtype, device=device)
    mask = causal_of(pattern).dense_mask(4, 300).to(device)
    out = block_sparse_attention(q, k, v, pattern, causal=True, block_size=32)
    ref = _sdpa_masked(q.double(), k.double(), v.double(), pattern, True)
    s = (q @ k.transpose(-1, -2)) * 32 ** -0.5
    plain = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0) @ v
    assert_within_low_precision_budget(out, plain, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["global_local", "dilated"])
def test_low_precision_stacked_rows_and_sub_rows(dtype, name):
    """Stacked rows (shared keys), sub-rows and single-row windows in low
    precision, batch 2: within the 2× rule of plain PyTorch's error."""
    from dilcompile.block_sparse.impl.plan import PlanOptions, make_plan

    options = PlanOptions(min_sub_rows=8, chunk_elements=1 << 16)
    pattern = global_local(56, 20) if name == "global_local" else dilated((128, 256), (1, 2))
    bound = pattern.with_heads(4)
    plan = make_plan(bound, 4, 1000, 32, torch.device("cpu"), options)
    calls = plan.calls
    assert any(c.shared and c.rows.numel() > 1 for c in calls)
    assert any(_sub_rows(c, 32) for c in calls) == (name == "global_local")
    q, k, v = random_qkv(2, 4, 1000, 32, dtype=dtype)
    out = _run_plan(q, k, v, plan)
    mask = bound.dense_mask(4, 1000)
    ref = _sdpa_masked(q.double(), k.double(), v.double(), pattern, False)
    s = (q @ k.transpose(-1, -2)) * 32 ** -0.5
    plain = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0) @ v
    assert_within_low_precision_budget(out, plain, ref)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def test_compiled_fullgraph_and_parameter_change_does_not_recompile(fresh_dynamo):
    fn = torch.compile(lambda q, k, v, p: block_sparse_attention(q, k, v, p, causal=True, block_size=16),
                       fullgraph=True)
    q, k, v = random_qkv(1, 2, 100, 8, dtype=torch.float32, requires_grad=True)
    for window in (5, 9, 13):
        pattern = local_window(window)
        out = fn(q, k, v, pattern)
        want = block_sparse_attention(q, k, v, pattern, causal=True, block_size=16)
        torch.testing.assert_close(out, want)
        got_g = torch.autograd.grad(out.sum(), (q, k, v))
        want_g = torch.autograd.grad(want.sum(), (q, k, v))
        for g, w in zip(got_g, want_g):
            torch.testing.assert_close(g, w)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"]


def test_spec_string_inside_fullgraph_after_one_eager_parse(fresh_dynamo):
    # ast cannot be traced: a spec parsed once outside is looked up; a new one is refused, saying what to do
    spec = "union(local_window(window=7), dilated(segment_lengths=(32,64), dilation_rates=(1,2)))"
    fn = torch.compile(lambda q, k, v: block_sparse_attention(q, k, v, spec, causal=True, block_size=16),
                       fullgraph=True)
    q, k, v = random_qkv(1, 2, 90, 8, dtype=torch.float32)
    import dilcompile.patterns.spec as spec_module

    spec_module._PARSED.pop(spec, None)
    with pytest.raises(Exception, match="parse it outside first"):
        fn(q, k, v)
    torch._dynamo.reset()
    want = block_sparse_attention(q, k, v, spec, causal=True, block_size=16)  # parses it
    torch.testing.assert_close(fn(q, k, v), want)
    assert not counters["graph_break"]


def test_module_and_custom_op_opcheck(fresh_dynamo):
    module = BlockSparseAttention("random_blocks(density=0.3, block_size=16)", block_size=16)
    q, k, v = random_qkv(1, 2, 70, 8, dtype=torch.float32, requires_grad=True)
    compiled = torch.compile(module, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), module(q, k, v))
    pat = local_window(5)
    args = (q, k, v, pat._structure, pat._numbers, True, 0.3, 16)
    torch.library.opcheck(torch.ops.dilcompile.block_sparse_fwd.default, args)


def test_adaptive_exact_on_chosen_blocks_trains_and_is_deterministic_in_eval():
    torch.manual_seed(0)
    pat = adaptive(head_dim=8, block_size=16, top_k=3, score_dim=4).double()
    q, k, v = random_qkv(2, 2, 100, 8, requires_grad=True)
    for causal in (False, True):
        out = block_sparse_attention(q, k, v, pat, causal=causal)
        ref = block_sparse_attention(q, k, v, pat, causal=causal, impl="reference")
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    out.square().sum().backward()
    assert pat.q_proj.weight.grad is not None and pat.q_proj.weight.grad.abs().sum() > 0
    pat.eval()
    with torch.no_grad():
        a = block_sparse_attention(q, k, v, pat, causal=True)
        b = block_sparse_attention(q, k, v, pat, causal=True)
    assert torch.equal(a, b)


def test_modules_built_from_one_adaptive_spec_train_scorers_of_their_own():
    """An "adaptive(...)" spec string names a pattern with parameters: each module gets its own
    scorer (the parse cache hands back one shared nn.Module, which tied them silently)."""
    from dilcompile import MultiheadBlockSparseAttention
    from dilcompile.patterns import from_spec

    spec = "adaptive(head_dim=8, block_size=4, top_k=2, score_dim=4)"
    torch.manual_seed(0)
    a, b = BlockSparseAttention(spec, block_size=4), BlockSparseAttention(spec, block_size=4)
    mha = [MultiheadBlockSparseAttention(16, 2, spec, block_size=4) for _ in range(2)]
    scorers = [a.pattern, b.pattern, mha[0].pattern, mha[1].pattern, from_spec(spec)]
    assert len({id(p) for p in scorers}) == 5 and all(repr(p) == spec.replace(" ", "").replace(",", ", ")
                                                      for p in scorers)
    assert "pattern.q_proj.weight" in a.state_dict() and "pattern.q_proj.weight" in mha[0].state_dict()
    before = b.pattern.q_proj.weight.detach().clone()
    q, k, v = random_qkv(1, 2, 24, 8, requires_grad=True)
    torch.optim.SGD(a.parameters(), lr=1.0).zero_grad()
    a(q, k, v).square().sum().backward()
    assert a.pattern.q_proj.weight.grad.abs().sum() > 0 and b.pattern.q_proj.weight.grad is None
    torch.optim.SGD(a.parameters(), lr=1.0).step()
    assert torch.equal(b.pattern.q_proj.weight, before)  # training a leaves b's scorer alone
    x = torch.randn(1, 24, 16)
    mha[0](x)[0].square().sum().backward()
    assert mha[0].pattern.q_proj.weight.grad.abs().sum() > 0 and mha[1].pattern.q_proj.weight.grad is None


@pytest.mark.parametrize("kwargs, err", [
    (dict(pattern=3), TypeError), (dict(pattern="nope"), ValueError), (dict(impl="cuda"), ValueError),
    (dict(causal=1), TypeError), (dict(scale=-1.0), ValueError), (dict(block_size=0), ValueError),
])
def test_bad_input_raises(kwargs, err):
    q, k, v = random_qkv(1, 2, 10, 8)
    kw = dict(pattern=local_window(2)) | kwargs
    with pytest.raises(err):
        block_sparse_attention(q, k, v, **kw)
    with pytest.raises(ValueError):
        block_sparse_attention(q, k[:, :, :5], v, local_window(2))


def test_flex_cpu_inference_and_inside_compile_with_a_prepared_mask(fresh_dynamo):
    """FlexAttention on CPU: inference only, compiled; one compile of the module
    (the eager call compiles flex_attention itself)."""
    from dilcompile.block_sparse import cache

    cache.clear()
    pattern = dilated((16, 32), (1, 2))
    module = BlockSparseAttention(pattern, impl="flex", causal=True, block_size=64)
    q, k, v = random_qkv(1, 2, 100, 16, dtype=torch.float32)
    want = _sdpa_masked(q.double(), k.double(), v.double(), pattern, True)
    compiled = torch.compile(module, fullgraph=True)
    with torch.no_grad():
        with pytest.raises(Exception, match="prepare"):
            compiled(q, k, v)
        torch._dynamo.reset()
        module.prepare(1, 2, 100)
        torch.testing.assert_close(compiled(q, k, v).double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="inference-only"):
        block_sparse_attention(q.requires_grad_(), k, v, pattern, impl="flex")


def test_flex_serves_many_lengths_with_few_graphs():
    """Eager FlexAttention at 14 lengths, 1 to 2000 tokens, exact at each: its
    compiled function takes about four graphs per mask structure (a first
    length, dynamic lengths, one block, one token), never one per length —
    Dynamo's default budget of 8 graphs was spent by the ninth length."""
    from torch._dynamo.utils import counters

    pattern = global_local(16, 24)
    lengths = [300, 517, 129, 1000, 64, 777, 250, 901, 1, 333, 2000, 45, 17, 1201]
    before = counters["stats"]["unique_graphs"]
    for n in lengths:
        q, k, v = random_qkv(1, 2, n, 16, dtype=torch.float32, seed=n)
        with torch.no_grad():
            got = block_sparse_attention(q, k, v, pattern, causal=True, impl="flex", block_size=64)
        want = _sdpa_masked(q.double(), k.double(), v.double(), pattern, True)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] - before <= 4


def test_flex_patterns_of_one_kind_with_other_numbers_each_compile():
    """A pattern's numbers that changed between calls turned symbolic in the shared compiled function, and
    Inductor could not compile the mask (random_blocks' density and tile, hierarchical's levels)."""
    q, k, v = random_qkv(1, 2, 64, 16, dtype=torch.float32, seed=3)
    for pattern in (random_blocks(0.5, 32, 1), random_blocks(0.25, 32, 1), random_blocks(0.5, 16, 1),
                    hierarchical(((1, 4), (4, 2))), hierarchical(((1, 3), (8, 2)))):
        with torch.no_grad():
            got = block_sparse_attention(q, k, v, pattern, impl="flex", block_size=16)
        torch.testing.assert_close(got.double(), _sdpa_masked(q.double(), k.double(), v.double(), pattern, False),
                                   rtol=1e-5, atol=1e-5)


def test_reference_compiles_fullgraph_forward_and_backward(fresh_dynamo):
    """impl="reference" read its data while tracing (the non-finite sums of masked_matmul) and failed under
    fullgraph=True (graph breaks without it): it is one custom-op node each way now, exact as eager."""
    from torch._dynamo.utils import counters

    from dilcompile import MultiheadBlockSparseAttention

    pattern = global_local(3, 4)
    q, k, v = random_qkv(2, 2, 37, 8, requires_grad=True, seed=5)
    k.data[0, 1, 20] = float("nan")  # the data-dependent path, inside the op
    fn = torch.compile(lambda q, k, v: block_sparse_attention(q, k, v, pattern, causal=True, impl="reference"),
                       fullgraph=True)
    got, want = fn(q, k, v), block_sparse_attention(q, k, v, pattern, causal=True, impl="reference")
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    grad = torch.randn_like(want)
    for g, w in zip(torch.autograd.grad((got * grad).nan_to_num().sum(), (q, k, v)),
                    torch.autograd.grad((want * grad).nan_to_num().sum(), (q, k, v))):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    mha = MultiheadBlockSparseAttention(16, 2, "local_window(3)", impl="reference", block_size=8,
                                        dtype=torch.float64)
    x = torch.randn(2, 20, 16, dtype=torch.float64)
    torch.testing.assert_close(torch.compile(mha, fullgraph=True)(x)[0], mha(x)[0], rtol=1e-12, atol=1e-12)
    assert not counters["graph_break"]
    q, k, v = random_qkv(2, 2, 37, 8, requires_grad=True, seed=6)  # finite: opcheck compares without equal_nan
    mask = torch.rand(2, 1, 37, 37, generator=torch.Generator().manual_seed(0)) < 0.5
    torch.library.opcheck(torch.ops.dilcompile.masked_attention_reference.default, (q, k, v, mask, 0.3))
    torch.library.opcheck(torch.ops.dilcompile.masked_attention_reference_bwd.default,
                          (torch.randn_like(q), q.detach(), k.detach(), v.detach(), mask, 0.3))


def test_flex_hilbert_on_random_grids_equals_float64():
    """hilbert's mask_mod reads its curve tables: they were built inside FlexAttention's mask subgraph (Dynamo
    traced through lru_cache) and Inductor refused to lower it. Random grids, radii and block sizes, causal and
    not, against masked attention in float64."""
    gen = torch.Generator().manual_seed(22)
    for case in range(3):
        height, width, radius = (int(torch.randint(lo, hi, (), generator=gen)) for lo, hi in ((3, 17), (3, 17), (0, 4)))
        block = (16, 32, 64)[case]
        pattern, causal = hilbert(height, width, radius), case % 2 == 1
        q, k, v = random_qkv(1, 2, height * width, 16, dtype=torch.float32, seed=case)
        with torch.no_grad():
            got = block_sparse_attention(q, k, v, pattern, causal=causal, impl="flex", block_size=block)
        want = _sdpa_masked(q.double(), k.double(), v.double(), pattern, causal)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{pattern}: {m}")


def test_flex_cpu_counts_full_blocks_once():
    """A pattern with full blocks (band interior) and partial ones (edges, the
    global rows): FlexAttention gets full blocks only in its full lists."""
    pattern = global_local(40, 8)
    q, k, v = random_qkv(1, 2, 200, 16, dtype=torch.float32)
    want = _sdpa_masked(q.double(), k.double(), v.double(), pattern, False)
    with torch.no_grad():
        got = block_sparse_attention(q, k, v, pattern, impl="flex", block_size=32)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1000, 1025])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["local_window", "global_local"])
def test_banded_chunks_use_strided_keys_and_stay_exact(name, causal, n):
    """Rows listing blocks c + o + 0..K−1 run on an overlapping strided view of
    the key blocks (no gather); rows with more blocks (global tokens) add a
    gathered part merged by log-sum-exp; the band's mask is one row, broadcast.
    The sequence ends and non-contiguous inputs still match masked SDPA,
    outputs and gradients, also with the output left unfilled before the
    calls when they write every query."""
    from dilcompile.block_sparse.impl.plan import make_plan
    from dilcompile.patterns import causal as causal_of

    pattern = local_window(40) if name == "local_window" else global_local(40, 20)
    bound = (causal_of(pattern) if causal else pattern).with_heads(3)
    plan = make_plan(bound, 3, n, 32, torch.device("cpu"))
    assert sum(c.rows.numel() for c in plan.calls if _band(c)) >= plan.num_blocks - 4
    # every query is written by a call that does not merge: the output starts uninitialised (no fill)
    assert plan.writes_every_row == (not causal)  # causal: row 0 has one block, no band (a merging call)
    # A window band's token mask is the same for every row (away from the ends): one row, broadcast.
    masks = [plan.token_mask(c, torch.float64)[0] for c in plan.calls if _band(c) and c.masked]
    assert any(m.stride(1) == 0 for m in masks)
    if name == "global_local":  # the global key block of every row: gathered, merged into the band's result
        merged = torch.cat([c.rows for c in plan.calls if c.merge])
        assert merged.unique().numel() >= plan.num_blocks - 2 and all(not _band(c) for c in plan.calls if c.merge)
    q, k, v = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
               for t in random_qkv(1, 3, n, 8))
    out = block_sparse_attention(q, k, v, pattern, causal=causal, block_size=32)
    ref = _sdpa_masked(q, k, v, pattern, causal)
    _assert_matches_with_grads(out, ref, q, k, v)


@pytest.mark.parametrize("n", [1000, 1025])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["local_window", "global_local", "union", "per_head"])
def test_band_rows_split_into_sub_rows_with_narrower_windows(name, causal, n):
    """A sliding band's rows are halved while each half's allowed keys fit a
    narrower window sliding with it (down to min_sub_rows queries; 8 here so
    32-token blocks split twice); a single row's halves get a window each.
    (global_local: the global keys, the same for every row, run as one call
    on stacked rows.) The windows stay inside the band, so keys of
    the same rows held by other calls (random blocks next to the window) are
    not counted twice: exact, outputs and gradients."""
    from dilcompile.block_sparse.impl.plan import PlanOptions, make_plan
    from dilcompile.patterns import causal as causal_of

    pattern = {"local_window": local_window(56), "global_local": global_local(56, 20),
               "union": union(local_window(56), random_blocks(0.2, 32, 1)),
               "per_head": union(global_local(56, 20), dilated((64, 256), (1, 4)))}[name]
    bound = (causal_of(pattern) if causal else pattern).with_heads(3)
    plan = make_plan(bound, 3, n, 32, torch.device("cpu"), PlanOptions(min_sub_rows=8))
    split = [c for c in plan.calls if _sub_rows(c, 32)]
    assert split and {c.unit for c in split} == {8}
    # The backward (its kernel slower on short rows) splits a band only where that
    # drops backward_split_saving of its pairs — here, with 8-query sub-rows, often
    # — into the forward's sub-rows; whole rows elsewhere (the other tests).
    assert all(c in plan.calls for c in plan.backward_calls if _sub_rows(c, 32))
    # fewer keys than the whole-block band (5 blocks, 160 keys): 8 queries see 8 + 2·56 = 120
    sliding = [c for c in split if c.rows.numel() > 1]
    if name == "per_head":  # head-dependent keys: single rows split, each sub-row's window spanning all heads
        assert all(c.idx.shape[0] == 3 for c in split)
    else:
        assert sliding and all(c.idx.shape[-1] * c.unit < 160 for c in sliding)
    if name == "global_local" and not causal:  # the global query block: its global queries' own window (every key) ...
        single = [c.idx.shape[-1] * c.unit for c in split if c.rows.numel() == 1 and c.r0 < 4]
        assert max(single) >= n and min(single) < n  # ... and a narrower one for its local queries
    if name == "union":
        assert any(c.merge for c in plan.calls)  # random blocks beside the band: another call, merged
    if name == "global_local" and n % 32 == 0:  # every row's global keys: one copy, rows stacked as one run
        assert any(c.shared and _tokens(c) and c.rows.numel() > 1 for c in plan.calls)
    q, k, v = random_qkv(1, 3, n, 8, requires_grad=True)
    out = _run_plan(q, k, v, plan)
    _assert_matches_with_grads(out, _sdpa_masked(q, k, v, pattern, causal), q, k, v)


def test_backward_splits_a_global_query_block_but_not_the_window_band():
    """The backward kernel is slower on 64-query rows, so the backward splits a
    band only where that drops many pairs: the global query block of
    global_local(256, 64) at 128-token blocks (64 queries see every key, 64
    only their window: ~45 % fewer pairs), not the window band's rows (11 %
    fewer). Exact either way."""
    from dilcompile.block_sparse import cache
    from dilcompile.block_sparse.impl import plan as gather_plan

    n, pattern = 2048, global_local(256, 64)
    plan = gather_plan.make_plan(pattern.with_heads(2), 2, n, 128, torch.device("cpu"))
    split = [c for c in plan.backward_calls if _sub_rows(c, 128)]
    assert sorted(c.idx.shape[-1] * c.unit for c in split)[-1] == n  # the global queries: every key, one sub-row
    assert all(c.rows.numel() == 1 and c in plan.calls for c in split)
    assert any(_band(c) and not _sub_rows(c, 128) and c.step == 1 and c.rows.numel() > 1
               for c in plan.backward_calls)  # the window band: whole rows
    cache.clear()
    q, k, v = random_qkv(1, 2, n, 8, requires_grad=True)
    out = block_sparse_attention(q, k, v, pattern, impl="gather")
    cache.clear()
    _assert_matches_with_grads(out, _sdpa_masked(q, k, v, pattern, False), q, k, v)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["dilated", "global_local", "hierarchical", "union"])
def test_gather_plans_with_the_explicit_softmax_kernel(name, causal, monkeypatch):
    """Off CPU the gather backend runs each call as an explicit softmax: on the
    same plans (stacked rows sharing keys, sub-rows, token calls with picked
    queries, merges) it matches the float64 reference, outputs and gradients."""
    from dilcompile.block_sparse.impl import gather
    from dilcompile.block_sparse.impl.plan import PlanOptions, make_plan
    from dilcompile.kernels import attention
    from dilcompile.patterns import causal as causal_of

    monkeypatch.setattr(gather, "bias_attention_forward", attention.explicit_bias_attention_forward)
    monkeypatch.setattr(gather, "bias_attention_backward", attention.explicit_bias_attention_backward)
    options = PlanOptions(min_sub_rows=8)
    if name == "dilated":  # chunks inside one segment, as at N = 16384 with 128-token blocks
        options = PlanOptions(min_sub_rows=8, chunk_elements=1 << 16)
    pattern = {"dilated": dilated((128, 256), (1, 2)), "global_local": global_local(56, 20),
               "hierarchical": hierarchical(((1, 24), (8, 6), (64, 2))),
               "union": union(local_window(56), random_blocks(0.2, 32, 1))}[name]
    bound = (causal_of(pattern) if causal else pattern).with_heads(3)
    plan = make_plan(bound, 3, 1000, 32, torch.device("cpu"), options)
    calls = plan.calls
    has = {"stacked": any(c.shared and c.rows.numel() > 1 for c in calls),
           "sub-rows": any(_sub_rows(c, 32) for c in calls),
           "picked queries": any(_tokens(c) and c.qtok is not None for c in calls),
           "merges": any(c.merge for c in calls),
           "backward sub-rows": any(_sub_rows(c, 32) for c in plan.backward_calls)}
    want = {"dilated": {"picked queries", "merges"} | ({"stacked"} if not causal else set()),
            "global_local": {"stacked", "sub-rows", "merges", "backward sub-rows"},
            "union": {"sub-rows", "merges", "backward sub-rows"},
            "hierarchical": {"sub-rows", "merges", "backward sub-rows"} | ({"picked queries"} if not causal else set())}[name]
    assert {feature for feature, present in has.items() if present} >= want
    q, k, v = random_qkv(2, 3, 1000, 8, requires_grad=True)
    out = _run_plan(q, k, v, plan)
    _assert_matches_with_grads(out, _sdpa_masked(q, k, v, pattern, causal), q, k, v)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["hierarchical", "dilated", "global_local"])
def test_sparse_blocks_gather_only_the_attended_key_tokens(name, causal):
    """Blocks few of whose keys the row attends (strided levels, the other half
    of a dilated segment, a short global prefix) leave the band and are
    gathered token by token — per head where the pattern depends on it, with
    only the queries that attend them (repeated query slots must not count
    twice in the backward) — and merged into the band rows; exact, outputs and
    gradients."""
    from dilcompile.block_sparse.impl.plan import PlanOptions, make_plan
    from dilcompile.patterns import causal as causal_of

    options = PlanOptions()
    if name == "dilated":  # chunks inside one segment at this small N (as at N = 16384 with 128-token blocks)
        options = PlanOptions(chunk_elements=1 << 16)
    pattern = {"hierarchical": hierarchical(((1, 24), (8, 6), (64, 2))), "dilated": dilated((128, 256), (1, 2)),
               "global_local": global_local(40, 10)}[name]
    n, heads = 1000, 3
    bound = (causal_of(pattern) if causal else pattern).with_heads(heads)
    plan = make_plan(bound, heads, n, 32, torch.device("cpu"), options)
    widest = bound.block_lists(heads, n, 32).indices.shape[-1]  # most blocks a row lists
    tokens = [c for c in plan.calls if _tokens(c)]
    assert tokens and any(_band(c) for c in plan.calls)
    assert max(c.idx.shape[-1] for c in tokens) < 32 * widest  # fewer keys than whole blocks
    if name == "dilated":  # head-dependent offsets: keys per head, and only the queries of the same residue
        assert all(c.idx.shape[0] == heads for c in tokens) and any(c.qtok is not None for c in tokens)
    q, k, v = random_qkv(2, heads, n, 8, requires_grad=True)
    out = _run_plan(q, k, v, plan)
    _assert_matches_with_grads(out, _sdpa_masked(q, k, v, pattern, causal), q, k, v)


@pytest.mark.parametrize("causal", [False, True])
def test_segment_chunks_use_stride_zero_keys_and_stay_exact(causal):
    """Chunks whose rows all list the same run of blocks (a dilated segment)
    read keys through a stride-0 view — one copy, the rows stacked as one
    query run, consecutive chunks joined; small chunks force such runs at
    small N."""
    from dilcompile.block_sparse.impl.plan import PlanOptions, make_plan
    from dilcompile.patterns import causal as causal_of

    pattern = dilated((128, 256), (1, 2))
    n = 1000
    plan = make_plan((causal_of(pattern) if causal else pattern).with_heads(3), 3, n, 32, torch.device("cpu"),
                     PlanOptions(chunk_elements=1 << 16))
    steps = {c.step for c in plan.calls if _band(c)}
    assert steps == ({1} if causal else {0})  # causal prefixes tie: the sliding band is preferred
    if not causal:  # a segment's rows share their keys: stacked into one query run, chunks joined
        assert all(c.shared for c in plan.calls if _band(c))
        chunk_rows = (1 << 16) // (3 * 32 * 32 * 8)  # one chunk: 3 heads, 32-token blocks, 8 listed a row
        assert max(c.rows.numel() for c in plan.calls if _band(c)) > chunk_rows
    q, k, v = random_qkv(1, 3, n, 8, requires_grad=True)
    out = _run_plan(q, k, v, plan)
    ref = _sdpa_masked(q, k, v, pattern, causal)
    _assert_matches_with_grads(out, ref, q, k, v)


@pytest.mark.parametrize("causal", [False, True])
def test_plan_from_closed_form_key_needs_equals_the_pairwise_one(causal, monkeypatch):
    """The plan asks ``attended_keys`` (per key) instead of evaluating every
    pair of a partial block; the dilated pattern's closed form gives the very
    same plan as the pairwise path."""
    from dilcompile.block_sparse.impl.plan import make_plan
    from dilcompile.patterns import causal as causal_of

    pattern = dilated((128, 200, 256), (1, 3, 2))
    bound = (causal_of(pattern) if causal else pattern).with_heads(3)

    def calls(plan):
        return [(c.rows.tolist(), c.idx.tolist(), None if _band(c) else c.valid.tolist(), c.full.tolist(),
                 c.qtok.tolist() if _tokens(c) and c.qtok is not None else None) for c in plan.calls]

    fast = calls(make_plan(bound, 3, 1000, 32, torch.device("cpu")))
    monkeypatch.setattr(type(pattern), "attended_keys", lambda self, *args: None)
    assert fast == calls(make_plan(bound, 3, 1000, 32, torch.device("cpu")))


@pytest.mark.cuda
@pytest.mark.parametrize("impl", ["flex", "gather"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(PATTERNS))
def test_cuda_flex_and_gather_forward_and_backward_within_twice_plain_error(name, causal, dtype, impl):
    """Every pattern on CUDA at N=1000 (a partial last block), both backends,
    out and dq, dk, dv within 2x plain PyTorch's error in the same dtype, against float64."""
    from dilcompile.block_sparse import cache
    from dilcompile.patterns import causal as causal_of

    cache.clear()
    n, heads = 1000, 3
    pattern = PATTERNS[name](n)
    q64, k64, v64 = random_qkv(1, heads, n, 64, device="cuda", requires_grad=True)
    low = [t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64)]
    plain_in = [t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64)]
    out = block_sparse_attention(*low, pattern, causal=causal, impl=impl)
    ref = _sdpa_masked(q64, k64, v64, pattern, causal)
    mask = (causal_of(pattern) if causal else pattern).with_heads(heads).dense_mask(heads, n).to("cuda")
    has_key = mask.any(-1, keepdim=True)
    s = (plain_in[0] @ plain_in[1].transpose(-1, -2)) * 64 ** -0.5
    s = torch.where(has_key, s.masked_fill(~mask, float("-inf")), torch.zeros_like(s))
    plain = (torch.softmax(s, -1) @ plain_in[2]) * has_key
    assert out.dtype == dtype
    assert_forward_and_gradients_within_budget(out, plain, ref, low, plain_in, [q64, k64, v64])


@pytest.mark.parametrize("seed", range(6))
def test_a_pattern_that_covers_every_pair_runs_as_dense_attention(seed):
    """A window as long as the prompt (short prompts served with a long window) attends every pair, or every
    causal one: the plan says so (``GatherPlan.covers``) and the forward is one dense kernel call, equal to
    the float64 reference with gradients; one key short of covering, it is not."""
    import random

    from dilcompile.block_sparse.impl.plan import PlanOptions, make_plan
    from dilcompile.patterns import causal as causal_of

    rng = random.Random(seed)
    n, h, block = rng.randint(1, 300), rng.randint(1, 3), rng.choice([1, 7, 16, 64, 128])
    is_causal = rng.random() < 0.5
    covering = [local_window(n - 1 + rng.randint(0, 50)), global_local(n - 1 + rng.randint(0, 9), rng.randint(0, n)),
                union(local_window(rng.randint(0, n)), local_window(n + 5))]
    for pattern in covering:
        bound = (causal_of(pattern) if is_causal else pattern).with_heads(h)
        plan = make_plan(bound, h, n, block, torch.device("cpu"), PlanOptions())
        assert plan.covers == ("causal" if is_causal else "all"), (pattern, n, block)
        q, k, v = random_qkv(1, h, n, 8, requires_grad=True, seed=seed)
        out = block_sparse_attention(q, k, v, pattern, causal=is_causal, block_size=block, impl="gather")
        _assert_matches_with_grads(out, _sdpa_masked(q, k, v, pattern, is_causal), q, k, v)
    if n > 2:  # a window two keys short leaves pairs out
        short = (causal_of(local_window(n - 3)) if is_causal else local_window(n - 3)).with_heads(h)
        assert make_plan(short, h, n, block, torch.device("cpu"), PlanOptions()).covers is None


def test_covers_checks_the_diagonal_in_pieces_at_long_lengths():
    """Past 256 diagonal blocks of 128 the causal check runs in pieces (bounded memory at any N), each piece
    checked; a window two keys short of the prompt leaves out pairs of the last block row."""
    from dilcompile.block_sparse.impl.plan import PlanOptions, make_plan
    from dilcompile.patterns import causal as causal_of

    n = 128 * 300 + 5
    plan = make_plan(causal_of(local_window(n)).with_heads(1), 1, n, 128, torch.device("cpu"), PlanOptions())
    assert plan.covers == "causal"
    short = causal_of(local_window(n - 3))
    assert make_plan(short.with_heads(1), 1, n, 128, torch.device("cpu"), PlanOptions()).covers is None
