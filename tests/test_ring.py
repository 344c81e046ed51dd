"""Sequence-parallel dilated attention: real multi-process gloo runs (P = 2, 4)
against the single-device float64 reference on the full sequence, outputs and
all gradients; the exchange plan; bad input."""

import json
import os
import traceback

import pytest
import torch
import torch.distributed as dist

from dilcompile import dilated_attention
from dilcompile.dilated.geometry import multiplicity, plan_parts
from dilcompile.distributed import RingDilatedAttention, ring_dilated_attention
from dilcompile.distributed.plan import plan_exchange
from dilcompile.distributed.plan import choose_transport, split_sizes
from dilcompile.testing import assert_within_low_precision_budget, masked_attention_plain
from dilcompile.testing.process_group import leave_together

from ranks import TIMEOUT, rendezvous, start_ranks

# (shard_lengths, heads, segments, rates, mode): every case runs causal and not.
CASES = {
    2: [
        ((24, 24), 4, (8, 16, 48), (1, 2, 4), "longnet"),  # local / boundary inside [16, 32) / whole sequence
        ((13, 20), 3, (5, 12, 40), (1, 3, 2), "longnet"),  # N = 33 not divisible by P, w % r != 0
        ((16, 16), 5, (6, 64), (2, 3), "groups"),  # seed-system groups, w > N clamped
    ],
    4: [
        ((16, 16, 16, 16), 4, (16, 32, 64), (1, 2, 4), "longnet"),  # LongNet layout: 1, 2 and 4 ranks per segment
        ((12, 13, 12, 13), 5, (7, 20, 100), (2, 3, 5), "longnet"),  # uneven, H % r != 0, segments across 3 ranks
        ((9, 0, 17, 6), 2, (10, 32), (1, 3), "longnet"),  # an empty shard, one 32-row segment across 3 ranks
    ],
}


def _check_case(rank, lengths, heads, segments, rates, mode, causal, seed, transport, pass_lengths=True):
    """Max errors of this rank's output shard and gradient shards vs the float64 reference.
    ``pass_lengths=False``: the ranks learn each other's (uneven) shard lengths themselves."""
    gen = torch.Generator().manual_seed(seed)
    n, b, d = sum(lengths), 2, 8
    q, k, v, grad = (torch.randn(b, heads, n, d, generator=gen, dtype=torch.float64) for _ in range(4))
    kw = dict(segment_lengths=segments, dilation_rates=rates, causal=causal, mode=mode)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = dilated_attention(*full, impl="reference", **kw)
    ref_grads = torch.autograd.grad(ref, full, grad)

    s = sum(lengths[:rank])
    rows = slice(s, s + lengths[rank])
    shard = [t[:, :, rows].clone().requires_grad_() for t in (q, k, v)]
    out = ring_dilated_attention(*shard, shard_lengths=lengths if pass_lengths else None, transport=transport, **kw)
    grads = torch.autograd.grad(out, shard, grad[:, :, rows])
    errors = {"out": (out - ref[:, :, rows]).abs().max().item() if out.numel() else 0.0}
    for name, g, w in zip(("dq", "dk", "dv"), grads, ref_grads):
        errors[name] = (g - w[:, :, rows]).abs().max().item() if g.numel() else 0.0
    errors["nan"] = bool(out.isnan().any() or any(g.isnan().any() for g in grads))
    return errors


def _check_low_precision(rank, lengths, heads, segments, rates, causal, dtype, transport):
    """bfloat16 / float32 shards: the error budget of the single-device kernels
    (at most 2x a plain PyTorch implementation in the same dtype, vs float64)."""
    gen = torch.Generator().manual_seed(5)
    n = sum(lengths)
    q, k, v, grad = (torch.randn(1, heads, n, 16, generator=gen, dtype=torch.float64) for _ in range(4))
    kw = dict(segment_lengths=segments, dilation_rates=rates, causal=causal)
    count = multiplicity(plan_parts(heads, segments, rates, "longnet"), heads, n, causal)
    s = sum(lengths[:rank])
    rows = slice(s, s + lengths[rank])
    results = {}
    for name, fn, inputs in (
        ("ref", lambda a, b, c: dilated_attention(a, b, c, impl="reference", **kw), (q, k, v)),
        ("plain", lambda a, b, c: masked_attention_plain(a, b, c, count, 16**-0.5),
         (q.to(dtype), k.to(dtype), v.to(dtype))),
        ("ring", lambda a, b, c: ring_dilated_attention(a, b, c, shard_lengths=lengths, transport=transport, **kw),
         tuple(t[:, :, rows].to(dtype) for t in (q, k, v))),
    ):
        # The loss is <grad, output> over the whole sequence: each rank feeds its rows' share.
        inputs = [t.clone().requires_grad_() for t in inputs]
        out = fn(*inputs)
        share = grad[:, :, rows] if name == "ring" else grad
        grads = torch.autograd.grad(out, inputs, share.to(out.dtype))
        if name != "ring":
            out, grads = out[:, :, rows], [g[:, :, rows] for g in grads]
        results[name] = (out, *grads)
    failures = []
    for i, label in enumerate(("out", "dq", "dk", "dv")):
        try:
            assert_within_low_precision_budget(results["ring"][i], results["plain"][i], results["ref"][i])
        except AssertionError as e:
            failures.append(f"{dtype} {label}: {e}")
    return failures


