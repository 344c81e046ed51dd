"""The factory: kinds build the right modules, config keys are checked by
name, and kind="auto" picks from a run store (a small DuckDB file made here)
or by the documented rule, never switching what is computed."""

import json

import pytest
import torch

from dilcompile import DilatedAttention, MultiheadDilatedAttention, dilated_attention
from dilcompile import factory
from dilcompile.factory import Kind, create_attention, create_multihead_attention, register_kind

KW = dict(segment_lengths=(16, 32), dilation_rates=(1, 2))
SHAPE = dict(seq_len=1024, num_heads=4, head_dim=16, dtype="float32", device="cpu")


@pytest.mark.parametrize("kind, mode", [("dilated", "longnet"), ("dilated-groups", "groups")])
def test_kinds_build_modules_computing_their_mode(kind, mode):
    att = create_attention(kind, causal=True, **KW)
    assert isinstance(att, DilatedAttention) and att.config.mode == mode
    q, k, v = (torch.randn(1, 4, 50, 8) for _ in range(3))
    torch.testing.assert_close(att(q, k, v), dilated_attention(q, k, v, causal=True, mode=mode, **KW))
    mha = create_multihead_attention(kind, embed_dim=32, num_heads=4, sub_ln=False, **KW)
    assert isinstance(mha, MultiheadDilatedAttention) and mha.config.mode == mode and mha.sub_ln is None


def test_config_keys_are_checked_by_name():
    with pytest.raises(TypeError, match=r"takes no \['pattern'\]"):
        create_attention("dilated", pattern="local", **KW)
    with pytest.raises(ValueError, match="kind must be"):
        create_attention("dilatd", **KW)
    with pytest.raises(ValueError, match="contradicts"):
        create_attention("dilated", mode="groups", **KW)
    with pytest.raises(TypeError, match="embed_dim"):
        create_multihead_attention("dilated", num_heads=4, **KW)
    with pytest.raises(ValueError, match="reserved or already registered"):
        register_kind(factory._REGISTRY["dilated"])


def test_auto_without_store_uses_the_rule_and_keeps_the_mode(tmp_path):
    att, choice = create_attention("auto", explain=True, store=tmp_path / "none.duckdb", **SHAPE, **KW)
    assert (choice.kind, choice.source, choice.impl) == ("dilated", "rule", "auto")
    assert "no run store" in choice.reason
    _, choice = create_attention("auto", explain=True, mode="groups", **KW)
    assert choice.kind == "dilated-groups" and "no seq_len" in choice.reason


COLUMNS = ("run_id VARCHAR, variant VARCHAR, impl VARCHAR, \"pass\" VARCHAR, device VARCHAR, dtype VARCHAR, "
           "seq_len BIGINT, heads INTEGER, head_dim INTEGER, causal BOOLEAN, config VARCHAR, latency_ms DOUBLE, "
           "status VARCHAR")


def _store(path, rows):
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect(str(path))
    con.execute(f"CREATE TABLE measurements ({COLUMNS})")
    con.execute("CREATE VIEW runs AS SELECT * FROM measurements")
    for i, r in enumerate(rows):
        row = dict(variant="dilated", impl="sdpa", pass_="fwd", device=factory.device_name("cpu"), dtype="float32",
                   seq_len=1024, heads=4, head_dim=16, causal=False, config=json.dumps({"segments": [16, 32],
                   "rates": [1, 2]}), latency_ms=5.0, status="ok") | r
        con.execute("INSERT INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [str(i), row["variant"], row["impl"], row["pass_"], row["device"], row["dtype"], row["seq_len"],
                     row["heads"], row["head_dim"], row["causal"], row["config"], row["latency_ms"], row["status"]])
    con.close()
    return path


@pytest.fixture
def twin():
    """A second kind computing the same thing as "dilated" (as a Triton or ring kind would)."""
    base = factory._REGISTRY["dilated"]
    state = {"unusable": None}
    register_kind(Kind("dilated-twin", "dilated:longnet", base.attention, base.multihead,
                             unusable=lambda hints: state["unusable"], impls=base.impls))
    yield state
    factory._REGISTRY.pop("dilated-twin")


def test_auto_picks_the_fastest_measured_kind_computing_the_same_thing(tmp_path, twin):
    store = _store(tmp_path / "runs.duckdb", [
        dict(variant="dilated", latency_ms=5.0),
        dict(variant="dilated-twin", latency_ms=2.0),
        dict(variant="dilated-groups", latency_ms=0.5),  # faster, but computes something else
        dict(variant="dilated", latency_ms=0.1, status="error"),  # failed runs never count
        dict(variant="dilated", latency_ms=0.1, device="another machine"),
        dict(variant="dilated", latency_ms=0.1, seq_len=2048),
        dict(variant="dilated", latency_ms=0.1, pass_="fwd_bwd"),
        dict(variant="dilated", latency_ms=0.1, config=json.dumps({"segments": [8], "rates": [1]})),
        dict(variant="dilated", latency_ms=0.1, impl="reference"),  # the oracle is never a speed choice
    ])
    att, choice = create_attention("auto", explain=True, store=store, **SHAPE, **KW)
    assert (choice.kind, choice.impl, choice.source) == ("dilated-twin", "sdpa", "store")
    assert "2.000 ms" in choice.reason and att.config.impl == "sdpa"
    # Training asks for forward+backward rows.
    _, choice = create_attention("auto", explain=True, store=store, training=True, **SHAPE, **KW)
    assert (choice.kind, choice.source) == ("dilated", "store")
    # Another shape: nothing measured, the rule decides and says why.
    _, choice = create_attention("auto", explain=True, store=store, **(SHAPE | {"seq_len": 4096}), **KW)
    assert choice.source == "rule" and "no ok rows" in choice.reason
    # Multihead: head_dim and device come from the module's own config.
    mha, choice = create_multihead_attention("auto", explain=True, store=store, embed_dim=64, num_heads=4,
                                                     seq_len=1024, **KW)
    assert choice.kind == "dilated-twin" and isinstance(mha, MultiheadDilatedAttention)


