"""Edge inputs of block_sparse_attention and its modules: empty shapes, block
sizes past N."""

import pytest
import torch

from dilcompile import BlockSparseAttention, block_sparse_attention
from dilcompile.block_sparse import MultiheadBlockSparseAttention, cache
from dilcompile.patterns import adaptive, dilated, hilbert, local_window, random_blocks, union
from dilcompile.testing import random_qkv

EMPTY_SHAPES = [(0, 2, 16, 4), (1, 0, 16, 4), (1, 2, 0, 4), (0, 0, 0, 4)]


def _patterns(d):
    return {"local_window": local_window(3), "dilated": dilated((8,), (2,)), "union": union(local_window(1),
            random_blocks(0.5, 4, 0)), "hilbert": hilbert(4, 4, 1), "adaptive": adaptive(head_dim=max(d, 1),
                                                                                            block_size=4)}


@pytest.mark.parametrize("impl", ["gather", "reference", "flex"])
@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=str)
def test_empty_shapes_give_an_empty_result_on_every_backend(shape, impl):
    """B, H or N = 0: the (B, H, N, D) output is empty, gradients too —
    whatever the pattern (a head-dependent one at H = 0, a fixed-N one at
    N = 0)."""
    for name, pattern in _patterns(shape[-1]).items():
        if impl == "flex" and name == "adaptive":
            continue  # refused by name for every shape (the learned selection has no BlockMask)
        grad = impl != "flex"  # FlexAttention on CPU is inference-only, and takes no float64
        dtype = torch.float32 if impl == "flex" else torch.float64
        q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=grad) for _ in range(3))
        with torch.set_grad_enabled(grad):
            out = block_sparse_attention(q, k, v, pattern, impl=impl, block_size=4)
        assert out.shape == shape and out.dtype == q.dtype, name
        if grad:
            grads = torch.autograd.grad(out.sum(), (q, k, v))
            assert all(g.shape == shape for g in grads), name


@pytest.mark.parametrize("impl", ["gather", "reference", "flex"])
def test_head_dim_zero_raises_naming_it(impl):
    """D = 0 has no softmax scale 1/sqrt(D): a ValueError naming the head dim on
    every backend, as dilated attention gives (docs/numerics.md, validation)."""
    for shape in ((1, 2, 16, 0), (0, 0, 0, 0)):
        q, k, v = (torch.randn(shape) for _ in range(3))
        with pytest.raises(ValueError, match="head dim D = 0"):
            block_sparse_attention(q, k, v, local_window(3), impl=impl, block_size=4)


@pytest.mark.parametrize("impl", ["gather", "reference"])
def test_no_queries_against_keys_is_empty(impl):
    """Nq = 0 queries against Nk > 0 keys (a decode step with nothing to ask):
    an empty (B, H, 0, D) result, and zero gradients of the right shapes."""
    q = torch.randn(1, 2, 0, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = block_sparse_attention(q, k, v, local_window(2), impl=impl, block_size=4)
    assert out.shape == (1, 2, 0, 8)
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert not dk.any() and not dv.any()


@pytest.mark.parametrize("shape", EMPTY_SHAPES[:3], ids=str)
def test_modules_take_empty_inputs(shape):
    b, h, n, d = shape
    module = BlockSparseAttention("local_window(window=3)", block_size=4)
    q, k, v = (torch.randn(shape) for _ in range(3))
    assert module(q, k, v).shape == shape
    if h:
        mha = MultiheadBlockSparseAttention(h * d, h, "local_window(window=3)", block_size=4)
        y, _ = mha(torch.randn(b, n, h * d))
        assert y.shape == (b, n, h * d)


@pytest.mark.parametrize("block_size", [65536, 10 ** 9, 2 ** 62])
def test_block_size_past_n_is_one_block(block_size):
    """Blocks longer than the sequence hold it whole: the plan uses N-token
    blocks (its masks grow as block_size², so 65536 once asked for 34 GB at
    N = 256) and the result is exact."""
    cache.clear()
    pattern = union(local_window(5), random_blocks(0.3, 16, 2))
    q, k, v = random_qkv(1, 2, 40, 8, requires_grad=True, seed=0)
    got = block_sparse_attention(q, k, v, pattern, block_size=block_size, impl="gather")
    want = block_sparse_attention(q, k, v, pattern, impl="reference")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for g, w in zip(torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
    assert cache.size() == 1 and all(plan.block_size == 40 for plan in cache._entries.values())
    cache.clear()


def test_adaptive_block_size_past_n_is_one_block():
    pattern = adaptive(head_dim=8, block_size=1 << 40, top_k=2).double().eval()
    q, k, v = random_qkv(1, 2, 40, 8, seed=1)
    got = block_sparse_attention(q, k, v, pattern, impl="gather")
    want = block_sparse_attention(q, k, v, pattern, impl="reference")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_a_packed_batch_keeps_every_document_plan(monkeypatch):
    """The plan cache is bounded by sequence length, not entry count: a packed
    batch of 40 documents of different lengths builds its plans once (bounded by
    count, 16 entries, every call rebuilt nearly all of them)."""
    from dilcompile.block_sparse import impl

    cache.clear()
    lengths = list(range(5, 45))
    cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    q, k, v = random_qkv(1, 2, sum(lengths), 8, seed=3)
    pattern = local_window(3)
    first = block_sparse_attention(q, k, v, pattern, causal=True, block_size=8, cu_seqlens=cu)
    built = []
    real = impl.plan.make_plan
    monkeypatch.setattr(cache, "make_plan", lambda *a, **kw: built.append(a) or real(*a, **kw))
    again = block_sparse_attention(q, k, v, pattern, causal=True, block_size=8, cu_seqlens=cu)
    assert built == [] and torch.equal(first, again)
    cache.clear()


def test_the_plan_cache_still_drops_long_plans():
    cache.clear()
    q, k, v = random_qkv(1, 1, 8, 4, seed=0)
    for n in range(20):  # 20 plans weighed as N = 65536 each: at most 16 stay
        cache._get(("test", n), lambda: n, 65536)
    assert cache.size() == 16 and ("test", 0) not in cache._entries and ("test", 19) in cache._entries
    cache.clear()