def _wrong_shard_lengths_message(rank, world):
    """Only rank 0 passes a wrong ``shard_lengths`` (the others pass None):
    every rank must raise ValueError, and the group must still work after."""
    lengths = CASES[world][1][0]
    wrong = (lengths[0] + 1, *lengths[1:])
    q = torch.randn(1, 2, lengths[rank], 4, dtype=torch.float64)
    kw = dict(segment_lengths=(8, 32), dilation_rates=(1, 2))
    try:
        ring_dilated_attention(q, q, q, shard_lengths=wrong if rank == 0 else None, **kw)
        message = None
    except ValueError as e:
        message = str(e)
    ring_dilated_attention(q, q, q, **kw)  # the ranks are still in step
    return message


def _worker(rank, world, init_method, result_dir):
    report = {"rank": rank, "cases": [], "error": None}
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world, timeout=TIMEOUT)
        for i, (lengths, heads, segments, rates, mode) in enumerate(CASES[world]):
            for causal in (False, True):
                for transport in ("all_to_all", "ring"):
                    seed = 100 * i + causal
                    errors = _check_case(rank, lengths, heads, segments, rates, mode, causal, seed, transport)
                    report["cases"].append({"case": i, "causal": causal, "transport": transport, **errors})
        # Uneven (and empty) shards without shard_lengths: the lengths are gathered inside the op.
        report["uneven_unspecified"] = []
        for i in range(1, len(CASES[world])):
            transport = "ring" if i == 2 else "all_to_all"
            errors = _check_case(rank, *CASES[world][i], True, 100 * i + 1, transport, pass_lengths=False)
            report["uneven_unspecified"].append({"case": i, **errors})
        report["wrong_lengths"] = _wrong_shard_lengths_message(rank, world)
        report["low_precision"] = []
        for dtype in (torch.bfloat16, torch.float32):
            # Cases with a rate-1 branch: every row is covered, so the plain yardstick has no NaN gradients.
            case = CASES[2][1] if world == 2 else CASES[4][0]
            transport = "all_to_all" if world == 2 else "ring"
            report["low_precision"] += _check_low_precision(rank, *case[:4], world == 4, dtype, transport)
        # The module on the default group, equal shards (shard_lengths gathered).
        lengths, heads, segments, rates, mode = CASES[world][0]
        gen = torch.Generator().manual_seed(7)
        q, k, v = (torch.randn(1, heads, sum(lengths), 8, generator=gen, dtype=torch.float64) for _ in range(3))
        s = sum(lengths[:rank])
        ring = RingDilatedAttention(segments, rates, causal=True)  # transport "auto"
        out = ring(*(t[:, :, s : s + lengths[rank]] for t in (q, k, v)))
        ref = dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, causal=True, impl="reference")
        report["module_err"] = (out - ref[:, :, s : s + lengths[rank]]).abs().max().item()
        if world == 2:  # compiled, uneven shards, no shard_lengths: one graph node, the gather runs inside it
            lengths = CASES[2][1][0]
            s = sum(lengths[:rank])
            q, k, v = (torch.randn(1, heads, sum(lengths), 8, generator=gen, dtype=torch.float64) for _ in range(3))
            compiled = torch.compile(ring, fullgraph=True)
            shard = [t[:, :, s : s + lengths[rank]].clone().requires_grad_() for t in (q, k, v)]
            out = compiled(*shard)
            grads = torch.autograd.grad(out.sum(), shard)
            full = [t.clone().requires_grad_() for t in (q, k, v)]
            ref = dilated_attention(*full, segment_lengths=segments, dilation_rates=rates, causal=True,
                                    impl="reference")
            ref_grads = torch.autograd.grad(ref.sum(), full)
            report["compiled_err"] = max((a - b[:, :, s : s + lengths[rank]]).abs().max().item()
                                         for a, b in zip((out, *grads), (ref, *ref_grads)))
        leave_together()  # every rank at once: see its doc
        report["initialized_after_teardown"] = dist.is_initialized()
    except Exception:
        report["error"] = traceback.format_exc()
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


