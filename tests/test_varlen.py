"""Variable-length batches (docs/design.md, "Variable-length batches"): every
sequence computed as if it were alone. Packed input (cu_seqlens, and
cu_seqlens_q / cu_seqlens_k for Nq ≤ Nk) and padded input (key_padding_mask:
padding is absence) against per-sequence calls and the float64 reference —
outputs, lse and dq, dk, dv — for every implementation, random configs and
document lengths (1, primes), both modes, causal and not; pad rows; bad
metadata; one compiled graph for any lengths; the modules."""

import random

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from dilcompile import (
    BlockSparseAttention, DilatedAttention, MultiheadBlockSparseAttention, MultiheadDilatedAttention,
    block_sparse_attention, dilated_attention,
)
from dilcompile.dilated.api import HAS_TRITON
from dilcompile.dilated.geometry import multiplicity, plan_parts
from dilcompile.dilated.impl.reference import counted_attention_reference
from dilcompile.patterns import dilated, global_local, local_window, random_blocks
from dilcompile.testing import random_qkv

LENGTHS = [1, 1, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]  # 1 and primes: multiples of nothing


def _dilated_config(rng):
    m = rng.randint(1, 3)
    return dict(segment_lengths=tuple(rng.randint(1, 24) for _ in range(m)),
                dilation_rates=tuple(rng.randint(1, 4) for _ in range(m)),
                causal=rng.random() < 0.5, mode=rng.choice(["longnet", "groups"]))


def _pattern(rng):
    return rng.choice([
        lambda: local_window(rng.randint(0, 12)),
        lambda: dilated((rng.randint(2, 16), rng.randint(8, 40)), (1, rng.randint(1, 3))),
        lambda: global_local(rng.randint(0, 4), rng.randint(0, 6)),
        lambda: random_blocks(rng.random(), rng.randint(1, 40), rng.randrange(100)),
    ])()


def _dilated_call(config, impl, **kw):
    def call(q, k, v, **extra):
        return dilated_attention(q, k, v, **config, impl=impl, return_lse=True, **kw, **extra)
    return call


def _block_sparse_call(pattern, causal, block_size, impl):
    def call(q, k, v, **extra):
        return block_sparse_attention(q, k, v, pattern, causal=causal, block_size=block_size, impl=impl, **extra)
    return call


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


def _loss(result, cotangents):
    """Σ out·g (+ Σ lse·g_lse where finite): gradients through out and lse."""
    total = 0
    for x, g in zip(_outputs(result), cotangents):
        total = total + (x.double().nan_to_num(0.0, 0.0, 0.0) * g).sum()
    return total


def _cotangents(result, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.device) for x in _outputs(result)]


