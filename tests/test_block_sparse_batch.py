"""impl="gather" over a batch: the batch rows fold into the heads and each call
runs once for as many rows as keep it within the plan's score-element bound —
a group of same-length packed documents too, which ran the calls once per
document in a Python loop (~1 ms a document: 8000 one-token documents took 5 s).
Per-head patterns (dilated offsets, per-head random blocks) repeat their
per-head ids for the folded rows. Exact either way, against float64."""

import pytest
import torch

from dilcompile import block_sparse_attention
from dilcompile.block_sparse.impl import gather
from dilcompile.block_sparse.impl.plan import PlanOptions, make_plan
from dilcompile.patterns import causal as causal_of
from dilcompile.patterns import dilated, global_local, hierarchical, local_window, random_blocks, union
from dilcompile.testing import random_qkv


def _count_kernel_calls(monkeypatch):
    calls = []
    real_fwd, real_bwd = gather.bias_attention_forward, gather.bias_attention_backward
    monkeypatch.setattr(gather, "bias_attention_forward", lambda *a: calls.append("fwd") or real_fwd(*a))
    monkeypatch.setattr(gather, "bias_attention_backward", lambda *a: calls.append("bwd") or real_bwd(*a))
    return calls


@pytest.mark.parametrize("pattern", [local_window(5), dilated((16, 32), (1, 2)), random_blocks(0.4, 16, seed=2)],
                         ids=["local_window", "dilated (per-head offsets)", "random_blocks"])
def test_same_length_packed_documents_share_each_call(monkeypatch, pattern):
    lengths = [40] * 25
    q, k, v = random_qkv(1, 3, sum(lengths), 8, requires_grad=True, seed=3)
    cu = torch.tensor([0] + lengths).cumsum(0)
    kw = dict(causal=True, impl="gather", block_size=16)
    calls = _count_kernel_calls(monkeypatch)
    packed = block_sparse_attention(q, k, v, pattern, cu_seqlens=cu, **kw)
    packed.sum().backward()
    packed_calls = list(calls)
    for doc in (0, 17):
        calls.clear()
        rows = slice(40 * doc, 40 * (doc + 1))
        alone_in = [t[:, :, rows].detach().requires_grad_() for t in (q, k, v)]
        alone = block_sparse_attention(*alone_in, pattern, **kw)
        alone.sum().backward()
        torch.testing.assert_close(packed[:, :, rows], alone, rtol=1e-12, atol=1e-12)
        for got, want in zip((q.grad, k.grad, v.grad), (t.grad for t in alone_in)):
            torch.testing.assert_close(got[:, :, rows], want, rtol=1e-12, atol=1e-12)
    # once per call for all 25 documents (the packed backward recomputes its forward: twice the forward calls)
    assert packed_calls.count("fwd") == 2 * calls.count("fwd") and packed_calls.count("bwd") == calls.count("bwd"), \
        (packed_calls, calls)


