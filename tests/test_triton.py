"""impl="triton": the fused kernel against the float64 reference — forward,
lse and gradients (through out and lse), causal or not, both modes, padding,
awkward N, H not a multiple of r. On CPU the kernels run under
TRITON_INTERPRET=1 (tests/conftest.py), which is slow: shapes stay tiny."""

import random

import pytest
import torch
from torch._dynamo.utils import counters

from dilcompile import dilated_attention
from dilcompile.dilated.api import HAS_TRITON
from dilcompile.testing import assert_within_low_precision_budget, masked_attention_plain, random_qkv

pytestmark = [
    pytest.mark.skipif(not HAS_TRITON, reason="triton not installed (pip install 'dilcompile[triton]')"),
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),  # interpreter
]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (N, H, segments, rates, causal, mode, padded): w % r != 0, segments longer
# than N, short last segments, rows no branch covers (groups), tiles of 16 to 128.
CASES = [
    (37, 3, (8, 16), (1, 2), False, "longnet", False),
    (37, 3, (8, 16), (1, 2), True, "longnet", False),
    (29, 5, (12, 100), (1, 3), True, "longnet", True),
    (23, 5, (8, 16, 64), (1, 2, 3), False, "groups", False),
    (1000, 2, (256, 512, 1000), (1, 2, 4), False, "groups", True),  # 128-row tiles (docs/gpu.md)
]


def _run(q, k, v, segments, rates, causal, mode, impl, mask=None):
    return dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, causal=causal, mode=mode,
                             impl=impl, return_lse=True, key_padding_mask=mask)


def _random_case(seed: int) -> tuple:
    """(N, H, segments, rates, causal, mode, padded, B, D): up to four branches of
    any length and rate 1–6 (rates beyond segments too), head dims that are not
    powers of two, N from 1 to 200."""
    rng = random.Random(seed)
    m = rng.randint(1, 4)
    segments, rates = tuple(sorted(rng.sample(range(1, 200), m))), tuple(rng.randint(1, 6) for _ in range(m))
    mode = rng.choice(["longnet", "groups"])
    heads = max(rng.randint(1, 6), m if mode == "groups" else 1)
    return (rng.randint(1, 200), heads, segments, rates, rng.random() < 0.5, mode, rng.random() < 0.3,
            rng.randint(1, 2), rng.choice([8, 24, 40, 72]))


@pytest.mark.parametrize("seed", range(8))
def test_triton_matches_reference_on_random_configurations(seed):
    torch.manual_seed(seed)  # the mask and the incoming gradients
    _check_float32_with_gradients(*_random_case(seed), seed=seed)


@pytest.mark.parametrize("n, heads, segments, rates, causal, mode, padded", CASES)
def test_triton_matches_reference_float32_with_gradients(n, heads, segments, rates, causal, mode, padded):
    _check_float32_with_gradients(n, heads, segments, rates, causal, mode, padded)


def _check_float32_with_gradients(n, heads, segments, rates, causal, mode, padded, batch=1, head_dim=16, seed=None):
    q, k, v = random_qkv(batch, heads, n, head_dim, dtype=torch.float32, device=DEVICE, requires_grad=True, seed=seed)
    mask = (torch.rand(batch, n, device=DEVICE) < 0.3) if padded else None
    out, lse = _run(q, k, v, segments, rates, causal, mode, "triton", mask)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, ref_lse = _run(q64, k64, v64, segments, rates, causal, mode, "reference", mask)
    assert not out.isnan().any()
    covered = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), covered)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double()[covered], ref_lse[covered], rtol=1e-5, atol=1e-5)

    grad_out = torch.randn_like(ref)
    grad_lse = torch.randn_like(ref_lse) * covered
    def loss(o, l):
        return (o.double() * grad_out).sum() + (l.double().nan_to_num(0.0, 0.0, 0.0) * grad_lse).sum()
    got = torch.autograd.grad(loss(out, lse), (q, k, v))
    want = torch.autograd.grad(loss(ref, ref_lse), (q64, k64, v64))
    for name, g, w in zip("qkv", got, want):
        assert not g.isnan().any(), name
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5, msg=f"d{name}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_low_precision_within_twice_plain_pytorch_error(dtype):
    from dilcompile.dilated.geometry import multiplicity, plan_parts

    kw = dict(segment_lengths=(8, 32), dilation_rates=(1, 4), causal=True)
    q64, k64, v64 = random_qkv(1, 4, 40, 32)
    q, k, v = (t.to(DEVICE, dtype) for t in (q64, k64, v64))
    out = dilated_attention(q, k, v, impl="triton", **kw)
    ref = dilated_attention(q64, k64, v64, impl="reference", **kw)
    count = multiplicity(plan_parts(4, (8, 32), (1, 4)), 4, 40, True)
    plain = masked_attention_plain(q.cpu(), k.cpu(), v.cpu(), count, 32**-0.5)
    assert out.dtype == dtype
    assert_within_low_precision_budget(out.cpu(), plain, ref)