def _bounds(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def assert_packed_equals_alone(call, q, k, v, lengths_q, lengths_k, tol, oracle=None, oracle_tol=None):
    """``call`` on packed q (1, H, Σ Nq_i, D), k, v (1, H, Σ Nk_i, D) equals, per
    sequence, ``call`` on that sequence alone (and ``oracle`` alone, the float64
    reference), outputs, lse and gradients of q, k, v."""
    cu_q, cu_k = _bounds(lengths_q), _bounds(lengths_k)
    meta = dict(cu_seqlens=torch.tensor(cu_q, device=q.device)) if lengths_q == lengths_k else \
        dict(cu_seqlens_q=torch.tensor(cu_q, device=q.device, dtype=torch.int32),
             cu_seqlens_k=torch.tensor(cu_k, device=q.device, dtype=torch.int32))
    packed = call(q, k, v, **meta)
    cotangents = _cotangents(packed, seed=len(cu_q))
    for reference, tolerance in ((call, tol), (oracle, oracle_tol)):
        if reference is None:
            continue
        alone_loss = 0
        for i, (a, b, c, d) in enumerate(zip(cu_q, cu_q[1:], cu_k, cu_k[1:])):
            alone = reference(q[:, :, a:b], k[:, :, c:d], v[:, :, c:d])
            for name, x, y in zip(("out", "lse"), _outputs(packed), _outputs(alone)):
                assert x.dtype == y.dtype or reference is oracle, name
                torch.testing.assert_close(x[:, :, a:b].double(), y.double(), rtol=tolerance, atol=tolerance,
                                           msg=f"{name} of sequence {i}: lengths {lengths_q} / {lengths_k}")
            alone_loss = alone_loss + _loss(alone, [g[:, :, a:b] for g in cotangents])
        inputs = (q, k, v)
        got = torch.autograd.grad(_loss(packed, cotangents), inputs, retain_graph=True)
        want = torch.autograd.grad(alone_loss, inputs, allow_unused=True, materialize_grads=True)
        for name, g, w in zip("qkv", got, want):
            assert not g.isnan().any(), name
            torch.testing.assert_close(g.double(), w.double(), rtol=tolerance, atol=tolerance,
                                       msg=f"d{name}: lengths {lengths_q} / {lengths_k}")


def _random_lengths(rng, shorter_queries):
    lengths_k = [rng.choice(LENGTHS) for _ in range(rng.randint(1, 5))]
    if rng.random() < 0.2:
        lengths_k.insert(rng.randrange(len(lengths_k) + 1), 0)  # an empty sequence (repeated cu entry)
    lengths_q = [rng.randint(0, n) for n in lengths_k] if shorter_queries else list(lengths_k)
    return lengths_q, lengths_k


def _packed_qkv(lengths_q, lengths_k, heads, dim, dtype=torch.float64, device="cpu", seed=0):
    q, _, _ = random_qkv(1, heads, sum(lengths_q), dim, dtype=dtype, device=device, requires_grad=True, seed=seed)
    _, k, v = random_qkv(1, heads, sum(lengths_k), dim, dtype=dtype, device=device, requires_grad=True,
                         seed=seed + 1)
    return q, k, v


# -- the motivating example --------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_left_padded_sequence_equals_the_sequence_alone(impl, device):
    """20 real tokens left-padded to 32: the pads used to shift the segment
    grid (up to 2.89 away from the sequence alone)."""
    kw = dict(segment_lengths=(8, 16), dilation_rates=(1, 2), causal=True, impl=impl, return_lse=True)
    q, k, v = random_qkv(1, 2, 32, 8, device=device, requires_grad=True, seed=3)
    pads = torch.zeros(1, 32, dtype=torch.bool, device=device)
    pads[:, :12] = True
    out, lse = dilated_attention(q, k, v, key_padding_mask=pads, **kw)
    alone, alone_lse = dilated_attention(q[:, :, 12:], k[:, :, 12:], v[:, :, 12:], **kw)
    torch.testing.assert_close(out[:, :, 12:], alone, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse[:, :, 12:], alone_lse, rtol=1e-12, atol=1e-12)
    assert not out[:, :, :12].any() and (lse[:, :, :12] == float("-inf")).all()
    got = torch.autograd.grad(out.sum() + lse[:, :, 12:].sum(), (q, k, v))
    want = torch.autograd.grad(alone.sum() + alone_lse.sum(), (q, k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


# -- packed ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("shorter_queries", [False, True])
def test_dilated_packed_equals_each_sequence_alone(seed, shorter_queries, device):
    rng = random.Random(seed * 2 + shorter_queries)
    config = _dilated_config(rng)
    lengths_q, lengths_k = _random_lengths(rng, shorter_queries)
    q, k, v = _packed_qkv(lengths_q, lengths_k, rng.randint(1, 5), 4, device=device, seed=seed)
    assert_packed_equals_alone(_dilated_call(config, "sdpa"), q, k, v, lengths_q, lengths_k, tol=1e-12,
                               oracle=_dilated_call(config, "reference"), oracle_tol=1e-10)


def test_dilated_packed_long_chunk_takes_the_suffix_path(device):
    """Nq_i > 64 queries after a prefix: the full-length kernels on the keys' suffix."""
    config = dict(segment_lengths=(8, 24), dilation_rates=(1, 3), causal=True, mode="longnet")
    lengths_q, lengths_k = [70, 3, 1], [97, 5, 1]
    q, k, v = _packed_qkv(lengths_q, lengths_k, 3, 4, device=device, seed=7)
    assert_packed_equals_alone(_dilated_call(config, "sdpa"), q, k, v, lengths_q, lengths_k, tol=1e-12,
                               oracle=_dilated_call(config, "reference"), oracle_tol=1e-10)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shorter_queries", [False, True])
def test_block_sparse_packed_equals_each_sequence_alone(seed, shorter_queries, device):
    rng = random.Random(100 + seed * 2 + shorter_queries)
    pattern, causal, block_size = _pattern(rng), rng.random() < 0.5, rng.choice([1, 4, 8, 16])
    lengths_q, lengths_k = _random_lengths(rng, shorter_queries)
    q, k, v = _packed_qkv(lengths_q, lengths_k, rng.randint(1, 4), 4, device=device, seed=seed)
    assert_packed_equals_alone(_block_sparse_call(pattern, causal, block_size, "gather"), q, k, v, lengths_q,
                               lengths_k, tol=1e-12,
                               oracle=_block_sparse_call(pattern, causal, block_size, "reference"), oracle_tol=1e-10)


def test_block_sparse_packed_flex_inference():
    """FlexAttention (CPU: inference, float32) per sequence inside the packed op,
    twelve lengths: more than Dynamo's default eight graphs per function, which
    a graph per length once exhausted (flex.py compiles for dynamic lengths)."""
    pattern, lengths = local_window(3), [1, 20, 7, 33, 4, 61, 12, 45, 2, 90, 26, 5]
    q, k, v = (t.detach() for t in _packed_qkv(lengths, lengths, 2, 16, dtype=torch.float32, seed=5))
    cu = torch.tensor(_bounds(lengths))
    out = block_sparse_attention(q, k, v, pattern, causal=True, block_size=4, impl="flex", cu_seqlens=cu)
    for a, b in zip(cu.tolist(), cu[1:].tolist()):
        rows = (slice(None), slice(None), slice(a, b))
        alone = block_sparse_attention(q[rows], k[rows], v[rows], pattern, causal=True, block_size=4, impl="flex")
        torch.testing.assert_close(out[rows], alone, rtol=0, atol=0)
        ref = block_sparse_attention(q[rows].double(), k[rows].double(), v[rows].double(), pattern, causal=True,
                                     block_size=4, impl="reference")
        torch.testing.assert_close(out[rows].double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed (pip install 'dilcompile[triton]')")
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")  # interpreter
@pytest.mark.parametrize("causal, mode", [(True, "longnet"), (False, "groups")])
def test_dilated_packed_triton_equals_each_sequence_alone(causal, mode):
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: TRITON_INTERPRET=1 (tests/conftest.py)
    config = dict(segment_lengths=(4, 16), dilation_rates=(1, 2), causal=causal, mode=mode)
    lengths_q, lengths_k = [1, 13, 2], [1, 17, 5]
    q, k, v = _packed_qkv(lengths_q, lengths_k, 3, 16, dtype=torch.float32, device=dev, seed=11)
    assert_packed_equals_alone(_dilated_call(config, "triton"), q, k, v, lengths_q, lengths_k, tol=0,
                               oracle=_dilated_call(config, "reference"), oracle_tol=1e-5)


# -- padded: padding is absence ------------------------------------------------------------------------


def _pad_masks(rng, batch, n, device):
    """Left, right and mixed padding, a row without pads and a row of pads only."""
    mask = torch.zeros(batch, n, dtype=torch.bool)
    for b in range(batch):
        kind = rng.choice(["left", "right", "mixed", "none", "all"])
        cut = rng.randint(0, n)
        if kind == "left":
            mask[b, :cut] = True
        elif kind == "right":
            mask[b, cut:] = True
        elif kind == "mixed":
            mask[b] = torch.tensor([rng.random() < 0.4 for _ in range(n)])
        elif kind == "all":
            mask[b] = True
    return mask.to(device)


def assert_padding_is_absence(call, q, k, v, mask, tol, oracle=None, oracle_tol=None):
    """``call(q, k, v, key_padding_mask=mask)`` (q the last Nq positions of each
    row) equals, at every real query, ``call`` on the row with its pads deleted;
    pad queries output 0 (lse −inf); no gradient reaches a pad."""
    nq, nk = q.shape[2], k.shape[2]
    padded = call(q, k, v, key_padding_mask=mask)
    cotangents = _cotangents(padded, seed=nq)
    pads_q = mask[:, nk - nq :]
    got = torch.autograd.grad(_loss(padded, cotangents), (q, k, v), retain_graph=True)
    for g, pads in zip(got, (pads_q, mask, mask)):
        assert not g.isnan().any()
        assert not g.transpose(1, 2)[pads].any(), "a gradient reached a pad"
    out = _outputs(padded)
    assert not out[0].transpose(1, 2)[pads_q].any(), "pad rows output 0"
    if len(out) > 1:
        assert (out[1].transpose(1, 2)[pads_q] == float("-inf")).all(), "pad rows have lse −inf"
    for reference, tolerance in ((call, tol), (oracle, oracle_tol)):
        if reference is None:
            continue
        alone_loss = 0
        for b in range(q.shape[0]):
            real_q, real_k = ~pads_q[b], ~mask[b]
            if not real_q.any():
                continue
            alone = reference(q[b : b + 1][:, :, real_q], k[b : b + 1][:, :, real_k], v[b : b + 1][:, :, real_k])
            for name, x, y in zip(("out", "lse"), out, _outputs(alone)):
                torch.testing.assert_close(x[b : b + 1][:, :, real_q].double(), y.double(), rtol=tolerance,
                                           atol=tolerance, msg=f"{name} of row {b}, pads {mask[b].tolist()}")
            alone_loss = alone_loss + _loss(alone, [g[b : b + 1][:, :, real_q] for g in cotangents])
        want = torch.autograd.grad(alone_loss, (q, k, v), allow_unused=True, materialize_grads=True)
        for name, g, w in zip("qkv", got, want):
            torch.testing.assert_close(g.double(), w.double(), rtol=tolerance, atol=tolerance, msg=f"d{name}")


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("shorter_queries", [False, True])
def test_dilated_padded_rows_equal_the_rows_without_pads(seed, shorter_queries, device):
    rng = random.Random(300 + seed * 2 + shorter_queries)
    config, n = _dilated_config(rng), rng.choice([1, 2, 13, 29, 40])
    nq = rng.randint(1, n) if shorter_queries else n
    q, k, v = random_qkv(3, rng.randint(1, 4), n, 4, device=device, requires_grad=True, seed=seed)
    q = q[:, :, n - nq :].detach().requires_grad_()
    mask = _pad_masks(rng, 3, n, device)
    assert_padding_is_absence(_dilated_call(config, "sdpa"), q, k, v, mask, tol=1e-12,
                              oracle=_dilated_call(config, "reference"), oracle_tol=1e-10)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shorter_queries", [False, True])
def test_block_sparse_padded_rows_equal_the_rows_without_pads(seed, shorter_queries, device):
    rng = random.Random(500 + seed * 2 + shorter_queries)
    pattern, causal, block_size = _pattern(rng), rng.random() < 0.5, rng.choice([1, 4, 8])
    n = rng.choice([1, 7, 23, 31])
    nq = rng.randint(1, n) if shorter_queries else n
    q, k, v = random_qkv(3, rng.randint(1, 3), n, 4, device=device, requires_grad=True, seed=seed)
    q = q[:, :, n - nq :].detach().requires_grad_()
    mask = _pad_masks(rng, 3, n, device)
    assert_padding_is_absence(_block_sparse_call(pattern, causal, block_size, "gather"), q, k, v, mask, tol=1e-12,
                              oracle=_block_sparse_call(pattern, causal, block_size, "reference"), oracle_tol=1e-10)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed (pip install 'dilcompile[triton]')")
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")  # interpreter
def test_dilated_padded_triton():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    config = dict(segment_lengths=(4, 8), dilation_rates=(1, 2), causal=True, mode="longnet")
    q, k, v = random_qkv(2, 2, 19, 16, dtype=torch.float32, device=dev, requires_grad=True, seed=2)
    mask = torch.zeros(2, 19, dtype=torch.bool, device=dev)
    mask[0, :6] = True
    mask[1, 3::4] = True
    assert_padding_is_absence(_dilated_call(config, "triton"), q, k, v, mask, tol=0,
                              oracle=_dilated_call(config, "reference"), oracle_tol=1e-5)


def test_decode_rows_of_different_lengths_sit_after_their_own_real_keys(device):
    """Batched decode with rows of different lengths (right-padded cache, the
    new token last): the query of each row sits at its row's real length."""
    config = dict(segment_lengths=(4, 8), dilation_rates=(1, 2), causal=True)
    q_all, k, v = random_qkv(2, 2, 12, 4, device=device, seed=9)
    mask = torch.zeros(2, 12, dtype=torch.bool, device=device)
    mask[0, 5:11] = True  # row 0: 5 cached tokens, 6 empty slots, then the new token
    out = dilated_attention(q_all[:, :, -1:], k, v, key_padding_mask=mask, **config)
    keep = torch.cat([torch.arange(5), torch.tensor([11])])
    alone = dilated_attention(q_all[:1, :, 11:], k[:1, :, keep], v[:1, :, keep], **config)
    torch.testing.assert_close(out[:1], alone, rtol=1e-12, atol=1e-12)
    full = dilated_attention(q_all[1:], k[1:], v[1:], **config)
    torch.testing.assert_close(out[1:], full[:, :, -1:], rtol=1e-12, atol=1e-12)


def test_key_mask_keeps_positions(device):
    """``key_mask`` is the former meaning of key_padding_mask: keys removed, positions unchanged."""
    heads, n, config = 3, 29, dict(segment_lengths=(8, 16), dilation_rates=(1, 2), causal=True, mode="longnet")
    q, k, v = random_qkv(2, heads, n, 4, device=device, seed=4)
    mask = torch.rand(2, n, device=device) < 0.4
    out = dilated_attention(q, k, v, key_mask=mask, **config)
    count = multiplicity(plan_parts(heads, (8, 16), (1, 2), "longnet"), heads, n, True, device=device)
    want, _ = counted_attention_reference(q, k, v, count * (~mask)[:, None, None, :], 4 ** -0.5)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)


# -- compile: lengths are data ---------------------------------------------------------------------------


DOCUMENTS = ([5, 1, 13, 13], [32], [1, 1, 2, 3, 5, 7, 11], [13, 37])  # lengths and counts change


def test_dilated_packed_compiles_once_for_any_lengths(device):
    kw = dict(segment_lengths=(8, 16), dilation_rates=(1, 2), causal=True, return_lse=True)

    def fn(q, k, v, cu):
        return dilated_attention(q, k, v, cu_seqlens=cu, **kw)

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, dynamic=True, fullgraph=True)
    for i, lengths in enumerate(DOCUMENTS):
        q, k, v = random_qkv(1, 2, sum(lengths), 8, dtype=torch.float32, device=device, requires_grad=True, seed=i)
        cu = torch.tensor(_bounds(lengths), dtype=torch.int32, device=device)
        got, want = compiled(q, k, v, cu), fn(q, k, v, cu)
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        grads = [torch.autograd.grad(r[0].sum() + r[1][r[1].isfinite()].sum(), (q, k, v)) for r in (got, want)]
        for x, y in zip(*grads):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert counter.frame_count == 1


def test_block_sparse_packed_compiles_once_for_any_lengths(device):
    pattern = local_window(4)

    def fn(q, k, v, cu):
        return block_sparse_attention(q, k, v, pattern, causal=True, block_size=4, impl="gather", cu_seqlens=cu)

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, dynamic=True, fullgraph=True)
    for i, lengths in enumerate(DOCUMENTS):
        q, k, v = random_qkv(1, 2, sum(lengths), 8, dtype=torch.float32, device=device, requires_grad=True, seed=i)
        cu = torch.tensor(_bounds(lengths), device=device)
        got, want = compiled(q, k, v, cu), fn(q, k, v, cu)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        for x, y in zip(torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v))):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert counter.frame_count == 1


