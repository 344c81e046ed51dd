"""The profiler's layout variants (profile/documents.py) and a smoke run of
scripts/bench_packed.py --quick: every layout computes each document as if it
were alone (docs/design.md, "Variable-length batches")."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dilcompile.profile import variants
from dilcompile.profile.documents import LAYOUTS, document_lengths, layout_callable
from dilcompile.profile.point import Point

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("total", [1, 5, 49, 100, 700, 4096, 65536, 1_000_003])
def test_document_lengths_fill_the_total_within_bounds(total):
    lengths = document_lengths(total)
    assert sum(lengths) == total and all(n >= 1 for n in lengths)
    longest = max(1, min(16384, total // 4))
    shortest = max(1, min(50, longest // 4))
    assert len(lengths) == 1 or max(lengths) < longest + shortest  # a short remainder may join the last one
    assert document_lengths(total) == lengths  # a fixed seed: the same documents every run


def test_document_lengths_at_65536_are_long_tailed():
    lengths = document_lengths(65536)
    assert min(lengths) >= 50 and max(lengths) == 16384 and len(lengths) > 10
    assert sorted(lengths)[len(lengths) // 2] < 2048  # the median is far below the longest


@pytest.mark.parametrize("total", [0, -3, 2.0, True, "64"])
def test_document_lengths_refuse_bad_totals(total):
    with pytest.raises(ValueError, match="total must be a positive int"):
        document_lengths(total)


def _padded(x, lengths):
    """(1, H, total, D) → (S, H, longest, D), each document right-padded with noise."""
    rows = torch.randn(len(lengths), x.shape[1], max(lengths), x.shape[3], dtype=x.dtype)
    start = 0
    for i, n in enumerate(lengths):
        rows[i, :, :n] = x[0, :, start:start + n]
        start += n
    return rows


def _unpadded(rows, lengths):
    return torch.cat([rows[i : i + 1, :, :n] for i, n in enumerate(lengths)], dim=2)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("family", ["dilated", "block-sparse"])
def test_every_layout_computes_each_document_alone(family, seed):
    rng = random.Random(seed)
    total = rng.randrange(300, 900)
    lengths = document_lengths(total, seed)
    heads, dim = rng.choice([1, 2, 3]), rng.choice([4, 8])
    if family == "dilated":
        from dilcompile import dilated_attention

        segments = sorted(rng.sample([8, 16, 24, 32, 64], 2))
        kw = dict(segment_lengths=segments, dilation_rates=[1, rng.choice([2, 3])], causal=True)

        def attend(q, k, v, **varlen):
            return dilated_attention(q, k, v, **kw, **varlen)
    else:
        from dilcompile import block_sparse_attention
        from dilcompile.patterns import local_window

        pattern = local_window(rng.choice([16, 33, 64]))

        def attend(q, k, v, **varlen):
            return block_sparse_attention(q, k, v, pattern, causal=True, block_size=16, **varlen)

    q, k, v = (torch.randn(1, heads, total, dim, dtype=torch.float64) for _ in range(3))
    alone, start = [], 0
    for n in lengths:
        alone.append(attend(q[:, :, start:start + n], k[:, :, start:start + n], v[:, :, start:start + n]))
        start += n
    expected = torch.cat(alone, dim=2)
    for layout in LAYOUTS:
        fn = layout_callable(layout, lengths, attend, "cpu")
        if layout.startswith("padded"):
            out = _unpadded(fn(*(_padded(t, lengths) for t in (q, k, v))), lengths)
        else:
            out = fn(q, k, v)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12, msg=f"layout {layout}")


def test_layout_variants_count_only_the_documents_useful_work():
    kw = dict(seq_len=700, heads=2, head_dim=8, causal=True, segments=(64, 128), rates=(1, 2))
    flops = {layout: variants.build(Point(variant=f"dilated-{layout}", **kw)).fwd_flops for layout in LAYOUTS}
    assert len(set(flops.values())) == 1  # pads do no useful work, whatever the layout computes
    assert flops["packed"] < variants.build(Point(variant="dilated", **kw)).fwd_flops


def test_layout_variant_errors():
    with pytest.raises(ValueError, match="exact only when causal"):
        variants.build(Point(variant="dilated-padded-dense", seq_len=64, segments=(8,), rates=(1,)))
    with pytest.raises(ValueError, match="batch 1"):
        variants.build(Point(variant="dilated-packed", seq_len=64, batch=2, segments=(8,), rates=(1,), causal=True))
    with pytest.raises(variants.UnknownVariant, match="needs a pattern"):
        variants.resolve("block-sparse-packed")
    with pytest.raises(variants.UnknownVariant, match="takes no ':' argument"):
        variants.resolve("dilated-packed:local_window(8)")


def test_bench_packed_quick_smoke(tmp_path):
    pytest.importorskip("duckdb")
    from dilcompile import store

    db = tmp_path / "runs.duckdb"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_packed.py"), "--quick", "--rounds", "2",
                           "--passes", "fwd", "--kinds", "dilated", "--db", str(db)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["bench"] == "packed" and summary["failed"] == []
    (row,) = summary["rows"]
    assert row["family"] == "dilated" and all(row[f"{layout} ms"] > 0 for layout in LAYOUTS)
    assert all(len(row["rounds ms"][layout]) == 2 for layout in LAYOUTS)
    _, rows = store.query(db, "SELECT variant, count(*), min(status), max(status), min(tag) FROM runs "
                              "GROUP BY variant ORDER BY variant")
    assert rows == [(f"dilated-{layout}", 2, "ok", "ok", "packed-round-1") for layout in sorted(LAYOUTS)]
