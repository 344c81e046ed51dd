"""What the nested runs of ``make test`` share (tests/hf_versions.py,
tests/torch_versions.py): ask the nested interpreter which version of a
package it imports, and run pytest there with one line saying how it went."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_version(python, package: str, env: dict) -> str:
    """``package.__version__`` as ``python`` imports it under ``env``."""
    return subprocess.run([str(python), "-c", f"import {package}; print({package}.__version__)"], env=env,
                          capture_output=True, text=True, check=True).stdout.strip()


def run_pytest(label: str, python, args: list[str], env: dict, under: str) -> int:
    """pytest ``args`` in the repository under ``python``; prints "<label>: passed / FAILED under <under>"."""
    run = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env)
    print(f"{label}: {'passed' if run.returncode == 0 else f'FAILED (pytest exit status {run.returncode})'} "
          f"under {under}", flush=True)
    return run.returncode