def test_padding_mask_compiles_once_for_any_pattern_of_pads(device):
    kw = dict(segment_lengths=(4, 8), dilation_rates=(1, 2), causal=True)

    def fn(q, k, v, mask):
        return dilated_attention(q, k, v, key_padding_mask=mask, **kw)

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, dynamic=True, fullgraph=True)
    q, k, v = random_qkv(3, 2, 20, 8, dtype=torch.float32, device=device, seed=1)
    rng = random.Random(0)
    for _ in range(4):
        mask = _pad_masks(rng, 3, 20, device)
        torch.testing.assert_close(compiled(q, k, v, mask), fn(q, k, v, mask), rtol=0, atol=0)
    assert counter.frame_count == 1


# -- metadata errors -------------------------------------------------------------------------------------


def _cu(values, **kw):
    return torch.tensor(values, **kw)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(cu_seqlens=_cu([1, 5, 10])), ValueError, "start at 0"),
    (dict(cu_seqlens=_cu([0, 5, 9])), ValueError, "end at the packed length 10"),
    (dict(cu_seqlens=_cu([0, 6, 5, 10])), ValueError, "non-decreasing"),
    (dict(cu_seqlens=_cu([0.0, 10.0])), ValueError, "integer tensor"),
    (dict(cu_seqlens=_cu([[0, 10]])), ValueError, "1-D"),
    (dict(cu_seqlens=[0, 10]), TypeError, "int32/int64 tensor"),
    (dict(cu_seqlens=_cu([0, 10]), cu_seqlens_q=_cu([0, 10])), ValueError, "not both"),
    (dict(cu_seqlens_q=_cu([0, 10])), ValueError, "go together"),
    (dict(cu_seqlens_q=_cu([0, 4, 10]), cu_seqlens_k=_cu([0, 10])), ValueError, "same sequences"),
    (dict(cu_seqlens_q=_cu([0, 6, 10]), cu_seqlens_k=_cu([0, 5, 10])), ValueError, "Nq_i ≤ Nk_i"),
    (dict(cu_seqlens=_cu([0, 10]), key_padding_mask=torch.zeros(1, 10, dtype=torch.bool)), ValueError,
     "one of key_padding_mask"),
])
@pytest.mark.parametrize("api", ["dilated", "block_sparse"])
def test_bad_metadata_is_one_clear_error(kwargs, error, words, api):
    q, k, v = random_qkv(1, 2, 10, 4)
    with pytest.raises(error, match=words):
        if api == "dilated":
            dilated_attention(q, k, v, segment_lengths=(4,), dilation_rates=(1,), **kwargs)
        else:
            block_sparse_attention(q, k, v, local_window(2), **kwargs)


