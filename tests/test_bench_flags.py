"""Every benchmark script declares its shared flags from dilcompile/cli/_bench.py: one spelling per
concept, and a bad value is one line naming the flag, exit 2, before any store is opened."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["bench_baselines", "bench_block_sparse", "bench_compile", "bench_decode", "bench_dilated",
           "bench_hf_serving", "bench_packed", "bench_pattern_overhead", "bench_ring", "bench_sdpa_merge", "tune_triton"]
BAD = [("--seq-lens", "0"), ("--seq-lens", "-5"), ("--repeats", "0"), ("--rounds", "-1"), ("--warmup", "-1"),
       ("--max-time", "0"), ("--heads", "2.5"), ("--passes", "bwd"), ("--dtype", "int8"), ("--device", "tpu")]


def _module(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # as when run: the script's folder first
    spec = importlib.util.spec_from_file_location(f"_script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _flags(module) -> set[str]:
    from dilcompile.cli import _bench

    seen = []
    real = _bench.parser

    def spy(prog, doc, **defaults):
        seen.extend(defaults)
        return real(prog, doc, **defaults)

    module.parser = spy
    try:
        module.main(["--help"]) if module.main.__code__.co_argcount else module.main()
    except SystemExit:
        pass
    return {_bench.FLAGS[name][0] for name in seen}


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_bad_shared_flag_is_one_line_and_nothing_is_stored(name, tmp_path, monkeypatch, capsys):
    module = _module(name, monkeypatch)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    flags = _flags(module)
    capsys.readouterr()
    assert "--db" in flags  # every script writes the run store
    tried = 0
    for flag, value in BAD:
        if flag not in flags:
            continue
        tried += 1
        db = tmp_path / "runs.duckdb"
        monkeypatch.setattr(sys, "argv", [f"{name}.py", flag, value, "--db", str(db)])
        with pytest.raises(SystemExit) as exc:
            module.main()
        out, err = capsys.readouterr()
        assert exc.value.code == 2 and out == ""
        (line,) = err.strip().splitlines()
        assert line.startswith(f"{name}: error: argument {flag}") and value in line, line
        assert not db.exists()
    assert tried >= 1
