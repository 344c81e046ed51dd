"""impl="sdpa" past ``CHUNK_POSITIONS`` positions runs chunk by chunk (``impl/sdpa.chunks``): the
same forward and gradients as one call over every position (bitwise on the CPU; and the float64
reference), while what it holds besides q, k, v, out and lse is of a chunk's size. Threshold and
chunk size are set low here; at their defaults (past 2^20 positions, chunks of 2^18) the chunks are
what long sequences get."""

from __future__ import annotations

import random

import pytest
import torch

from dilcompile import dilated_attention
from dilcompile.dilated.geometry import op_parts
from dilcompile.dilated.impl import sdpa
from dilcompile.profile.memory import peak_bytes
from dilcompile.testing import random_qkv


def _random_case(seed: int) -> dict:
    """Segments that share a period (so that several chunks fit in N), rates 1–6 (beyond a
    segment too), either mode, causal or not, a key mask or none, N with a short last segment."""
    rng = random.Random(seed)
    base = rng.choice([3, 4, 5, 8])
    segments = sorted(rng.sample([base, 2 * base, 4 * base, 6 * base], rng.randint(1, 3)))
    mode = rng.choice(["longnet", "groups"])
    return dict(n=rng.randint(2 * segments[-1], 12 * segments[-1]) + rng.randint(0, segments[-1] - 1),
                heads=max(rng.randint(1, 5), len(segments) if mode == "groups" else 1), segments=segments,
                rates=[rng.randint(1, 6) for _ in segments], mode=mode, causal=rng.random() < 0.5,
                masked=rng.random() < 0.4, batch=rng.randint(1, 2), dim=rng.choice([8, 24]),
                limit=rng.randint(1, 4 * segments[-1]))


def _run(case: dict, dtype, seed: int, impl: str = "sdpa"):
    q, k, v = random_qkv(case["batch"], case["heads"], case["n"], case["dim"], dtype=dtype, requires_grad=True,
                         seed=seed)
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(case["batch"], case["n"], generator=gen) < 0.3 if case["masked"] else None
    out, lse = dilated_attention(q, k, v, segment_lengths=case["segments"], dilation_rates=case["rates"],
                                 causal=case["causal"], mode=case["mode"], impl=impl, return_lse=True, key_mask=mask)
    weights = torch.randn(out.shape, generator=gen, dtype=dtype)
    # an lse gradient too (finite rows only): the backward's extra term
    ((out * weights).sum() + torch.where(lse.isfinite(), lse, 0).sum()).backward()
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunked_call_equals_one_call_and_the_reference(seed, dtype, monkeypatch):
    case = _random_case(seed)
    whole = _run(case, dtype, seed)
    monkeypatch.setattr(sdpa, "CHUNK_POSITIONS", case["limit"])
    monkeypatch.setattr(sdpa, "CHUNK_SIZE", case["limit"])
    parts = op_parts(case["heads"], tuple(case["segments"]), tuple(case["rates"]), case["mode"])
    spans = sdpa.chunks(case["n"], parts)
    assert len(spans) > 1, case  # the case exercises chunks
    chunked = _run(case, dtype, seed)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), chunked, whole):
        assert torch.equal(a, b), f"{name} differs: {case}"
    if dtype == torch.float64:
        reference = _run(case, dtype, seed, impl="reference")
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), chunked, reference):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, equal_nan=True, msg=lambda m, n=name: f"{n}: {m}")


def test_chunks_are_whole_segments_of_every_branch():
    parts = op_parts(8, (2048, 4096, 8192), (1, 2, 4), "longnet")
    assert sdpa.chunks(1 << 20, parts) == [(0, 1 << 20)]  # at the threshold: one call, as before
    spans = sdpa.chunks(3 * (1 << 20) + 5, parts)  # past it: chunks of CHUNK_SIZE
    assert spans[0] == (0, 1 << 18) and spans[-1] == (3 * (1 << 20), 3 * (1 << 20) + 5) and len(spans) == 13
    assert all(end == nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    small = op_parts(2, (6, 4), (1, 2), "longnet")  # segments' least common multiple: 12
    assert sdpa.chunks(100, small, limit=30, size=30) == [(0, 24), (24, 48), (48, 72), (72, 96), (96, 100)]
    assert sdpa.chunks(50, small, limit=11, size=11) == [(0, 12), (12, 24), (24, 36), (36, 48), (48, 50)]
    assert sdpa.chunks(100, op_parts(2, (48, 64), (1, 2), "longnet"), limit=30, size=30) == [(0, 100)]  # 192 > N


def test_a_chunked_forward_holds_a_chunk_besides_its_result(monkeypatch):
    batch, heads, n, dim = 1, 2, 8192, 16
    q, k, v = random_qkv(batch, heads, n, dim, dtype=torch.float32, seed=0)

    def forward():
        return dilated_attention(q, k, v, segment_lengths=[64, 128, 256], dilation_rates=[1, 2, 4], impl="sdpa",
                                 return_lse=True)

    result = batch * heads * n * (dim + 1) * 4  # out and lse, float32
    whole = peak_bytes(forward, "cpu") - result
    monkeypatch.setattr(sdpa, "CHUNK_POSITIONS", n // 8)
    monkeypatch.setattr(sdpa, "CHUNK_SIZE", n // 8)
    chunked = peak_bytes(forward, "cpu") - result
    assert whole >= batch * heads * n * dim * 4  # one call holds buffers of the size of out
    assert chunked <= 2 * whole / 8, (chunked, whole)  # two chunks' worth at most (written in place), not N's


def test_chunked_ops_pass_opcheck_and_compile_fullgraph(monkeypatch):
    # the chunked results are built differently (filled chunk by chunk): their shapes, dtypes and strides
    # must still be what the ops' fake rules say, and a compiled call must equal the eager one
    monkeypatch.setattr(sdpa, "CHUNK_POSITIONS", 64)
    monkeypatch.setattr(sdpa, "CHUNK_SIZE", 64)
    q, k, v = random_qkv(1, 4, 200, 8, dtype=torch.float32, requires_grad=True, seed=3)
    mask = torch.rand(1, 200, generator=torch.Generator().manual_seed(3)) < 0.2
    args = (q, k, v, [16, 32], [1, 2], "longnet", True, 0.25, mask)
    assert len(sdpa.chunks(200, op_parts(4, (16, 32), (1, 2), "longnet"))) == 4
    torch.library.opcheck(torch.ops.dilcompile.dilated_fwd.default, args)
    out, lse = torch.ops.dilcompile.dilated_fwd(*args)
    bwd_args = (torch.randn_like(out), torch.randn_like(lse), q.detach(), k.detach(), v.detach(), out.detach(),
                lse.detach(), [16, 32], [1, 2], "longnet", True, 0.25, mask)
    torch.library.opcheck(torch.ops.dilcompile.dilated_bwd.default, bwd_args)

    def attend(q, k, v):
        return dilated_attention(q, k, v, segment_lengths=[16, 32], dilation_rates=[1, 2], causal=True, impl="sdpa",
                                 key_mask=mask)

    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    got, want = compiled(q, k, v), attend(q, k, v)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(got.sum(), (q, k, v)),
                                                 torch.autograd.grad(want.sum(), (q, k, v))))
