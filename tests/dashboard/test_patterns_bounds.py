"""The Patterns page does bounded work in the server: sizes past its picture
budget, and fixed-length patterns of another N, are one clear error before
anything is built; pictures are cached by their parameters."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dashboard import patterns_view as pv

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def _quick(fn, *args):
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        fn(*args)
    assert time.perf_counter() - start < 2.0
    return str(err.value)


def test_the_reported_probes_are_refused_before_any_work(monkeypatch):
    import sys

    hilbert_module = sys.modules["dilcompile.patterns.hilbert"]  # the package exports the class under that name

    def no_curve(*args):
        raise AssertionError("the Hilbert curve was built")

    monkeypatch.setattr(hilbert_module, "_curve", no_curve)
    assert "exceeds the picture's" in _quick(pv.dilated_pattern, 4096, 8, (64, 128), (1, 2))  # was 7.6 s, 2.45 GB
    assert "heads must be in 1..16" in _quick(pv.dilated_pattern, 256, 64, (64, 128), (1, 2))
    assert "heads must be in 1..16" in _quick(pv.block_sparse_pattern, "local_window(window=8)", 256, 64)
    for spec in ("hilbert(height=4000, width=4000, radius=1)", "hilbert(height=100000, width=100000, radius=1)",
                 "union(local_window(window=8), hilbert(height=4000, width=4000, radius=1))"):
        assert "is for N = " in _quick(pv.block_sparse_pattern, spec, 256)


def test_the_largest_pictures_within_budget_still_draw():
    res = pv.dilated_pattern(1024, pv.MAX_HEADS, (64, 128), (1, 2))
    assert tuple(res["counts"].shape) == (16, 1024, 1024)
    res = pv.dilated_pattern(pv.MAX_N, 1, (64, 128), (1, 2))
    assert tuple(res["counts"].shape) == (1, 4096, 4096)
    assert pv.block_sparse_pattern("hilbert(height=16, width=16, radius=2)", 256)["density"] > 0


def test_the_page_shows_the_bounds_as_errors_and_caches_pictures(dashboard_env, tmp_path, monkeypatch):
    dashboard_env(str(tmp_path / "missing.duckdb"))
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page("views/patterns.py")
    at.run()
    assert at.number_input(key="pat_heads").max == pv.MAX_HEADS
    at.number_input(key="pat_n").set_value(4096).run()
    assert not at.exception and "exceeds the picture's" in at.error[0].value
    at.number_input(key="pat_heads").set_value(1).run()
    assert not at.exception and not at.error
    calls = []
    real = pv.dilated_pattern
    monkeypatch.setattr(pv, "dilated_pattern", lambda *a: calls.append(a) or real(*a))
    at.toggle(key="pat_causal").set_value(True).run()
    at.toggle(key="pat_causal").set_value(False).run()  # back to a drawn picture: served from the cache
    assert not at.exception and len(calls) <= 1
    at.radio(key="pat_kind").set_value("block-sparse").run()
    at.selectbox(key="pat_name").set_value("hilbert").run()
    at.number_input(key="pat_n").set_value(256).run()
    at.text_input(key="pat_spec_hilbert").set_value("hilbert(height=100000, width=100000, radius=1)").run()
    assert not at.exception and "is for N = 10000000000 tokens" in at.error[0].value