def test_auto_never_picks_a_kind_that_cannot_serve_the_input(tmp_path, twin):
    store = _store(tmp_path / "runs.duckdb", [dict(variant="dilated-twin", latency_ms=0.1),
                                              dict(variant="dilated", latency_ms=9.0)])
    twin["unusable"] = "needs a process group"
    _, choice = create_attention("auto", explain=True, store=store, **SHAPE, **KW)
    assert choice.kind == "dilated" and "needs a process group" in choice.reason


def test_auto_falls_back_when_the_store_has_no_runs_view(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "empty.duckdb"
    duckdb.connect(str(path)).close()
    _, choice = create_attention("auto", explain=True, store=path, **SHAPE, **KW)
    assert choice.source == "rule" and "no 'runs' view" in choice.reason


def test_block_sparse_kind_builds_modules_equal_to_the_functional_op():
    from dilcompile import BlockSparseAttention, MultiheadBlockSparseAttention, block_sparse_attention

    att = create_attention("block-sparse", pattern="local_window(window=5)", causal=True, block_size=16)
    assert isinstance(att, BlockSparseAttention)
    q, k, v = (torch.randn(1, 2, 45, 8, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(att(q, k, v), block_sparse_attention(q, k, v, "local_window(window=5)", causal=True,
                                                                    impl="reference"), rtol=1e-10, atol=1e-10)
    mha = create_multihead_attention("block-sparse", embed_dim=16, num_heads=2, pattern="local_window(5)",
                                             sub_ln=False)
    assert isinstance(mha, MultiheadBlockSparseAttention) and mha.sub_ln is None
    _, choice = create_attention("auto", explain=True, pattern="local_window(5)")
    assert choice.kind == "block-sparse"
    with pytest.raises(TypeError, match=r"takes no \['segment_lengths'\]"):
        create_attention("block-sparse", pattern="local_window(5)", segment_lengths=(16,))


def test_ring_kind_needs_a_process_group_and_auto_skips_it_without_one():
    with pytest.raises(ValueError, match="process group"):
        create_attention("ring", **KW)
    with pytest.raises(ValueError, match="process group"):
        create_multihead_attention("ring", embed_dim=32, num_heads=4, **KW)
    _, choice = create_attention("auto", explain=True, **KW)
    assert choice.kind == "dilated" and "ring: needs an initialised" in choice.reason


def test_old_names_are_deprecated_aliases_building_the_same_modules():
    from dilcompile.factory import create_dilated_attention, create_multihead_dilated_attention

    with pytest.warns(DeprecationWarning, match="use dilcompile.create_attention"):
        att = create_dilated_attention("block-sparse", pattern="local_window(5)")
    assert isinstance(att, type(create_attention("block-sparse", pattern="local_window(5)")))
    with pytest.warns(DeprecationWarning, match="use dilcompile.create_multihead_attention"):
        mha = create_multihead_dilated_attention("dilated", embed_dim=32, num_heads=4, **KW)
    assert isinstance(mha, MultiheadDilatedAttention)


def test_built_in_kinds_and_profiler_variants_share_their_names():
    from dilcompile import variant_names
    from dilcompile.profile.variants import REGISTRY

    shared = {getattr(variant_names, n) for n in dir(variant_names) if n.isupper()}
    assert shared == {"dilated", "dilated-groups", "block-sparse"}
    assert shared <= set(factory.kinds()) and shared <= set(REGISTRY)


def test_auto_reads_the_store_through_dilcompile_store_and_waits_out_a_writer(tmp_path, twin):
    """Another process holding the store for writing (a sweep committing a
    point): "auto" retries the lock and reads it, rather than giving up."""
    import subprocess
    import sys
    import textwrap

    store = _store(tmp_path / "runs.duckdb", [dict(variant="dilated-twin", latency_ms=2.0)])
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time, duckdb
        con = duckdb.connect({str(store)!r})
        print("held", flush=True)
        time.sleep(1.5)
        con.close()
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        _, choice = create_attention("auto", explain=True, store=store, **SHAPE, **KW)
    finally:
        holder.wait(timeout=60)
    assert (choice.kind, choice.source) == ("dilated-twin", "store"), choice.reason
    _, choice = create_attention("auto", explain=True, store=str(store), **SHAPE, **KW)  # a str path too
    assert choice.source == "store"
    damaged = tmp_path / "damaged.duckdb"
    damaged.write_bytes(b"not a duckdb file" * 100)
    _, choice = create_attention("auto", explain=True, store=damaged, **SHAPE, **KW)
    assert choice.source == "rule" and "damaged" in choice.reason and str(damaged) in choice.reason