def test_packed_input_needs_batch_one_and_cu_on_qs_device():
    q, k, v = random_qkv(2, 2, 10, 4)
    with pytest.raises(ValueError, match="batch 1"):
        dilated_attention(q, k, v, segment_lengths=(4,), dilation_rates=(1,), cu_seqlens=_cu([0, 10]))
    with pytest.raises(ValueError, match="key_mask"):
        dilated_attention(q, k, v, segment_lengths=(4,), dilation_rates=(1,), key_mask=torch.zeros(2, 9).bool())
    with pytest.raises(ValueError, match="on meta but q is on cpu"):
        dilated_attention(q[:1], k[:1], v[:1], segment_lengths=(4,), dilation_rates=(1,),
                          cu_seqlens=_cu([0, 10], device="meta"))


def test_bad_metadata_inside_a_compiled_call_is_a_value_error():
    """Compiled calls skip the eager value checks (no host sync while tracing);
    the op checks the concrete values when it runs."""
    fn = torch.compile(lambda q, k, v, cu: dilated_attention(q, k, v, segment_lengths=(4,), dilation_rates=(1,),
                                                             cu_seqlens=cu), fullgraph=True, backend="aot_eager")
    q, k, v = random_qkv(1, 2, 10, 4)
    fn(q, k, v, _cu([0, 4, 10]))
    with pytest.raises(ValueError, match="^cu_seqlens must be non-decreasing"):  # it named cu_seqlens_q
        fn(q, k, v, _cu([0, 12, 10]))


