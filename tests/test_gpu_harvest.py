"""scripts/gpu_harvest.sh rehearsed on CPU: argument parsing, the install from
a wheel folder (a wheel built here, no network), the export of a real DuckDB
store, the output-channel limits, and the harvest's sweep and bench options."""

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_harvest.sh"
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_harvest  # noqa: E402


def _harvest(args, tmp_path, wheels, **extra_env):
    env = {**os.environ, "PYTHON": sys.executable, "HARVEST_WHEELS": str(wheels), "HARVEST_SITE": str(tmp_path / "site"),
           "HARVEST_TMP": str(tmp_path / "tmp"), **extra_env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def _tiny_wheel(folder: Path) -> Path:
    """A valid pure-Python wheel with one module (harvest_probe.VALUE == 42)."""
    files = {
        "harvest_probe.py": b"VALUE = 42\n",
        "harvest_probe-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: harvest-probe\nVersion: 0.1\n",
        "harvest_probe-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             b"Tag: py3-none-any\n",
    }
    def record_line(name, data):
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{name},sha256={digest},{len(data)}"
    record = "\n".join([*(record_line(n, d) for n, d in files.items()), "harvest_probe-0.1.dist-info/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "harvest_probe-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("harvest_probe-0.1.dist-info/RECORD", record)
    return path


@pytest.mark.parametrize("args, words", [
    (["out", "10"], "unknown part '10'"),
    (["out", "fast"], "unknown part 'fast'"),
    ([], "usage:"),
    (["--rehearse"], "usage:"),
])
def test_bad_arguments_exit_2_with_a_message(args, words, tmp_path):
    proc = _harvest(args, tmp_path, tmp_path / "no-wheels")
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert not (tmp_path / "site").exists()  # nothing installed before the arguments are understood


def test_gpu_parts_fail_fast_without_a_gpu(tmp_path):
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so the refusal is checked on a GPU machine too.
    proc = _harvest([str(tmp_path / "out"), "1"], tmp_path, tmp_path / "no-wheels", CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 3 and "no CUDA device" in proc.stderr and "--rehearse" in proc.stderr


def test_rehearsal_installs_the_wheel_folder_and_exports_a_real_store(tmp_path):
    wheels = tmp_path / "whl"
    _tiny_wheel(wheels)
    out = tmp_path / "out"
    proc = _harvest(["--rehearse", str(out), "2", "3"], tmp_path, wheels)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "harvest_probe.py").read_text() == "VALUE = 42\n"
    assert "installed 1 wheel(s)" in proc.stdout
    assert "p2-dilated" in proc.stdout and "p3-sparse" in proc.stdout
    exported = sorted(p.name for p in (out / "rehearsal").iterdir())
    assert exported == ["measurements.parquet", "sweeps.parquet", "telemetry.parquet"]
    assert "rehearsal: 2 runs (2 ok, 0 not ok)" in proc.stdout
    assert gpu_harvest.out_problems(out) == []

    # The export reads back into a store: the import a GPU harvest's results go through.
    from dilcompile import store
    from dilcompile.cli import main

    db = tmp_path / "back.duckdb"
    assert main(["runs", "import", str(out / "rehearsal"), "--db", str(db)]) == 0
    _, rows = store.query(db, "SELECT variant, status, device_kind FROM runs ORDER BY variant")
    assert rows == [("dilated", "ok", "cpu"), ("sdpa", "ok", "cpu")]


def test_output_limits_name_each_problem(tmp_path):
    for i in range(9):
        (tmp_path / f"f{i}.txt").write_text("x")
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    (tmp_path / "bad name.txt").write_text("x")
    problems = gpu_harvest.out_problems(tmp_path)
    assert any("11 files" in p for p in problems)
    assert any("deep.txt: deeper" in p for p in problems)
    assert any("'bad name.txt'" in p for p in problems)


def test_each_part_leaves_at_most_four_files_so_two_parts_fit_one_call():
    """Part 1: junit.xml + log.txt; the others: three Parquet files + log.txt."""
    text = SCRIPT.read_text()
    assert "--junitxml=\"$dir/junit.xml\"" in text and 'tee -a "$dir/log.txt"' in text
    assert 2 * 4 <= gpu_harvest.MAX_FILES


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_standard_sweep_split_by_dtype_keeps_every_point(dtype):
    from dilcompile.profile import from_dict, load

    whole = load(gpu_harvest.STANDARD, "cpu").points
    part = from_dict(gpu_harvest.standard_for_dtype(dtype), "cpu").points
    assert part and all(p.dtype == dtype for p in part)
    key = lambda p: (p.variant, p.seq_len, p.pass_, p.compiled, p.causal)  # noqa: E731
    assert sorted(map(key, part)) == sorted(key(p) for p in whole if p.dtype == dtype)


def test_dense_backend_choice_among_the_backends_this_device_serves():
    import bench_dilated

    names = bench_dilated.available_dense_backends("cpu", "float32", 64)
    assert "math" in names and set(names) <= set(bench_dilated.DENSE_BACKENDS)
    assert not {"cudnn", "efficient"} & set(names)  # CUDA-only kernels
    assert bench_dilated.fastest_backend({"flash": 2.0, "cudnn": 1.5, "efficient": 3.0}) == "cudnn"


def test_bench_dilated_longnet_preset_and_triton_impl_build_their_points():
    import bench_dilated
    from dilcompile.profile import from_dict

    sizes = bench_dilated.LONGNET
    assert sizes["segments"] == [2048, 4096, 8192, 16384, 32768] and sizes["rates"] == [1, 2, 4, 8, 16]
    doc = bench_dilated.sweep_doc(sizes, True, 3, 1.0, "bfloat16", ["fwd", "fwd_bwd"], ["sdpa", "triton"])
    points = from_dict(doc, "cpu").points
    dilated = [p for p in points if p.variant.startswith("dilated")]
    assert {p.seq_len for p in dilated} == {1 << k for k in range(14, 21)}
    assert {(p.variant, p.impl) for p in dilated} == {("dilated", "sdpa"), ("dilated", "triton")}
    assert {p.seq_len for p in points if p.variant == "sdpa"} == set(sizes["dense"])
    assert len(points) == 7 * 2 * 2 * 2 + 4 * 2


def test_summary_prints_measured_over_predicted_for_triton_rows_on_a_gpu(tmp_path):
    import duckdb

    from dilcompile.dilated.work import H200, predict_ms

    config = '{"segments": [2048, 4096, 8192, 16384, 32768], "rates": [1, 2, 4, 8, 16]}'
    row = "'{v}', '{impl}', 'longnet', '{c}', '{p}', 1, 16, 65536, 128, 'bfloat16', false, {comp}, {ms}::DOUBLE, '{dev}', '{kind}', 'ok'"
    rows = [row.format(v="dilated", impl="triton", c=config, p="fwd", comp="false", ms=12.5, dev="NVIDIA H200",
                       kind="cuda"),
            row.format(v="dilated", impl="sdpa", c=config, p="fwd", comp="false", ms=30.0, dev="NVIDIA H200",
                       kind="cuda"),  # not triton: no prediction
            row.format(v="dilated", impl="triton", c=config, p="fwd", comp="false", ms=900.0, dev="cpu", kind="cpu")]
    columns = "variant, impl, mode, config, pass, batch, heads, seq_len, head_dim, dtype, causal, compiled, " \
              "latency_ms, device, device_kind, status"
    duckdb.execute(f"COPY (SELECT * FROM (VALUES ({'), ('.join(rows)})) t({columns})) "
                   f"TO '{tmp_path / 'measurements.parquet'}' (FORMAT parquet)")
    lines = gpu_harvest.summary(tmp_path).splitlines()
    assert lines[0].startswith(f"{tmp_path.name}: 3 runs (3 ok, 0 not ok)")
    predicted = predict_ms("fwd", 1, 16, 65536, 128, [2048, 4096, 8192, 16384, 32768], [1, 2, 4, 8, 16],
                           peaks=H200)
    assert len(lines) == 2 and "N=65536 bfloat16" in lines[1] and "on H200" in lines[1]
    assert lines[1].endswith(f"measured ÷ predicted {12.5 / predicted:.2f}")
