"""A real dashboard server for the tests: ``dilcompile dashboard`` in a child
process, up once its health endpoint answers, stopped on exit."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dashboard_server(db, *, cwd: Path, env: dict, extra_args=(), timeout: float = 120.0,
                     python: str = sys.executable):
    """Run ``python -m dilcompile dashboard --db db`` on a free port in ``cwd``
    with ``env`` (``python``: this interpreter, or another such as a venv's);
    yields the port once ``/_stcore/health`` answers ``ok``. A server that
    exits or does not answer within ``timeout`` seconds fails with its log."""
    port = free_port()
    with open(Path(cwd) / "dashboard.log", "w+") as log:
        proc = subprocess.Popen([python, "-m", "dilcompile", "dashboard", "--db", str(db), "--port", str(port),
                                 *extra_args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while not _healthy(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise AssertionError(f"the dashboard did not come up on port {port}:\n{log.read()[-3000:]}")
                time.sleep(0.25)  # polling for the server
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
            return r.status == 200 and r.read().strip() == b"ok"
    except OSError:
        return False