def test_varlen_ops_pass_opcheck():
    q, k, v = random_qkv(1, 2, 12, 4, requires_grad=True)
    cu = _cu([0, 5, 12])
    torch.library.opcheck(torch.ops.dilcompile.dilated_varlen_fwd.default,
                          (q, k, v, cu, cu, None, [4, 8], [1, 2], "longnet", True, 0.5, "sdpa"))
    out, lse = torch.ops.dilcompile.dilated_varlen_fwd(q, k, v, cu, cu, None, [4, 8], [1, 2], "longnet", True, 0.5,
                                                       "sdpa")
    torch.library.opcheck(torch.ops.dilcompile.dilated_varlen_bwd.default,
                          (torch.randn_like(out), torch.randn_like(lse), q.detach(), k.detach(), v.detach(), cu, cu,
                           None, [4, 8], [1, 2], "longnet", True, 0.5, "sdpa"))
    pattern = local_window(3)
    torch.library.opcheck(torch.ops.dilcompile.block_sparse_varlen_fwd.default,
                          (q, k, v, cu, cu, None, pattern._structure, pattern._numbers, False, 0.5, "gather", 4))
    mask = torch.rand(3, 12) < 0.5
    q3, k3, v3 = random_qkv(3, 2, 12, 4, requires_grad=True)
    torch.library.opcheck(torch.ops.dilcompile.dilated_varlen_fwd.default,
                          (q3, k3, v3, None, None, mask, [4, 8], [1, 2], "longnet", True, 0.5, "sdpa"))


