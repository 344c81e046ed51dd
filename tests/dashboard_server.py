"""A real dashboard server for the tests: ``dilcompile dashboard`` in a child
process, up once its health endpoint answers, stopped on exit."""

from __future__ import annotations

import contextlib
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A port nothing listens on now. Under pytest-xdist each worker takes only the ports of its own
    residue (port % workers == its index): a port one worker found free is never handed to a server
    of the other, whose health check would answer for a server that failed to start."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")) % workers
    # Chosen here, not by bind(("", 0)): Linux hands bind(0) ports of one parity only, so a
    # worker of the other residue would wait for ever.
    for _ in range(10_000):
        port = random.randrange(20_000, 30_000) // workers * workers + index
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken: try another
        return port
    raise RuntimeError("no free port on 127.0.0.1 in 20000-30000")


@contextlib.contextmanager
def dashboard_server(db, *, cwd: Path, env: dict, extra_args=(), timeout: float = 600.0,
                     python: str = sys.executable):
    """Run ``python -m dilcompile dashboard --db db`` on a free port in ``cwd``
    with ``env`` (``python``: this interpreter, or another such as a venv's);
    yields the port once ``/_stcore/health`` answers ``ok``. A server that
    exits, or does not answer within ``timeout`` seconds (a guard against a
    hang, far above the seconds a start takes), fails with its log;
    one whose port was taken between choosing it and listening on it (by
    another process) is started again on another port."""
    for attempt in range(3):
        port = free_port()
        with open(Path(cwd) / "dashboard.log", "w+") as log:
            proc = subprocess.Popen([python, "-m", "dilcompile", "dashboard", "--db", str(db), "--port", str(port),
                                     *extra_args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + timeout
                while not _healthy(port):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        text = log.read()
                        if proc.returncode is not None and re.search(r"in use|not available", text) and attempt < 2:
                            break
                        raise AssertionError(f"the dashboard did not come up on port {port}:\n{text[-3000:]}")
                    time.sleep(0.25)  # polling for the server
                else:
                    yield port
                    return
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
