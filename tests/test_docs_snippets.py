"""Every ```python block of README.md and docs/*.md runs, so the examples
cannot rot: each in a fresh interpreter, in an empty temporary folder, with
this checkout on the path, no network and no display.

A block that assumes something the reader supplies (a checkpoint ``path``, a
model, tensors ``q, k, v``) says so in the markdown, in an HTML comment on the
line just before its fence, which renders as nothing:

    <!-- snippet: setup
    q, k, v = (torch.randn(1, 4, 512, 16) for _ in range(3))
    -->

runs that code first, in the same namespace (one line also works:
``<!-- snippet: setup path = ... -->``), and

    <!-- snippet: skip — needs torchrun and one GPU per process -->

skips the block, the reason in the skip message: only for what cannot run on
a machine without a GPU or network. An unmarked block that fails fails its
test. Blocks nested in list items are dedented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^[ \t]*```python[ \t]*$")
ANY_PY_FENCE = re.compile(r"^[ \t]*```[ \t]*py", re.I)  # ```py, ```pycon, ```python3: would be missed
MARKER = re.compile(r"<!--\s*snippet:\s*(?P<kind>\S+)(?P<body>.*?)-->", re.S)
# Per block, a guard against a hang, not a size rule: the slowest (serving.md's compiled generate, README's
# Inductor compile) take seconds on a quiet 2-core machine and passed 120 s on a busy one. Below
# pytest's --timeout (pyproject.toml), so this message is the one that shows.
TIMEOUT_S = 900
# One intra-op thread: the examples are small, and two threads on two cores that
# something else keeps busy spin at every op (serving.md's generate: 9 s, not 1.5 s).
THREADS = "1"

# Runs the setup, then the snippet, in __main__ (as a user's script would), each
# compiled under its own file name so a traceback shows the line that failed.
RUNNER = """
import sys
for _path in sys.argv[1:]:
    with open(_path) as _f:
        exec(compile(_f.read(), _path, "exec"))
"""


@dataclass(frozen=True)
class Snippet:
    doc: str            # path relative to the repository root
    line: int           # 1-based line of the opening fence
    code: str           # the block's text, dedented
    setup: str = ""     # code run before it, from <!-- snippet: setup ... -->
    skip: str = ""      # why it cannot run here, from <!-- snippet: skip — ... -->

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _marker(lines: list[str], fence: int) -> tuple[str, str]:
    """(kind, body) of the snippet comment that ends on the line just before
    ``lines[fence]``; kind "" where there is none."""
    end = fence - 1
    if end < 0 or not lines[end].rstrip().endswith("-->"):
        return "", ""
    start = end
    while start > 0 and "<!--" not in lines[start]:
        start -= 1
    m = MARKER.search("\n".join(lines[start:end + 1]))
    return (m.group("kind"), m.group("body")) if m else ("", "")


def snippets(text: str, doc: str) -> list[Snippet]:
    """The ```python blocks of markdown ``text`` (from file ``doc``), with their markers."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        if FENCE.match(lines[i]) is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{doc}:{i + 1}: ```python block never closed"
        code = textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"
        kind, body = _marker(lines, i)
        setup = skip = ""
        if kind == "setup":
            first, _, rest = body.partition("\n")
            setup = (first.strip() + "\n" + textwrap.dedent(rest)).strip() + "\n"
        elif kind == "skip":
            skip = body.strip().lstrip("—–-:").strip()
            assert skip, f"{doc}:{i + 1}: `<!-- snippet: skip -->` needs a reason"
        else:
            assert kind == "", f"{doc}:{i + 1}: unknown `<!-- snippet: {kind} -->`; use setup or skip"
        found.append(Snippet(doc, i + 1, code, setup, skip))
        i = end + 1
    return found


def doc_snippets(path: Path) -> list[Snippet]:
    return snippets(path.read_text(), path.relative_to(ROOT).as_posix())


ALL = [s for path in DOCS for s in doc_snippets(path)]


@pytest.mark.parametrize("snippet", ALL, ids=[s.id for s in ALL])
def test_snippet_runs(snippet, tmp_path):
    if snippet.skip:
        pytest.skip(f"{snippet.id}: {snippet.skip}")
    work = tmp_path / "cwd"
    work.mkdir()
    setup, code = tmp_path / "setup.py", tmp_path / (re.sub(r"[/:.]", "_", snippet.id) + ".py")
    setup.write_text(snippet.setup)
    code.write_text(snippet.code)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "PYTHONSTARTUP")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS,
               TORCHINDUCTOR_COMPILE_THREADS="1",  # no pool of compile workers to start
               MPLBACKEND="Agg", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    try:
        done = subprocess.run([sys.executable, "-c", RUNNER, str(setup), str(code)], cwd=work, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{snippet.id} ran past {TIMEOUT_S} s (it takes seconds on a quiet machine): a hang?",
                    pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"{snippet.id} failed (exit {done.returncode}); it ran as {code.name}, after its setup "
                    f"(setup.py):\n{done.stderr[-4000:]}", pytrace=False)


def test_every_python_block_is_found():
    """The fence pattern misses none: indented ones in list items are found, and
    a ```py or ```pycon fence (which it would miss) fails here."""
    for path in DOCS:
        fences = sum(1 for line in path.read_text().splitlines() if ANY_PY_FENCE.match(line))
        assert len(doc_snippets(path)) == fences, f"{path.relative_to(ROOT)}: spell each fence ```python"
    assert len(ALL) >= 15


def test_every_snippet_comment_sits_just_before_a_python_block():
    """A marker a line too early would be ignored, and its block run bare."""
    for path in DOCS:
        attached = sum(1 for s in doc_snippets(path) if s.setup or s.skip)
        assert len(MARKER.findall(path.read_text())) == attached, (
            f"{path.relative_to(ROOT)}: a `<!-- snippet: ... -->` comment is not on the line just before "
            "a ```python fence")


def test_markers_are_read():
    text = textwrap.dedent("""\
        - in a list item:

          <!-- snippet: setup x = 1 -->
          ```python
          print(x)
          ```

        <!-- snippet: skip — needs two GPUs -->
        ```python
        import gpus
        ```

        <!-- an ordinary comment -->
        ```python
        pass
        ```
          <!-- snippet: setup
          import torch
          y = torch.ones(2)
          -->
          ```python
          print(y)
          ```
        """)
    assert snippets(text, "a.md") == [
        Snippet("a.md", 4, "print(x)\n", setup="x = 1\n"),
        Snippet("a.md", 9, "import gpus\n", skip="needs two GPUs"),
        Snippet("a.md", 14, "pass\n"),
        Snippet("a.md", 21, "print(y)\n", setup="import torch\ny = torch.ones(2)\n"),
    ]
    with pytest.raises(AssertionError, match="needs a reason"):
        snippets("<!-- snippet: skip -->\n```python\npass\n```\n", "a.md")
    with pytest.raises(AssertionError, match="unknown"):
        snippets("<!-- snippet: skipp — typo -->\n```python\npass\n```\n", "a.md")
