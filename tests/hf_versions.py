"""Both ends of the supported transformers range (pyproject's ``hf`` extra): a
step of ``make test`` after the main suite, ``python tests/hf_versions.py``.

The suite runs on the installed transformers; this installs the other end of
the range (``--no-deps --target`` into the virtualenv, once: later runs reuse
it) and runs the Hugging Face tests that exercise transformers' own machinery
— the mask functions it composes, packed rows, padding, generation — under it
in a nested pytest. 5.24 composed the packed-rows mask the other way round and
every packed batch was refused (DataCollatorWithFlattening training); a
release that breaks the integration fails here before users meet it.

Prints one line saying which transformers ran and how it went; exits non-zero
on any failure (``make test`` fails with it). Extra arguments go to pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import transformers

from nested_pytest import ROOT, imported_version, run_pytest

ENDS = ("5.23.0", "5.24.0")  # the range transformers>=5.23,<5.25
FILES = ["tests/test_hf.py", "tests/test_hf_batches.py", "tests/test_hf_config.py", "tests/test_hf_static_cache.py"]
# Inductor compiles are version-independent and the slow part: the main suite has run them.
SELECT = "not compile and not inductor"


def other_end(installed: str) -> str:
    if installed not in ENDS:
        raise SystemExit(f"transformers {installed} is outside the tested range {ENDS}: "
                         "pip install -e '.[hf]' installs one of them")
    return ENDS[0] if installed == ENDS[1] else ENDS[1]


def install(version: str) -> Path:
    """transformers ``version`` alone in a folder of the virtualenv (its dependencies are the venv's)."""
    target = Path(sys.prefix) / f"transformers-{version}"
    if not (target / "transformers" / "__init__.py").exists():
        print(f"hf-versions: installing transformers {version} into {target}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", str(target), f"transformers=={version}"], check=True)
    return target


def main(argv: list[str]) -> int:
    version = other_end(transformers.__version__)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(install(version)), str(ROOT)]))
    seen = imported_version(sys.executable, "transformers", env)
    if seen != version:
        print(f"hf-versions: FAILED: asked for transformers {version}, the nested run imports {seen}")
        return 1
    print(f"hf-versions: the Hugging Face tests under transformers {version}, the other end of the supported "
          f"range ({transformers.__version__} ran in the main suite)", flush=True)
    return run_pytest("hf-versions", sys.executable, [*FILES, "-k", SELECT, *argv], env, f"transformers {version}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