# -- modules ------------------------------------------------------------------------------------------


def _module_cases():
    return [
        MultiheadDilatedAttention(16, 4, (4, 8), (1, 2), dtype=torch.float64),
        MultiheadDilatedAttention(16, 4, (4, 8), (1, 2), mode="groups", dtype=torch.float64),
        MultiheadBlockSparseAttention(16, 2, local_window(3), block_size=4, dtype=torch.float64),
    ]


@pytest.mark.parametrize("index", range(3))
@pytest.mark.parametrize("causal", [False, True])
def test_multihead_packed_and_padded_equal_each_sequence_alone(index, causal):
    mha = _module_cases()[index]
    lengths = [5, 1, 11]
    x = torch.randn(1, sum(lengths), 16, dtype=torch.float64, requires_grad=True)
    cu = _cu(_bounds(lengths), dtype=torch.int32)
    packed, _ = mha(x, cu_seqlens=cu, is_causal=causal)
    alone = torch.cat([mha(x[:, a:b], is_causal=causal)[0] for a, b in zip(cu.tolist(), cu[1:].tolist())], 1)
    torch.testing.assert_close(packed, alone, rtol=1e-12, atol=1e-12)
    for g, w in zip(torch.autograd.grad(packed.square().sum(), [x, *mha.parameters()]),
                    torch.autograd.grad(alone.square().sum(), [x, *mha.parameters()])):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)

    rows = torch.randn(2, 11, 16, dtype=torch.float64)
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[0, :4] = True  # left
    mask[1, 2::3] = True  # mixed
    padded, _ = mha(rows, key_padding_mask=mask, is_causal=causal)
    for b in range(2):
        real = rows[b, ~mask[b]][None]
        torch.testing.assert_close(padded[b, ~mask[b]], mha(real, is_causal=causal)[0][0], rtol=1e-12, atol=1e-12)