def test_triton_compiles_fullgraph_one_graph_over_n_sweep():
    torch._dynamo.reset()
    counters.clear()
    fn = lambda q, k, v: dilated_attention(q, k, v, segment_lengths=(8, 16), dilation_rates=(1, 2),  # noqa: E731
                                           causal=True, impl="triton")
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    for n in (20, 33):
        q, k, v = random_qkv(1, 2, n, 16, dtype=torch.float32, device=DEVICE, requires_grad=True)
        out = compiled(q, k, v)
        got = torch.autograd.grad(out.sum(), (q, k, v))
        want_out = fn(q, k, v)
        want = torch.autograd.grad(want_out.sum(), (q, k, v))
        torch.testing.assert_close(out, want_out)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"]
    torch._dynamo.reset()


def test_triton_refuses_what_it_cannot_serve():
    q, k, v = random_qkv(1, 2, 8, 8, dtype=torch.float64, device=DEVICE)
    with pytest.raises(TypeError, match="impl='triton'.*float64|float64.*impl='triton'|impl='sdpa'"):
        dilated_attention(q, k, v, segment_lengths=(4,), dilation_rates=(1,), impl="triton")
    q, k, v = random_qkv(1, 2, 8, 320, dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="head_dim"):
        dilated_attention(q, k, v, segment_lengths=(4,), dilation_rates=(1,), impl="triton")


@pytest.mark.parametrize("causal, masked, packed", [(False, False, False), (True, True, False), (False, True, False),
                                                    (True, False, True)])
