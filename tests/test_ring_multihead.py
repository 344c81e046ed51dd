"""RingMultiheadDilatedAttention on P = 2 gloo ranks equals
MultiheadDilatedAttention on the full sequence with the same state_dict:
outputs, input gradients and parameter gradients (all-reduced), on equal and
uneven shards (the module takes no shard_lengths: the ranks gather them); the
factory's "ring" kind and the seed-compat ring class inside a real group."""

import json
import os
import traceback
import warnings

import torch
import torch.distributed as dist

from dilcompile import MultiheadDilatedAttention, compat, create_multihead_attention
from dilcompile.distributed import RingMultiheadDilatedAttention
from dilcompile.testing.process_group import leave_together

from ranks import TIMEOUT, rendezvous, start_ranks

WORLD, LENGTHS, E, H = 2, (24, 24), 32, 4
UNEVEN = (13, 20)  # N = 33: the boundary inside the 16-row segment [16, 32)
EMPTY = (0, 33)  # rank 0 holds no rows


def _err(a, b) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0
SEGMENTS, RATES = (8, 16, 48), (1, 2, 4)  # local, across the boundary, the whole sequence


def _multihead_errors(rank: int, causal: bool, lengths=LENGTHS) -> dict:
    torch.manual_seed(3)
    full = MultiheadDilatedAttention(E, H, SEGMENTS, RATES, dtype=torch.float64)
    ring = RingMultiheadDilatedAttention(E, H, SEGMENTS, RATES, dtype=torch.float64)
    ring.load_state_dict(full.state_dict())
    x = torch.randn(2, sum(lengths), E, dtype=torch.float64, requires_grad=True)
    grad = torch.randn_like(x)
    want, _ = full(x, is_causal=causal)
    want.backward(grad)

    rows = slice(sum(lengths[:rank]), sum(lengths[: rank + 1]))
    shard = x.detach()[:, rows].clone().requires_grad_()
    out, _ = ring(shard, is_causal=causal)
    out.backward(grad[:, rows])
    errors = {"out": _err(out, want[:, rows]), "dx": _err(shard.grad, x.grad[:, rows])}
    for (name, p), q in zip(ring.named_parameters(), full.parameters()):
        dist.all_reduce(p.grad)  # each rank holds its shard's share of the parameter gradient
        errors[name] = (p.grad - q.grad).abs().max().item()
    return errors


def _factory_and_compat_errors(rank: int) -> dict:
    mha = create_multihead_attention("auto", embed_dim=E, num_heads=H, segment_lengths=SEGMENTS,
                                             dilation_rates=RATES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        seed_ring = compat.RingDilatedAttention(list(SEGMENTS), list(RATES), ring_size=WORLD)
        seed_full = compat.ImprovedDilatedAttention(list(SEGMENTS), list(RATES))
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, sum(LENGTHS), H, 8, generator=gen, dtype=torch.float64) for _ in range(3))  # (b, n, h, d)
    rows = slice(sum(LENGTHS[:rank]), sum(LENGTHS[: rank + 1]))
    out = seed_ring(q[:, rows], k[:, rows], v[:, rows], is_causal=True)
    return {"factory_kind": type(mha).__name__,
            "compat": (out - seed_full(q, k, v, is_causal=True)[:, rows]).abs().max().item()}


def _worker(rank, init_method, result_dir):
    report = {"error": None}
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD, timeout=TIMEOUT)
        report["cases"] = {str(causal): _multihead_errors(rank, causal) for causal in (False, True)}
        report["cases"].update({f"uneven {causal}": _multihead_errors(rank, causal, UNEVEN) for causal in (False, True)})
        report["cases"]["empty True"] = _multihead_errors(rank, True, EMPTY)
        report.update(_factory_and_compat_errors(rank))
        leave_together()  # every rank at once: see its doc
    except Exception:
        report["error"] = traceback.format_exc()
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def test_ring_multihead_equals_full_sequence_multihead_with_parameter_gradients(tmp_path):
    start_ranks(_worker, (rendezvous(tmp_path), str(tmp_path)), WORLD)
    for rank in range(WORLD):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["error"] is None, report["error"]
        assert len(report["cases"]) == 5
        for causal, errors in report["cases"].items():
            assert set(errors) >= {"out", "dx", "qkv_proj.weight", "sub_ln.weight", "out_proj.bias"}, errors
            for name, err in errors.items():
                assert err < 1e-10, (rank, causal, name, err)
        assert report["factory_kind"] == "RingMultiheadDilatedAttention"
        assert report["compat"] < 1e-10