def test_plain_modules_take_cu_seqlens_and_padding():
    lengths = [3, 9]
    q, k, v = _packed_qkv(lengths, lengths, 2, 4, seed=3)
    cu = _cu(_bounds(lengths))
    for module in (DilatedAttention((4,), (2,), causal=True), BlockSparseAttention(local_window(2), block_size=4)):
        out = module(q, k, v, cu_seqlens=cu)
        for a, b in zip(cu.tolist(), cu[1:].tolist()):
            torch.testing.assert_close(out[:, :, a:b], module(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]),
                                       rtol=0, atol=0)
        mask = torch.zeros(1, 12, dtype=torch.bool)
        mask[:, :3] = True
        padded = module(q, k, v, key_padding_mask=mask)
        torch.testing.assert_close(padded[:, :, 3:], module(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:]), rtol=0, atol=0)


def test_module_without_packed_support_refuses_cu_seqlens():
    from dilcompile.multihead import MultiheadAttentionBase

    class Plain(MultiheadAttentionBase):
        def attend(self, q, k, v, *, is_causal, key_padding_mask):
            return q

    with pytest.raises(ValueError, match="takes no cu_seqlens"):
        Plain(8, 2)(torch.randn(1, 5, 8), cu_seqlens=_cu([0, 5]))


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_a_batch_without_pads_equals_the_plain_batched_call(impl, device):
    """Rows of one length run as one batched call inside the op (varlen._equal_lengths)."""
    config = dict(segment_lengths=(4, 8), dilation_rates=(1, 2), causal=True, mode="longnet")
    q, k, v = random_qkv(3, 2, 13, 4, device=device, requires_grad=True, seed=8)
    no_pads = torch.zeros(3, 13, dtype=torch.bool, device=device)
    call = _dilated_call(config, impl)
    got, want = call(q, k, v, key_padding_mask=no_pads), call(q, k, v)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    cotangents = _cotangents(got, seed=1)
    for g, w in zip(torch.autograd.grad(_loss(got, cotangents), (q, k, v)),
                    torch.autograd.grad(_loss(want, cotangents), (q, k, v))):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("index", [0, 2])