@pytest.mark.parametrize("world", [2, 4])
def test_ring_matches_single_device_reference_with_gradients(world, tmp_path):
    start_ranks(_worker, (world, rendezvous(tmp_path), str(tmp_path)), world)
    for rank in range(world):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["error"] is None, report["error"]
        assert len(report["cases"]) == 4 * len(CASES[world])
        for case in report["cases"]:
            assert not case["nan"], case
            for name in ("out", "dq", "dk", "dv"):
                assert case[name] < 1e-10, (rank, case)
        assert len(report["uneven_unspecified"]) == len(CASES[world]) - 1
        for case in report["uneven_unspecified"]:
            assert not case["nan"], case
            for name in ("out", "dq", "dk", "dv"):
                assert case[name] < 1e-10, (rank, case)
        assert report["wrong_lengths"] is not None, rank
        assert "shard_lengths[0]" in report["wrong_lengths"] and "on rank 0" in report["wrong_lengths"]
        assert report["module_err"] < 1e-10
        assert not report["low_precision"], report["low_precision"]
        if world == 2:
            assert report["compiled_err"] < 1e-10
        assert report["initialized_after_teardown"] is False


def _parts(heads, segments, rates, mode="longnet"):
    return plan_parts(heads, segments, rates, mode)


def test_segments_inside_shards_communicate_nothing():
    ex = plan_exchange(_parts(4, (8, 16), (1, 2)), (32, 32, 32), False)
    assert ex.empty
    assert all(not plan.requests for plan in ex.plans)


def test_causal_fetches_only_from_earlier_ranks():
    parts = _parts(4, (64,), (2,))
    for causal in (False, True):
        ex = plan_exchange(parts, (16, 16, 16, 16), causal)
        for src, row in enumerate(ex.counts):
            for dst, counts in enumerate(row):
                if causal and src > dst:
                    assert sum(counts) == 0
                if not causal and src != dst:
                    assert sum(counts) == 2 * 8  # 8 kept rows of the source shard, for each of the 2 parts


def test_received_volume_constant_in_n_for_fixed_segment_and_rate():
    # LongNet's claim: a branch (w, r) costs each rank O(w / r) rows, whatever N.
    parts = _parts(8, (256, 2048), (1, 8))
    received = []
    for world in (8, 16, 32):
        ex = plan_exchange(parts, (256,) * world, False)
        received.append(sum(split_sizes(ex, 0, 1, 64)[1]))
    assert received[0] > 0 and len(set(received)) == 1, received


def test_auto_transport_streams_weakly_dilated_long_branches():
    shards = (64,) * 8
    long_dense = plan_exchange(_parts(4, (512,), (1,)), shards, False)  # 448 fetched rows per head > 64
    long_sparse = plan_exchange(_parts(4, (512,), (16,)), shards, False)  # 28 fetched rows per head
    assert choose_transport(long_dense, "auto", 1, 4, 16) == "ring"
    assert choose_transport(long_sparse, "auto", 1, 4, 16) == "all_to_all"
    assert choose_transport(long_sparse, "ring", 1, 4, 16) == "ring"


def test_errors_before_compute():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="init_process_group"):
        ring_dilated_attention(q, q, q, segment_lengths=(4,), dilation_rates=(1,))
    with pytest.raises(ValueError, match="same length"):
        ring_dilated_attention(q, q, q, segment_lengths=(4, 8), dilation_rates=(1,))
    with pytest.raises(ValueError, match="transport"):
        ring_dilated_attention(q, q, q, segment_lengths=(4,), dilation_rates=(1,), transport="nccl")


def test_single_process_group_and_shard_length_check():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        q, k, v = (torch.randn(1, 3, 20, 4, dtype=torch.float64) for _ in range(3))
        kw = dict(segment_lengths=(6, 16), dilation_rates=(1, 2), causal=True)
        out = ring_dilated_attention(q, k, v, **kw)
        torch.testing.assert_close(out, dilated_attention(q, k, v, impl="reference", **kw), rtol=1e-10, atol=1e-10)
        with pytest.raises(ValueError, match=r"shard_lengths\[0\]"):
            ring_dilated_attention(q, k, v, shard_lengths=(19,), **kw)
        with pytest.raises(ValueError, match="1 non-negative ints"):
            ring_dilated_attention(q, k, v, shard_lengths=(10, 10), **kw)
    finally:
        dist.destroy_process_group()


