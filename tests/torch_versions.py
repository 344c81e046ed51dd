"""The oldest supported torch (docs/design.md: 2.11 through 2.13): a step of
``make test`` after the main suite, ``python tests/torch_versions.py``.

The suite runs on the installed torch (2.13 on the development machines);
the GPU machines run 2.11, where Dynamo behaves differently in ways that
only a trace shows: ``torch.compiler.is_compiling()`` reads False while
Dynamo calls Python at trace time, a constant-marked function's arguments
must be Python constants (a frozen dataclass is not), and ``wrap_triton``
refuses an interpreted kernel. Each broke compiled calls on an H200 and
passed every test here. This builds a virtualenv with torch 2.11 beside
the main one (once: later runs reuse it) and runs the tests that compile,
trace or launch the Triton kernels under it, in a nested pytest.

``--install`` only builds the virtualenv: ``make test`` runs that in the
background during the main suite (a download of a few GB, mostly waiting
on the network), so this step starts with it built.

Prints one line saying which torch ran and how it went; exits non-zero on
any failure (``make test`` fails with it). Extra arguments go to pytest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from nested_pytest import ROOT, imported_version, run_pytest

OLDEST = "2.11.0"
VENV = ROOT / f".venv-torch{OLDEST}"
# What the selected tests import, at the main virtualenv's versions (torch brings triton).
PACKAGES = ("numpy", "pytest", "pytest-timeout", "pytest-xdist", "transformers", "tqdm", "duckdb")
# Files of the dashboard, the store, the benchmarks and the packaging trace nothing; the fake-GPU
# and ahead-of-time compiles need a CPU-only build (PyPI's 2.11 is a CUDA build).
SKIP_FILES = ("test_bench_", "test_cli_", "test_store", "test_package", "test_docs_snippets", "test_fake_gpu",
              "test_gpu_", "test_hf_pretrained", "test_profile", "test_telemetry")
# Every test that compiles, traces (opcheck), runs beside a compile (threads) or serves from a static
# cache (the compiled Triton tests launch the kernels too).
SELECT = "compile or opcheck or thread or static_cache"


def python() -> Path:
    """The 2.11 virtualenv's interpreter, built on first use."""
    exe = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    if not stamp.exists():
        print(f"torch-versions: installing torch {OLDEST} into {VENV} (a CUDA build: about 5 GB, once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pinned = [f"{name}=={metadata.version(name)}" for name in PACKAGES]
        try:
            # One pip run per requirement of torch, without pip's cache: the disk holds the virtualenv
            # plus one requirement's wheels at a time (about 1 GB), not plus all ~3 GB of them twice over
            # (pip's temporary copies and its HTTP cache). A CI machine with a few GB to spare ran out of
            # space installing it in one run. Until the last run torch lacks some of its requirements,
            # which pip need not report after each.
            pip(exe, "--no-deps", f"torch=={OLDEST}")
            for requirement in platform_requirements(exe, "torch"):
                pip(exe, "--no-warn-conflicts", requirement)
            pip(exe, f"torch=={OLDEST}", *pinned)
        except subprocess.CalledProcessError:
            free = shutil.disk_usage(VENV).free / 2**30
            print(f"torch-versions: installing torch {OLDEST} failed ({free:.1f} GiB free beside {VENV})", flush=True)
            raise
        stamp.touch()
    return exe


def pip(exe: Path, *args: str) -> None:
    """One ``pip install`` into the virtualenv, keeping nothing in pip's cache."""
    subprocess.run([str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-cache-dir", *args],
                   check=True)


def platform_requirements(exe: Path, package: str) -> list[str]:
    """``package``'s requirements that apply here (no extras), as its installed metadata lists them."""
    code = f"import importlib.metadata as m; print(*m.requires({package!r}), sep='\\n')"
    listed = subprocess.run([str(exe), "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    # The nested virtualenv runs this interpreter's version on this machine: its markers evaluate the same here.
    return [str(r) for r in map(Requirement, listed) if r.marker is None or r.marker.evaluate({"extra": ""})]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--install"]:
        python()
        print(f"torch-versions: torch {OLDEST} installed in {VENV}", flush=True)
        return 0
    exe = python()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    seen = imported_version(exe, "torch", env)
    if not seen.startswith(OLDEST):
        print(f"torch-versions: FAILED: asked for torch {OLDEST}, the nested run imports {seen}")
        return 1
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if not p.name.startswith(SKIP_FILES))
    print(f"torch-versions: the compiling tests under torch {seen}, the oldest supported", flush=True)
    return run_pytest("torch-versions", exe, [*files, "-k", SELECT, *argv], env, f"torch {seen}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