def test_cached_generation_of_left_padded_rows_equals_each_row_alone(index):
    """Prefill then decode with a KV cache, rows of different prompt lengths
    left-padded: at every real token each row gives what it gives alone (the
    queries are the last Nq positions; the mask covers every cached key)."""
    from dilcompile.kv_cache import KVCache

    mha = _module_cases()[index]
    prompts = [torch.randn(1, n, 16, dtype=torch.float64) for n in (9, 4)]
    steps = torch.randn(2, 3, 16, dtype=torch.float64)  # three generated tokens per row
    width = max(p.shape[1] for p in prompts)
    x = torch.cat([torch.cat([torch.zeros(1, width - p.shape[1], 16, dtype=torch.float64), p], 1) for p in prompts])
    pads = torch.tensor([[i < width - p.shape[1] for i in range(width)] for p in prompts])
    cache = KVCache(1, 2, mha.num_heads, width + 3, mha.head_dim, dtype=torch.float64)
    got = [mha(x, key_padding_mask=pads, is_causal=True, cache=cache)[0]]
    for t in range(3):
        mask = torch.cat([pads, torch.zeros(2, t + 1, dtype=torch.bool)], 1)
        got.append(mha(steps[:, t : t + 1], key_padding_mask=mask, is_causal=True, cache=cache,
                       start_pos=width + t)[0])
    for b, prompt in enumerate(prompts):
        alone_cache = KVCache(1, 1, mha.num_heads, prompt.shape[1] + 3, mha.head_dim, dtype=torch.float64)
        want = [mha(prompt, is_causal=True, cache=alone_cache)[0]]
        for t in range(3):
            want.append(mha(steps[b : b + 1, t : t + 1], is_causal=True, cache=alone_cache,
                            start_pos=prompt.shape[1] + t)[0])
        torch.testing.assert_close(got[0][b, ~pads[b]], want[0][0], rtol=1e-12, atol=1e-12)
        for g, w in zip(got[1:], want[1:]):
            torch.testing.assert_close(g[b], w[0], rtol=1e-12, atol=1e-12)