def test_first_branch_writes_every_row_of_unset_buffers(causal, masked, packed, monkeypatch):
    # Rate 1 first (LongNet mode): its launches write the fp32 buffers whole instead of adding to
    # zero-filled ones. Left unset they hold anything: here NaN, which any row left unwritten (a key
    # the key mask removes, a short last segment, a packed document's edge) would carry out.
    from dilcompile.dilated.impl import triton as launcher

    poisoned = []
    monkeypatch.setattr(launcher, "_unset", lambda shape, device, dtype=torch.float32: poisoned.append(shape) or
                        torch.full(shape, float("nan"), device=device, dtype=dtype))
    segments, rates = (8, 20, 64), (1, 2, 4)
    assert launcher.first_branch_covers_all(segments, rates, "longnet")
    assert not launcher.first_branch_covers_all(segments, rates, "groups")
    assert not launcher.first_branch_covers_all((8, 20), (2, 1), "longnet")
    n, heads = 75, 3
    q, k, v = random_qkv(1, heads, n, 16, dtype=torch.float32, device=DEVICE, requires_grad=True, seed=1)
    mask = (torch.rand(1, n, generator=torch.Generator().manual_seed(1)) < 0.3).to(DEVICE) if masked else None
    kw = dict(segment_lengths=segments, dilation_rates=rates, causal=causal, return_lse=True)
    if packed:
        cu = torch.tensor([0, 1, 30, 30, 75], dtype=torch.int32, device=DEVICE)
        out, lse = dilated_attention(q, k, v, impl="triton", cu_seqlens=cu, **kw)
        ref, ref_lse = dilated_attention(q, k, v, impl="sdpa", cu_seqlens=cu, **kw)
    else:
        out, lse = dilated_attention(q, k, v, impl="triton", key_mask=mask, **kw)
        ref, ref_lse = dilated_attention(q, k, v, impl="reference", key_mask=mask, **kw)
    grads = torch.autograd.grad((out * ref.detach()).sum() + lse.nan_to_num(0, 0, 0).sum(), (q, k, v))
    want = torch.autograd.grad((ref * ref.detach()).sum() + ref_lse.nan_to_num(0, 0, 0).sum(), (q, k, v))
    assert len(poisoned) == (3 if masked else 5)  # out and lse, dq, and dk, dv but where a key mask skips keys
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(lse.isfinite(), ref_lse.isfinite())
    for name, g, w in zip("qkv", grads, want):
        assert not g.isnan().any(), name
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, msg=f"d{name}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_half_out_merges_into_the_output_dtype_within_the_low_precision_budget(seed, dtype, monkeypatch):
    # half_out (forward, half inputs): every branch merges straight into an output of q's dtype, so no
    # fp32 buffer of the output's size exists and no cast runs — a candidate, off until timed faster
    # (work.KernelConfig.half_out), switched on here per call. It rounds once per branch instead of once
    # at the end: on random LongNet configurations (causal or not, key masks) within the low-precision
    # rule against the float64 reference, like the fp32 merge; with one branch, bitwise the fp32 merge's.
    # Triton's interpreter casts fp32 to bf16 toward zero where the GPU rounds to nearest even (fp16 it
    # rounds as the GPU does): there the rule is checked in fp16 and bf16 only bitwise, against a
    # truncated fp32 merge.
    from dilcompile.dilated.geometry import multiplicity, plan_parts
    from dilcompile.dilated.impl import triton as launcher
    from dilcompile.dilated.work import KernelConfig

    n, heads, segments, rates, causal, _, padded, _, dim = _random_case(300 + seed)
    rounds_as_the_gpu = DEVICE == "cuda" or dtype == torch.float16
    q64, k64, v64 = random_qkv(1, heads, n, dim, seed=seed)
    q, k, v = (t.to(DEVICE, dtype) for t in (q64, k64, v64))
    mask = (torch.rand(1, n, generator=torch.Generator().manual_seed(seed)) < 0.3) if padded else None
    buffers = []  # (shape, dtype, the buffer) of every buffer the forward allocates

    def spy(real):
        def allocate(shape, device, dtype=torch.float32):
            buffers.append((tuple(shape), dtype, real(shape, device, dtype)))
            return buffers[-1][-1]
        return allocate

    for name in ("_unset", "_zeros"):
        monkeypatch.setattr(launcher, name, spy(getattr(launcher, name)))

    def forward(half, segments=segments, rates=rates):
        buffers.clear()
        options = {"fwd": KernelConfig(32, 16, 4, 2, half_out=half)}
        mask_ = None if mask is None else mask.to(DEVICE)
        return launcher.dilated_forward_triton(q, k, v, list(segments), list(rates), "longnet", causal, dim ** -0.5,
                                               mask_, kernel_options=options)

    out, lse = forward(True)
    assert out.dtype == dtype and (q.shape, torch.float32) not in [b[:2] for b in buffers]
    fp32_merged, fp32_lse = forward(False)
    assert (q.shape, torch.float32) in [b[:2] for b in buffers]
    torch.testing.assert_close(lse, fp32_lse, rtol=1e-6, atol=1e-6)  # the lse merges in fp32 either way
    ref, ref_lse = dilated_attention(q64, k64, v64, segment_lengths=segments, dilation_rates=rates, causal=causal,
                                     key_mask=mask, impl="reference", return_lse=True)
    count = multiplicity(plan_parts(heads, segments, rates), heads, n, causal)
    if mask is not None:
        count = count * ~mask[0]
    plain = masked_attention_plain(q.cpu(), k.cpu(), v.cpu(), count, dim ** -0.5)
    assert_within_low_precision_budget(fp32_merged.cpu(), plain, ref[0])
    if rounds_as_the_gpu:
        assert_within_low_precision_budget(out.cpu(), plain, ref[0])
    one = forward(True, segments[:1], (1,))[0]
    forward(False, segments[:1], (1,))
    fp32 = next(b for shape, dtype_, b in buffers if shape == q.shape and dtype_ == torch.float32)
    if not rounds_as_the_gpu:  # toward zero: the low 16 bits dropped, after which the cast is exact
        fp32 = (fp32.view(torch.int32) & ~0xFFFF).view(torch.float32)
    assert torch.equal(one, fp32.to(dtype))


