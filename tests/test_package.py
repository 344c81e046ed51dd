"""The package as a whole: importing it is cheap and changes no global
setting; every module imports alone; no import cycles; the compiler's opt-in
and its cache key; the wheel carries the dashboard and it starts from there."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from dilcompile import compiler
from dilcompile.compiler import passes
from dashboard_server import dashboard_server

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dilcompile"
# Not imported by `import dilcompile`: slow (Dynamo/Inductor ~2 s, triton ~1 s) or optional.
HEAVY = ("torch._dynamo", "torch._inductor", "triton", "duckdb", "streamlit", "plotly", "pandas",
         "dilcompile.compiler", "dilcompile.profile", "dilcompile.store", "dilcompile.dilated.triton_ops",
         "dilcompile.kernels.triton_dilated")


def _python(code: str, cwd=ROOT, env=None, timeout=120, python: str = sys.executable) -> str:
    """Run ``code`` in a fresh interpreter with this checkout first on the path
    (unless ``env`` sets PYTHONPATH); its stdout. With another ``python`` (a
    venv's), ``env`` is the whole environment."""
    if python == sys.executable:
        env = {**os.environ, **(env or {})}
        env.setdefault("PYTHONPATH", str(ROOT))
    done = subprocess.run([python, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# -- importing -------------------------------------------------------------------------------------

def test_import_changes_no_inductor_or_compiler_setting():
    out = _python("""
        import json, torch
        from torch._inductor import config as inductor
        settings = lambda: {**{"inductor." + k: v for k, v in inductor.get_config_copy().items()},
                            **{"compiler." + k: v for k, v in torch.compiler.config.get_config_copy().items()}}
        before = settings()
        slot, tag = inductor.post_grad_custom_post_pass, torch.compiler.config.cache_key_tag
        import dilcompile
        import dilcompile.compiler  # importing the compiler package does not enable it either
        after = settings()
        print(json.dumps({"changed": sorted(k for k in before if before[k] is not after[k] and before[k] != after[k]),
                          "slot": inductor.post_grad_custom_post_pass is slot,
                          "tag": torch.compiler.config.cache_key_tag == tag}))
    """)
    result = json.loads(out)
    assert result == {"changed": [], "slot": True, "tag": True}, result


def test_import_loads_no_heavy_module():
    out = _python("""
        import json, sys, torch
        before = set(sys.modules)
        import dilcompile
        print(json.dumps(sorted(set(sys.modules) - before)))
    """)
    loaded = json.loads(out)
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert not heavy, heavy
    assert "dilcompile.dilated.ops" in loaded  # the custom ops do register at import


def test_subpackages_load_on_first_access():
    out = _python("""
        import sys, dilcompile
        assert "dilcompile.compiler" not in sys.modules
        print(dilcompile.compiler.enable.__module__)
    """)
    assert out.strip() == "dilcompile.compiler"


def test_triton_ops_register_on_first_use_inside_torch_compile():
    """impl="triton" used for the first time inside a compiled function: the
    import runs while Dynamo traces, and the op enters one full graph."""
    pytest.importorskip("triton", reason="triton not installed (pip install 'dilcompile[triton]')")
    out = _python("""
        import sys, torch
        from torch._dynamo.utils import counters
        from dilcompile import dilated_attention
        assert "dilcompile.dilated.triton_ops" not in sys.modules  # (torch._dynamo itself imports triton)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        fn = lambda q, k, v: dilated_attention(q, k, v, segment_lengths=(8, 16), dilation_rates=(1, 2), impl="triton")
        q, k, v = (torch.randn(1, 2, 24, 16, device=device) for _ in range(3))
        got = torch.compile(fn, fullgraph=True)(q, k, v)
        assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
        torch.testing.assert_close(got, fn(q, k, v))
        print(torch.ops.dilcompile.dilated_triton_fwd.default.name())
    """, timeout=300)
    assert out.strip() == "dilcompile::dilated_triton_fwd"


def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name → file."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


# One interpreter imports torch and the package's root (the slow part); each module is then imported
# in its own forked child. Loading the root first changes nothing a child sees: importing any
# dilcompile.x runs dilcompile/__init__.py, in full, before x; what the root does not load, no child
# finds loaded. Two children run at a time (the oldest is read and reaped first: none waits on another).
_IMPORT_EACH_ALONE = """
import importlib, importlib.util, json, os, sys, traceback
import torch
import dilcompile
failures = {}


def start(name):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            status = 0
        except ModuleNotFoundError as exc:  # an optional dependency that is not installed is fine
            optional = exc.name and not exc.name.startswith("dilcompile") and importlib.util.find_spec(
                exc.name.partition(".")[0]) is None
            os.write(write, ("" if optional else traceback.format_exc()).encode())
            status = 0 if optional else 1
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            status = 1
        os._exit(status)
    os.close(write)
    return name, pid, read


def finish(name, pid, read):
    message = b""
    while chunk := os.read(read, 1 << 16):
        message += chunk
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if status:
        failures[name] = message.decode()[-1500:] or f"exit status {status}"


running = []
for name in json.loads(sys.argv[1]):
    running.append(start(name))
    if len(running) == 2:
        finish(*running.pop(0))
for child in running:
    finish(*child)
print(json.dumps(failures))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="imports each module in a forked child (POSIX)")
def test_every_module_imports_alone():
    names = [m for m in _modules() if m != f"{PACKAGE}.__main__"]  # __main__ runs the CLI when imported
    out = subprocess.run([sys.executable, "-c", _IMPORT_EACH_ALONE, json.dumps(names)], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=900)  # a hang guard: ~16 s quiet, past 300 s with the 2 cores shared 8 ways
    assert out.returncode == 0, out.stderr[-3000:]
    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failures, "\n".join(f"{name}:\n{why}" for name, why in failures.items())
    assert len(names) > 50  # the walk found the package


# -- import cycles ---------------------------------------------------------------------------------

def _import_statements(body, everywhere: bool):
    """Import statements run when the module is imported (``everywhere``: also those in function bodies)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not everywhere:
            continue
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            yield from _import_statements(node.orelse, everywhere)
        else:
            yield from _import_statements([c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)],
                                          everywhere)


def _imported(name: str, path: Path, modules: dict, everywhere: bool) -> set[str]:
    """The package's modules that ``name`` imports (a ``from pkg import x`` of a submodule x names pkg.x)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _import_statements(ast.parse(path.read_text(), str(path)).body, everywhere):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found


def import_graph(everywhere: bool = False) -> dict[str, set[str]]:
    """module → modules whose code its import runs: each imported module and
    its parent packages, except the importer's own parents (already loading)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges = set()
        for target in _imported(name, path, modules, everywhere):
            parts = target.split(".")
            edges |= {".".join(parts[:i]) for i in range(1, len(parts))} - own
            edges.add(target)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_sees_a_cycle_through_a_package_init():
    graph = {"p": {"p.a"}, "p.a": {"q"}, "q": {"q.b"}, "q.b": {"p"}, "r": set()}
    assert cycles(graph) == [["p", "p.a", "q", "q.b"]]


def test_no_import_cycle_among_module_level_imports():
    assert cycles(import_graph()) == []


def test_no_import_cycle_hidden_in_function_level_imports():
    """An import moved into a function to dodge a cycle is still a cycle."""
    assert cycles(import_graph(everywhere=True)) == []


# -- the compiler's opt-in -------------------------------------------------------------------------

class _OtherPass:
    """Stands for a pass someone else put in Inductor's slot first."""

    def __call__(self, graph):
        pass

    def uuid(self):
        return "other-pass"


def _window_masked(q, k, v):
    i = torch.arange(q.shape[2], device=q.device)
    mask = (i[:, None] - i[None, :]).abs() <= 8  # a local window: the mask pass recognises it
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_enable_disable_and_context_manager_restore_inductor_exactly():
    from torch._inductor import config as inductor
    from torch._inductor import lowering as inductor_lowering

    from dilcompile.compiler import lowering

    op = torch.ops.dilcompile.dilated_fwd.default
    missing = object()
    assert not compiler.is_enabled()
    tag = torch.compiler.config.cache_key_tag
    other = _OtherPass()
    q, k, v = (torch.randn(1, 2, 64, 8) for _ in range(3))
    with inductor.patch(post_grad_custom_post_pass=other, fx_graph_cache=False), torch.no_grad():
        # Compiled before enable(): Inductor's default fallback goes into its lowering table.
        torch._dynamo.reset()
        torch.compile(_dilated)(q, k, v)
        before = inductor_lowering.lowerings.get(op, missing)
        lowering.LOWERED.clear()
        for _ in range(2):  # idempotent
            assert compiler.enable()
        slot = inductor.post_grad_custom_post_pass
        assert isinstance(slot, passes.DilcompilePass) and slot.previous is other
        assert inductor_lowering.lowerings[op] is not before
        torch._dynamo.reset()
        torch.compile(_dilated)(q, k, v)
        assert lowering.LOWERED == ["sdpa"]  # ours replaced the fallback
        assert compiler.explain(_window_masked, q, k, v).rewritten  # the passes run

        compiler.disable()
        assert inductor.post_grad_custom_post_pass is other
        assert inductor_lowering.lowerings.get(op, missing) is before
        assert not compiler.explain(_window_masked, q, k, v).rewritten
        compiler.disable()  # a second disable changes nothing
        assert inductor.post_grad_custom_post_pass is other

        with compiler.enabled():
            assert compiler.is_enabled() and inductor.post_grad_custom_post_pass.previous is other
        assert inductor.post_grad_custom_post_pass is other
        assert inductor_lowering.lowerings.get(op, missing) is before
        compiler.enable()
        with compiler.enabled():  # nested in an enable(): leaves it enabled
            pass
        assert compiler.is_enabled()
        compiler.disable()
        assert inductor.post_grad_custom_post_pass is other and not compiler.is_enabled()
    assert torch.compiler.config.cache_key_tag == tag
    torch._dynamo.reset()


def _dilated(q, k, v):
    from dilcompile import dilated_attention

    return dilated_attention(q, k, v, segment_lengths=(16, 32), dilation_rates=(1, 2))


# -- the cache key ---------------------------------------------------------------------------------

# Code that defines an op (its schema, fake rule), a lowering or a Triton kernel: it shapes compiled graphs.
_GRAPH_MARKERS = re.compile(r'\(\s*"dilcompile::|@triton\.jit|\.register_lowering\(|\.register_fake\b')


def test_cache_key_hashes_every_file_that_can_change_a_graph():
    hashed = {p.relative_to(ROOT / PACKAGE).as_posix() for p in passes.source_files()}
    for rel in ("compiler/lowering.py", "compiler/passes.py", "compiler/rewrite_dilated.py",
                "compiler/rewrite_block_sparse.py", "dilated/ops.py", "dilated/triton_ops.py", "block_sparse/ops.py",
                "distributed/ops.py", "kernels/triton_dilated.py", "patterns/base.py", "patterns/spec.py"):
        assert rel in hashed, rel
    marked = {p.relative_to(ROOT / PACKAGE).as_posix() for p in (ROOT / PACKAGE).rglob("*.py")
              if _GRAPH_MARKERS.search(p.read_text())}
    assert marked <= hashed, sorted(marked - hashed)
    for pattern in passes.SOURCES:  # no stale entry
        assert list((ROOT / PACKAGE).glob(pattern)), pattern


def test_cache_key_changes_when_a_hashed_file_changes_and_is_computed_once(tmp_path, monkeypatch):
    for path in passes.source_files():
        for tree in ("a", "b"):
            copy = tmp_path / tree / path.relative_to(ROOT / PACKAGE)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
    assert passes.hash_sources(tmp_path / "a") == passes.source_hash()
    lowering = tmp_path / "b" / "compiler" / "lowering.py"
    lowering.write_text(lowering.read_text() + "\n# edited\n")
    assert passes.hash_sources(tmp_path / "b") != passes.hash_sources(tmp_path / "a")

    calls = []
    real = passes.hash_sources
    monkeypatch.setattr(passes, "hash_sources", lambda *a: calls.append(a) or real(*a))
    passes.source_hash.cache_clear()
    try:
        graph_pass = passes.DilcompilePass()
        keys = {graph_pass.uuid() for _ in range(3)}
        assert len(keys) == 1 and len(calls) == 1
    finally:
        passes.source_hash.cache_clear()


# -- the wheel -------------------------------------------------------------------------------------

# The wheel is built once and installed into one venv (module fixtures): under pytest-xdist the tests
# that use them run on one worker (xdist_group), which builds them once.
WHEEL = pytest.mark.xdist_group("wheel")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the checkout without dependencies."""
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools (pip install setuptools)")
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy: the build writes build/ and *.egg-info next to pyproject.toml
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copyfile(ROOT / name, source / name)
    for name in (PACKAGE, "dashboard", "runs"):  # runs/: only its committed Parquet goes in (package data)
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.duckdb*"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", str(source), "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist")],
                   check=True, capture_output=True, timeout=300)
    (built,) = (tmp / "dist").glob("*.whl")
    return built


@WHEEL
def test_wheel_holds_every_module_and_the_dashboard(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {p.relative_to(ROOT).as_posix() for p in (ROOT / PACKAGE).rglob("*.py")}
    want |= {f"{PACKAGE}/dashboard/" + p.relative_to(ROOT / "dashboard").as_posix()
             for p in (ROOT / "dashboard").rglob("*.py")}
    missing = sorted(want - names)
    assert not missing, f"not in the wheel (add the package to pyproject.toml's packages): {missing}"
    assert f"{PACKAGE}/dashboard/app.py" in names and f"{PACKAGE}/dashboard/views/overview.py" in names


@WHEEL
def test_wheel_carries_the_license_the_standard_sweeps_and_the_reference_runs(wheel):
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    headers = archive.read(metadata).decode()
    assert "License-Expression: BSD-3-Clause" in headers and "License-File: LICENSE" in headers
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    for sweep in (ROOT / PACKAGE / "profile" / "sweeps").glob("*.toml"):
        assert f"{PACKAGE}/profile/sweeps/{sweep.name}" in names
    runs = {f"{PACKAGE}/runs/" + p.relative_to(ROOT / "runs").as_posix() for p in (ROOT / "runs").rglob("*.parquet")}
    assert runs and runs <= names, sorted(runs - names)
    assert not [n for n in names if n.endswith((".duckdb", ".wal"))]  # a local store never ships


def test_standard_sweeps_are_named_and_a_path_still_works(tmp_path):
    from dilcompile.cli import build_parser
    from dilcompile.profile.sweep import load, standard_sweeps

    assert standard_sweeps() == ("quick", "standard")
    by_name = load("quick", "cpu")
    by_path = load(str(ROOT / PACKAGE / "profile" / "sweeps" / "quick.toml"), "cpu")
    assert by_name.name == "quick" and by_name.points == by_path.points and len(by_name.points) == 15
    with pytest.raises(ValueError, match="no standard sweep named 'quik'; the standard sweeps are quick, standard"):
        load("quik", "cpu")
    own = tmp_path / "quick.toml"  # a file of the same name is read as a file when given as a path
    own.write_text('[[grid]]\nvariant = "sdpa"\nseq_len = 16\n')
    assert [p.seq_len for p in load(str(own), "cpu").points] == [16]
    with pytest.raises(ValueError, match="not found; the standard sweeps are named without a path: quick"):
        load(str(tmp_path / "missing.toml"), "cpu")
    profile_help = build_parser()._subparsers._group_actions[0].choices["profile"].format_help()
    assert "quick, standard" in profile_help


def _outside_env(tmp: Path, **extra) -> dict:
    """A user's environment away from the checkout: nothing of it on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DILCOMPILE_DB", "DILCOMPILE_REFERENCE_RUNS")}
    return {**env, "TMPDIR": str(tmp), **extra}


@pytest.fixture(scope="module")
def wheel_venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv outside the checkout with the wheel pip-installed (no
    dependencies): this interpreter's packages (torch, duckdb, streamlit, ...)
    come after the venv's own through a plain path line, so ``dilcompile``
    can only be the wheel's. Not a ``--target`` folder on PYTHONPATH: there the
    checkout's editable install (a finder this interpreter's site-packages
    loads) would still supply a module missing from the wheel."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    where = "import json, sysconfig; print(json.dumps([sysconfig.get_path('purelib'), sysconfig.get_path('platlib')]))"
    venv_site = json.loads(subprocess.check_output([str(python), "-c", where], text=True))[0]
    ours = dict.fromkeys(json.loads(subprocess.check_output([sys.executable, "-c", where], text=True)))
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "--python", str(python),
                    "install", "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, timeout=300,
                   env=_outside_env(venv.parent))
    # After the install: pip would take the checkout's editable dist-info there for this very package.
    Path(venv_site, "test-dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    return venv


@WHEEL
def test_quick_sweep_runs_from_the_wheel_in_a_venv_outside_the_checkout(wheel_venv, tmp_path):
    from dilcompile.profile.sweep import load

    env = _outside_env(tmp_path)
    where = subprocess.run([str(wheel_venv / "bin" / "python"), "-c", "import dilcompile; print(dilcompile.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.startswith(str(wheel_venv)), (where.stdout, where.stderr[-2000:])
    db = tmp_path / "runs.duckdb"
    # The packaged sweep, by name; one timed call per point keeps it to about 20 s on 2 CPU cores.
    argv = [str(wheel_venv / "bin" / "dilcompile"), "profile", "--sweep", "quick", "--db", str(db), "--warmup", "0",
            "--repeats", "1", "--max-time", "0.01", "--no-progress", "--json"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])["profile"]
    assert [r["status"] for r in rows] == ["ok"] * len(load("quick", "cpu").points), done.stdout[-3000:]
    assert {r["variant"] for r in rows} == {"sdpa", "dilated", "dilated-groups", "block-sparse:local_window(window=256)"}
    query = [str(wheel_venv / "bin" / "dilcompile"), "query", "SELECT DISTINCT sweep_name, status FROM runs",
             "--db", str(db), "--format", "json"]
    stored = subprocess.run(query, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert stored.returncode == 0, stored.stderr[-2000:]
    assert [json.loads(line) for line in stored.stdout.splitlines()] == [{"sweep_name": "quick", "status": "ok"}]


@WHEEL
def test_dashboard_from_the_wheel_in_a_venv_shows_the_packaged_reference_runs_and_starts(wheel_venv, tmp_path):
    """Without a store, the wheel's reference runs; with neither, the overview says so and names
    the store; a page that draws without a store (torch + plotly); then the server itself."""
    pytest.importorskip("streamlit", reason="the dashboard needs streamlit: pip install 'dilcompile[dashboard]'")
    pytest.importorskip("plotly", reason="the dashboard needs plotly: pip install 'dilcompile[dashboard]'")
    duckdb = pytest.importorskip("duckdb", reason="the run store needs duckdb: pip install 'dilcompile[store]'")
    with duckdb.connect() as con:
        measured = con.execute(f"SELECT count(*) FROM read_parquet('{ROOT}/runs/**/measurements.parquet')").fetchone()[0]
    db = tmp_path / "missing.duckdb"  # no store: the dashboard falls back to the runs the wheel carries
    env = _outside_env(tmp_path, DILCOMPILE_DB=str(db))
    python = str(wheel_venv / "bin" / "python")
    out = _python(f"""
        import json, os, dilcompile, dilcompile.cli.dashboard as cli
        from streamlit.testing.v1 import AppTest
        at = AppTest.from_file(str(cli.app_path()), default_timeout=120).run()
        assert not at.exception, [e.value for e in at.exception]
        shown = {{"app": str(cli.app_path()), "package": dilcompile.__file__,
                 "info": [i.value for i in at.info], "metrics": {{m.label: m.value for m in at.metric}}}}
        os.environ["DILCOMPILE_REFERENCE_RUNS"] = {str(tmp_path / "none")!r}  # no reference runs either
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        shown["warning"] = " ".join(w.value for w in at.warning)
        at.switch_page("views/patterns.py").run()
        assert not at.exception, [e.value for e in at.exception]
        print(json.dumps(shown))
    """, cwd=tmp_path, env=env, timeout=300, python=python)
    shown = json.loads(out.strip().splitlines()[-1])
    assert shown["app"].startswith(str(wheel_venv)) and shown["package"].startswith(str(wheel_venv)), shown
    assert "Showing the reference runs" in shown["info"][0], shown["info"]
    assert shown["metrics"]["runs"] == str(measured), (shown["metrics"], measured)
    assert "Nothing to show yet" in shown["warning"] and str(db) in shown["warning"], shown["warning"]

    with dashboard_server(db, cwd=tmp_path, env=env, python=python):
        pass  # up: /_stcore/health answered "ok" from the server the venv's wheel started


def test_command_help_says_what_the_tool_does_lists_every_command_and_shows_an_example(capsys):
    from dilcompile.cli import SUBCOMMANDS, main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.splitlines()[2].startswith("Measure exact long-context attention")
    assert "subcommand lives" not in text and "``" not in text  # no developer docstring
    for module in SUBCOMMANDS:
        name = module.__name__.rpartition(".")[2]
        assert re.search(rf"^    {name} +\S", text, re.M), (name, text)  # name and its help on one line
    assert "dilcompile profile --sweep quick" in text and "dilcompile dashboard" in text
