"""Ranks that call ring attention differently: on P = 2 gloo ranks, rank 1
changes one thing (dtype, B, H, D, causal, mode, segments, rates, scale,
transport) and every rank must raise the same ValueError naming it, before
any other collective, and the group must still work afterwards. Without the
check a float32 rank next to a float64 one returned finite, wrong numbers;
other mismatches aborted the processes in gloo."""

import json
import os
import traceback

import pytest
import torch
import torch.distributed as dist

from dilcompile import dilated_attention
from dilcompile.distributed import ring_dilated_attention
from dilcompile.distributed.agreement import FIELDS, check_agreement, config_row
from dilcompile.testing.process_group import leave_together

from ranks import TIMEOUT, rendezvous, start_ranks

WORLD, LENGTHS = 2, (12, 12)
BASE = dict(batch=1, heads=2, head_dim=4, dtype=torch.float64,
            kw=dict(segment_lengths=(8, 24), dilation_rates=(1, 2), causal=False, mode="longnet", scale=None,
                    transport="all_to_all"))

# field named in the error → what rank 1 passes instead
CHANGES = {
    "dtype": dict(dtype=torch.float32),
    "B": dict(batch=2),
    "H": dict(heads=3),
    "D": dict(head_dim=8),
    "causal": dict(causal=True),
    "mode": dict(mode="groups"),
    "segment_lengths": dict(segment_lengths=(8, 16)),
    "dilation_rates": dict(dilation_rates=(1, 4)),
    "scale": dict(scale=0.3),
    "transport": dict(transport="ring"),
}


def _call(rank: int, change: dict, seed: int = 0):
    """Rank ``rank``'s call: the base configuration, with ``change`` applied on rank 1."""
    setup = {**{k: v for k, v in BASE.items() if k != "kw"}, "kw": dict(BASE["kw"])}
    for key, value in (change if rank == 1 else {}).items():
        (setup["kw"] if key in setup["kw"] else setup)[key] = value
    gen = torch.Generator().manual_seed(seed)
    shape = (setup["batch"], setup["heads"], sum(LENGTHS), setup["head_dim"])
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3))
    rows = slice(sum(LENGTHS[:rank]), sum(LENGTHS[: rank + 1]))
    shard = [t[:, :, rows].to(setup["dtype"]) for t in (q, k, v)]
    return shard, (q, k, v), rows, setup["kw"]


def _worker(rank, init_method, result_dir):
    report = {"rank": rank, "messages": {}, "error": None}
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD, timeout=TIMEOUT)
        for field, change in CHANGES.items():
            shard, _, _, kw = _call(rank, change)
            try:
                ring_dilated_attention(*shard, **kw)
                report["messages"][field] = None
            except ValueError as e:
                report["messages"][field] = str(e)
        # Still in step: an agreeing call is exact against the float64 reference.
        shard, full, rows, kw = _call(rank, {}, seed=1)
        out = ring_dilated_attention(*shard, **kw)
        kw.pop("transport")
        ref = dilated_attention(*full, impl="reference", **kw)
        report["err_after"] = (out - ref[:, :, rows]).abs().max().item()
        leave_together()  # every rank at once: see its doc
    except Exception:
        report["error"] = traceback.format_exc()
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def test_every_rank_raises_the_same_error_naming_what_differs(tmp_path):
    start_ranks(_worker, (rendezvous(tmp_path), str(tmp_path)), WORLD)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for report in reports:
        assert report["error"] is None, report["error"]
        assert report["err_after"] < 1e-10
    for field in CHANGES:
        messages = [report["messages"][field] for report in reports]
        assert messages[0] is not None, (field, messages)
        assert messages[0] == messages[1], (field, messages)
        assert f"disagree on {field}:" in messages[0], (field, messages[0])
        assert "rank 1" in messages[0], messages[0]
    dtype = reports[0]["messages"]["dtype"]
    assert "torch.float64" in dtype and "torch.float32" in dtype, dtype
    assert "rank 0 has H = 2, rank 1 has 3" in reports[0]["messages"]["H"]
    assert "'longnet'" in reports[0]["messages"]["mode"] and "'groups'" in reports[0]["messages"]["mode"]


def test_config_row_tells_apart_what_the_ranks_must_share():
    q = torch.zeros(1, 2, 5, 4)
    args = dict(segment_lengths=(8, 16), dilation_rates=(1, 2), mode="longnet", causal=False, scale=0.5,
                transport="auto")
    base = config_row(q, **args)
    assert len(base) == len(FIELDS) and base == config_row(torch.zeros(1, 2, 9, 4), **args)  # L may differ
    for key, value in (("segment_lengths", (16, 8)), ("dilation_rates", (2, 1)), ("scale", 0.5 + 1e-12)):
        other = config_row(q, **{**args, key: value})
        with pytest.raises(ValueError, match=f"disagree on {key}"):
            check_agreement([base, other])
    check_agreement([base, list(base), list(base)])  # equal rows: nothing raised
