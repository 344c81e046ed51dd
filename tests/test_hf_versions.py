"""Both ends of the supported transformers range (pyproject's ``hf`` extra).

The suite runs on the installed transformers; this test installs the other end
of the range (``--no-deps --target`` into the virtualenv, once) and runs the
Hugging Face tests that exercise transformers' own machinery — the mask
functions it composes, packed rows, padding, generation — under it in a
subprocess. 5.24 composed the packed-rows mask the other way round and every
packed batch was refused (DataCollatorWithFlattening training); a release
that breaks the integration fails here before users meet it."""

import os
import subprocess
import sys
from pathlib import Path

import transformers

ROOT = Path(__file__).resolve().parents[1]
ENDS = ("5.23.0", "5.24.0")  # the range transformers>=5.23,<5.25


def _other_end() -> Path:
    version = ENDS[0] if transformers.__version__ == ENDS[1] else ENDS[1]
    target = Path(sys.prefix) / f"transformers-{version}"
    if not (target / "transformers" / "__init__.py").exists():
        run = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                              f"transformers=={version}"], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"installing transformers {version} failed:\n{run.stderr[-2000:]}"
    return target


def test_the_hugging_face_tests_pass_under_the_other_end_of_the_supported_range():
    assert transformers.__version__ in ENDS, f"transformers {transformers.__version__} is outside the tested range"
    target = _other_end()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(ROOT)]))
    check = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert check.stdout.strip() in ENDS and check.stdout.strip() != transformers.__version__, check.stderr[-1000:]
    files = ["tests/test_hf.py", "tests/test_hf_batches.py", "tests/test_hf_config.py", "tests/test_hf_static_cache.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files,
                          "-k", "not compile and not inductor"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"under transformers {check.stdout.strip()}:\n{run.stdout[-4000:]}"
    assert " passed" in run.stdout.splitlines()[-1], run.stdout[-500:]