def test_compiles_fullgraph_one_graph_over_n_sweep_and_opcheck():
    from torch._dynamo.utils import counters

    from dilcompile.distributed.ops import ring_dilated_fwd

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch._dynamo.reset()
    counters.clear()
    try:
        kw = dict(segment_lengths=(8, 32), dilation_rates=(1, 2), causal=True)
        def fn(q, k, v):
            return ring_dilated_attention(q, k, v, **kw)
        compiled = torch.compile(fn, fullgraph=True, dynamic=True)
        for n in (40, 64, 100):
            q, k, v = (torch.randn(1, 4, n, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
            got = torch.autograd.grad(compiled(q, k, v).square().sum(), (q, k, v))
            want = torch.autograd.grad(dilated_attention(q, k, v, impl="reference", **kw).square().sum(), (q, k, v))
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
        assert not counters["graph_break"], dict(counters["graph_break"])
        q, k, v = (torch.randn(1, 4, 40, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
        for claimed in ([40], []):  # shard_lengths given / gathered only
            args = (q, k, v, [8, 32], [1, 2], "longnet", True, 0.25, claimed, dist.group.WORLD.group_name, "auto")
            torch.library.opcheck(ring_dilated_fwd, args)
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()


def test_module_refuses_reference_impl_and_unknown_transport():
    with pytest.raises(ValueError, match="fused kernels"):
        RingDilatedAttention((8,), (1,), impl="reference")
    with pytest.raises(ValueError, match="transport"):
        RingDilatedAttention((8,), (1,), transport="p2p")


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_world_size_one_on_cuda_tensors_matches_reference_with_gradients(backend, dtype):
    """A one-rank group of each backend on CUDA tensors: float64 exact, bf16
    within 2x plain PyTorch's error (outputs and gradients)."""
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None)
    try:
        n, heads, segments, rates = 97, 5, (8, 32, 128), (1, 2, 4)
        kw = dict(segment_lengths=segments, dilation_rates=rates, causal=True)
        gen = torch.Generator(device="cuda").manual_seed(3)
        q64, k64, v64, grad = (torch.randn(1, heads, n, 16, generator=gen, device="cuda", dtype=torch.float64)
                               for _ in range(4))
        full = [t.clone().requires_grad_() for t in (q64, k64, v64)]
        ref = dilated_attention(*full, impl="reference", **kw)
        ref_grads = torch.autograd.grad(ref, full, grad)
        for transport in ("all_to_all", "ring"):
            shard = [t.to(dtype).requires_grad_() for t in (q64, k64, v64)]
            out = ring_dilated_attention(*shard, transport=transport, **kw)
            grads = torch.autograd.grad(out, shard, grad.to(dtype))
            if dtype == torch.float64:
                for got, want in zip((out, *grads), (ref, *ref_grads)):
                    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
                continue
            count = multiplicity(plan_parts(heads, segments, rates, "longnet"), heads, n, True).to("cuda")
            plain_in = [t.to(dtype).requires_grad_() for t in (q64, k64, v64)]
            plain = masked_attention_plain(*plain_in, count, 16**-0.5)
            plain_grads = torch.autograd.grad(plain, plain_in, grad.to(dtype))
            for got, p, want in zip((out, *grads), (plain, *plain_grads), (ref, *ref_grads)):
                assert_within_low_precision_budget(got, p, want)
    finally:
        dist.destroy_process_group()


def test_packed_input_is_refused_with_what_to_do_instead():
    q = torch.randn(1, 2, 8, 4)
    cu_seqlens = torch.tensor([0, 3, 8], dtype=torch.int32)
    kw = dict(segment_lengths=(4,), dilation_rates=(1,), cu_seqlens=cu_seqlens)
    with pytest.raises(ValueError, match=r"packed \(varlen\) input.*per document.*dilated_attention"):
        ring_dilated_attention(q, q, q, **kw)  # no process group: the packed input is what is named
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="cu_seqlens=None"):
            ring_dilated_attention(q, q, q, **kw)
        with pytest.raises(ValueError, match="cu_seqlens=None"):
            ring_dilated_attention(q, q, q, **{**kw, "cu_seqlens": [0, 8]})
        ring_dilated_attention(q, q, q, segment_lengths=(4,), dilation_rates=(1,), cu_seqlens=None)
    finally:
        dist.destroy_process_group()