@pytest.mark.parametrize("pattern", [local_window(6), dilated((16, 32), (1, 2)), hierarchical(((1, 4), (8, 3)))],
                         ids=["local_window", "dilated", "hierarchical"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_batch_equals_float64_with_gradients(pattern, causal):
    q, k, v = random_qkv(3, 2, 70, 8, requires_grad=True, seed=5)
    got = block_sparse_attention(q, k, v, pattern, causal=causal, impl="gather", block_size=16)
    want = block_sparse_attention(q, k, v, pattern, causal=causal, impl="reference")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(want)
    for g, w in zip(torch.autograd.grad(got, (q, k, v), grad), torch.autograd.grad(want, (q, k, v), grad)):
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-11)


def _random_pattern(g):
    def pick(*options):
        return options[int(torch.randint(len(options), (), generator=g))]

    def size(low, high):
        return int(torch.randint(low, high + 1, (), generator=g))

    choices = [
        lambda: local_window(size(1, 40)),
        lambda: dilated((size(4, 24), size(25, 64)), (1, size(2, 4))),
        lambda: random_blocks(pick(0.2, 0.5), pick(8, 16), seed=size(0, 99)),
        lambda: hierarchical(((1, size(2, 5)), (size(6, 12), 3))),
        lambda: union(global_local(size(2, 9), size(1, 3)), dilated((size(8, 32),), (size(2, 3),))),
    ]
    return pick(*choices)()


@pytest.mark.parametrize("seed", range(10))
def test_randomized_row_groups_equal_float64_with_gradients(seed):
    """Random pattern (per-head and head-independent), batch, heads, length, block size, causal, and a
    score-element bound small enough that rows run in groups of every size from 1 to the whole batch."""
    from dilcompile.block_sparse.ops import _Gather

    g = torch.Generator().manual_seed(seed)
    pattern = _random_pattern(g)
    causal = bool(torch.randint(2, (), generator=g))
    b, h = int(torch.randint(1, 6, (), generator=g)), int(torch.randint(1, 5, (), generator=g))
    n, bs = int(torch.randint(1, 91, (), generator=g)), [8, 16, 32][int(torch.randint(3, (), generator=g))]
    options = PlanOptions(chunk_elements=1 << int(torch.randint(8, 17, (), generator=g)),
                          call_query_tokens=1 << int(torch.randint(0, 9, (), generator=g)))
    bound = (causal_of(pattern) if causal else pattern).with_heads(h)
    plan = make_plan(bound, h, n, bs, torch.device("cpu"), options)
    q, k, v = random_qkv(b, h, n, 8, requires_grad=True, seed=seed)
    got = _Gather.apply(q, k, v, plan, 8 ** -0.5)
    want = block_sparse_attention(q, k, v, pattern, causal=causal, impl="reference")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=f"{pattern!r} b={b} h={h} n={n} bs={bs}")
    grad = torch.randn_like(want)
    for x, y in zip(torch.autograd.grad(got, (q, k, v), grad), torch.autograd.grad(want, (q, k, v), grad)):
        torch.testing.assert_close(x, y, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("name", ["global_local", "dilated", "hierarchical"])
def test_a_forward_call_runs_at_most_its_query_tokens_and_gives_the_same_output(name):
    """Each forward call runs whole rows and at most ``call_query_tokens`` queries per head (its
    output and copies stay that size: one call over a global key block's rows held three copies of
    nearly the whole output); cutting a call's rows changes no query's arithmetic: bit-equal to the
    plan of one call per kind, which sees these patterns' long calls."""
    from dilcompile.block_sparse.impl.calls import queries_per_row

    pattern = {"global_local": global_local(64, 16), "dilated": dilated((64, 256), (1, 4)),
               "hierarchical": hierarchical(((1, 4), (8, 3)))}[name]
    n, bs, tokens = 1000, 16, 64
    bound = causal_of(pattern).with_heads(2)
    whole = make_plan(bound, 2, n, bs, torch.device("cpu"), PlanOptions(call_query_tokens=1 << 30))
    cut = make_plan(bound, 2, n, bs, torch.device("cpu"), PlanOptions(call_query_tokens=tokens))
    assert any(c.rows.numel() * queries_per_row(c, bs) > tokens for c in whole.calls)
    for call in cut.calls:
        per_row = queries_per_row(call, bs)
        assert call.rows.numel() * per_row <= tokens or call.rows.numel() == 1, (call, per_row)
    q, k, v = random_qkv(2, 2, n, 8, seed=5)
    from dilcompile.block_sparse.ops import _Gather

    assert torch.equal(_Gather.apply(q, k, v, cut, 8 ** -0.5), _Gather.apply(q, k, v, whole, 8 ** -0.5))


def test_rows_per_call_keep_the_score_element_bound():
    """A big batch of long rows is not folded into one call that is batch times the bound (the
    head-independent fold ran every row at once)."""
    plan = make_plan(local_window(8).with_heads(2), 2, 256, 16, torch.device("cpu"), PlanOptions(chunk_elements=4096))
    for call in plan.calls:
        per_row = 2 * gather.score_elements(call, 16)
        groups = [heads for heads, *_ in gather._row_groups(call, 7, 2, 16, 4096)]
        rows = [(s.stop - s.start) // 2 for s in groups]
        assert sum(rows) == 7 and all(r * per_row <= 4096 or r == 1 for r in rows), (rows, per_row)