def _impl(q, k, v, grad, segments, rates, causal, mode, options, mask=None, cu=None, grad_lse=True):
    """out, lse, dq, dk, dv of the launcher's functions with ``kernel_options`` (the
    groups-mode 1/m not applied: the public function applies it)."""
    from dilcompile.dilated.impl.triton import dilated_backward_triton, dilated_forward_triton

    args = (list(segments), list(rates), mode, causal, q.shape[-1] ** -0.5, mask, cu)
    out, lse = dilated_forward_triton(q, k, v, *args, kernel_options=options)
    g_lse = lse.isfinite().float() if grad_lse else None
    return (out, lse, *dilated_backward_triton(grad, g_lse, q, k, v, out, lse, *args, kernel_options=options))


def _assert_same_results(got, want):
    """out, lse, dq, dk, dv of two ``_impl`` runs: bitwise in the interpreter (the same values reach the
    same arithmetic), to fp32 rounding on a GPU (its compiler may contract differently)."""
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        if DEVICE == "cpu":
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), name
        else:
            torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m, name=name: f"{name}: {m}")


def _reference(q, k, v, mode, segments, **kw):
    """The float64 reference before the groups-mode 1/m, as ``_impl`` returns it."""
    out = dilated_attention(*(t.double() for t in (q, k, v)), impl="reference", mode=mode,
                            segment_lengths=segments, **kw)
    return out * (len(segments) if mode == "groups" else 1)


@pytest.mark.parametrize("seed", range(4))
def test_full_blocks_without_masks_equal_the_masked_walk(seed):
    # FULL_BLOCKS (forward, dq): the key blocks every row of a tile sees whole are walked without
    # building a mask, the rest with it — a tuning candidate, off until timed faster
    # (work.KernelConfig.full_blocks), switched on here per call (kernel_options) at a random tile and
    # walk. On random configurations (causal diagonals, short last segments, packed documents): equal
    # to the masked walk and to the float64 reference. Bitwise in the interpreter (the same arithmetic
    # where every key counts); on the GPU to fp32 rounding: an H200 gave last-bit differences (-7.2537e-3
    # against -7.2536e-3), as a compiler's contraction of the score scaling and the max subtraction into
    # one FMA would where no mask's select sits between them (the instruction stream was not read).
    from dilcompile.dilated.work import KernelConfig

    n, heads, segments, rates, causal, mode, _, batch, dim = _random_case(100 + seed)
    q, k, v = random_qkv(batch, heads, n, dim, dtype=torch.float32, device=DEVICE, seed=seed)
    grad = torch.randn(batch, heads, n, dim, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    cu = None
    if seed % 3 == 2:  # packed documents: segments from the device table
        q, k, v, grad = (t[:1] for t in (q, k, v, grad))
        cu = torch.tensor([0, n // 3, n // 3, n], dtype=torch.int32, device=DEVICE)
    rng = random.Random(seed)
    tile = rng.choice([16, 32, 64])
    walk = rng.choice([t for t in (16, 32, 64) if t <= tile])

    def run(full):
        config = KernelConfig(tile, walk, 4, 2, full_blocks=full)
        options = {"fwd": config, "dq": config, "dkdv": KernelConfig(tile, walk, 4, 2)}
        return _impl(q, k, v, grad, segments, rates, causal, mode, options, cu=cu)

    unmasked, masked = run(True), run(False)
    _assert_same_results(unmasked, masked)
    ref = _reference(q, k, v, mode, segments, dilation_rates=rates, causal=causal, cu_seqlens=cu)
    torch.testing.assert_close(unmasked[0].double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_keys_through_tensor_descriptors_equal_the_strided_loads(seed):
    # TMA: the walked rows (forward, dq: keys and values; dk/dv: queries and output gradients) load
    # through tensor descriptors over the class's rows (Hopper's TMA) — a tuning candidate, off until
    # timed faster (work.KernelConfig.tma), switched on here per call, with whole blocks unmasked or not
    # and dq by atomic adds or not. On random configurations (causal, key masks,
    # packed documents, head dims 8 to 72) out, lse and the gradients equal the strided loads': bitwise
    # in the interpreter (the same values reach the same arithmetic), to fp32 rounding on a GPU. Keys the
    # mask removes hold NaN here: a descriptor loads them, and they must read as 0 as a masked load's do.
    from dilcompile.dilated.work import KernelConfig, tma_fits

    n, heads, segments, rates, causal, mode, padded, batch, dim = _random_case(400 + seed)
    q, k, v = random_qkv(batch, heads, n, dim, dtype=torch.float32, device=DEVICE, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, n, generator=generator) < 0.3).to(DEVICE) if padded or seed == 0 else None
    if mask is not None:
        k, v = (t.masked_fill(mask[:, None, :, None], float("nan")) for t in (k, v))
    grad = torch.randn(batch, heads, n, dim, generator=generator).to(DEVICE)
    cu = None
    if seed == 3:  # packed documents: segments from the device table
        q, k, v, grad, mask = q[:1], k[:1], v[:1], grad[:1], None
        cu = torch.tensor([0, n // 3, n // 3, n], dtype=torch.int32, device=DEVICE)
    assert tma_fits(dim, torch.float32, 90)
    rng = random.Random(seed)
    tile = rng.choice([16, 32, 64])
    walk = rng.choice([t for t in (16, 32, 64) if t <= tile])
    whole = rng.random() < 0.5

    def run(tma):
        config = KernelConfig(tile, walk, 4, 2, full_blocks=whole, tma=tma)
        options = {"fwd": config, "dq": config, "dkdv": KernelConfig(tile, walk, 4, 2, atomic_dq=seed == 1, tma=tma)}
        return _impl(q, k, v, grad, segments, rates, causal, mode, options, mask, cu=cu)

    described, strided = run(True), run(False)
    _assert_same_results(described, strided)
    assert not any(t.isnan().any() for t in described), "a removed key's NaN leaked"
    ref = _reference(q, k.nan_to_num(), v.nan_to_num(), mode, segments, dilation_rates=rates, causal=causal,
                     key_mask=mask, cu_seqlens=cu)
    torch.testing.assert_close(described[0].double(), ref, rtol=1e-5, atol=1e-5)


def test_tma_stays_off_for_tensors_that_do_not_start_on_16_bytes(monkeypatch):
    # A tensor descriptor's base must sit on 16 bytes: views that start 4 bytes into their storage
    # load as without the candidate, with the same result.
    from dilcompile.dilated.impl import triton as launcher
    from dilcompile.dilated.work import KernelConfig

    seen, real = [], launcher.launch_flags
    monkeypatch.setattr(launcher, "launch_flags", lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1])
    q, k, v = random_qkv(1, 2, 40, 16, dtype=torch.float32, device=DEVICE, seed=0)
    shifted = [torch.empty(t.numel() + 1, device=DEVICE)[1:].view_as(t).copy_(t) for t in (q, k, v)]
    args = ([8, 16], [1, 2], "longnet", False, 0.25)
    options = {"fwd": KernelConfig(16, 16, 4, 2, tma=True)}
    aligned = launcher.dilated_forward_triton(q, k, v, *args, kernel_options=options)
    assert [f["TMA"] for f in seen] == [True, True]
    seen.clear()
    unaligned = launcher.dilated_forward_triton(*shifted, *args, kernel_options=options)
    assert shifted[0].storage_offset() == 1 and [f["TMA"] for f in seen] == [False, False]
    assert torch.equal(aligned[0], unaligned[0]) and torch.equal(aligned[1], unaligned[1])


@pytest.mark.parametrize("seed", range(4))
def test_dq_by_atomic_adds_in_the_dkdv_kernel_equals_the_dq_kernel(seed, monkeypatch):
    # ATOMIC_DQ: the dk/dv kernel also adds each key tile's dS K into dq and the dq kernel is not
    # launched (FlashAttention-2's backward) — a tuning candidate, off until timed faster
    # (work.KernelConfig.atomic_dq), switched on here per call (kernel_options). The sum order differs
    # from the dq kernel's: equal to fp32 rounding, and to the float64 reference; dk and dv bitwise.
    from dilcompile.dilated.impl import triton as launcher
    from dilcompile.dilated.work import KernelConfig

    n, heads, segments, rates, causal, mode, padded, batch, dim = _random_case(200 + seed)
    q, k, v = random_qkv(batch, heads, n, dim, dtype=torch.float32, device=DEVICE, seed=seed)
    mask = (torch.rand(batch, n, generator=torch.Generator().manual_seed(seed)) < 0.3).to(DEVICE) if padded else None
    grad = torch.randn(batch, heads, n, dim, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    launched = []
    real = launcher.wrap_triton
    monkeypatch.setattr(launcher, "wrap_triton", lambda kernel: launched.append(kernel.__name__) or real(kernel))
    tile = random.Random(seed).choice([16, 32, 64])

    def grads(atomic):
        launched.clear()
        options = {"dkdv": KernelConfig(tile, 16, 4, 2, atomic_dq=atomic)}
        return _impl(q, k, v, grad, segments, rates, causal, mode, options, mask, grad_lse=False)[2:], set(launched)

    (dq, dk, dv), kernels = grads(True)
    (dq_plain, dk_plain, dv_plain), plain_kernels = grads(False)
    assert "_dq_kernel" not in kernels and "_dq_kernel" in plain_kernels
    assert torch.equal(dk, dk_plain) and torch.equal(dv, dv_plain)
    torch.testing.assert_close(dq, dq_plain, rtol=1e-5, atol=1e-6)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = _reference(q64, k64, v64, mode, segments, dilation_rates=rates, causal=causal, key_mask=mask)
    want = torch.autograd.grad(out, (q64, k64, v64), grad.double())
    torch.testing.assert_close(dq.double(), want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dk.double(), want[1], rtol=1e-4, atol=1e-5)


def test_an_eager_call_launches_the_branch_kernels_and_little_else(monkeypatch):
    # At small N a call is launches and host work: the head-class table is kept per (heads, branches,
    # mode, device), so after the first call a forward launches one kernel per branch and nothing else,
    # a backward two per branch plus Δ's mul and sum. A fake q (a trace's eager run) gets a table of its
    # own, which is not kept. The kernels are recorded, not run (on CUDA too).
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from dilcompile.dilated.impl import triton as launcher

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.run = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.run.append(str(func))
            return func(*args, **(kwargs or {}))

    launches, tables = [], []

    class Recorded:  # wrap_triton(kernel)[grid](*args, **meta), recorded instead of run
        def __init__(self, kernel):
            self.name, self.offsets = kernel.__name__, kernel.arg_names.index("OFFSETS")

        def __getitem__(self, grid):
            return lambda *args, **meta: (launches.append(self.name), tables.append(args[self.offsets]))

    monkeypatch.setattr(launcher, "wrap_triton", Recorded)
    monkeypatch.setattr(launcher, "_eager_offset_table", launcher.functools.lru_cache(
        launcher._eager_offset_table.__wrapped__))  # empty, and left as it was after the test
    config = ([16, 32, 64, 128], [1, 2, 4, 8], "longnet", False, 0.25)
    q, k, v = random_qkv(1, 6, 128, 8, dtype=torch.float32, device=DEVICE, seed=5)
    with FakeTensorMode() as fake:
        launcher.dilated_forward_triton(*(fake.from_tensor(t) for t in (q, k, v)), *config)
    assert launcher._eager_offset_table.cache_info().currsize == 0
    for _ in range(2):
        with Ops() as forward:
            out, lse = launcher.dilated_forward_triton(q, k, v, *config)
        with Ops() as backward:
            launcher.dilated_backward_triton(out, None, q, k, v, out, lse, *config)
    allocations = {"aten.empty.memory_format", "aten.new_empty.default"}
    assert [op for op in forward.run if op not in allocations] == []
    assert sorted(op for op in backward.run if op not in allocations) == ["aten.mul.Tensor", "aten.sum.dim_IntList"]
    assert launches[-12:] == ["_fwd_kernel"] * 4 + ["_dq_kernel", "_dkdv_kernel"] * 4
    assert all(table is tables[-1] for table in tables[4:])  # one table, kept (the fake call's four came first)
    torch.testing.assert_close(tables[-1].cpu(), launcher._offset_table(6, *config[:3], "cpu"))
