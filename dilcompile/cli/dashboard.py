"""``dilcompile dashboard``: the Streamlit dashboard over the run store."""

from __future__ import annotations

import importlib.util
import os
import site
import socket
import sys
from pathlib import Path

from ._util import RUNTIME_ERROR, USAGE_ERROR, add_db, fail

PROG = "dilcompile dashboard"


def app_path() -> Path:
    """The dashboard's ``app.py``: the ``dilcompile.dashboard`` package of an
    installed wheel, or the top-level ``dashboard/`` folder beside ``dilcompile/``
    when running from a checkout (where it is not installed under that name)."""
    spec = importlib.util.find_spec("dilcompile.dashboard")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))) / "app.py"
    return _package_root() / "dashboard" / "app.py"


def _package_root() -> Path:
    """The folder holding the ``dilcompile`` package this process imported."""
    return Path(importlib.util.find_spec("dilcompile").origin).resolve().parents[1]


def add_parser(sub) -> None:
    p = sub.add_parser("dashboard", help="open the Streamlit dashboard over the run store",
                       description="Serve the dashboard (Overview, Compare, Run, Patterns, Regressions, SQL). "
                                   "With no runs in the store it shows the reference runs under runs/.")
    add_db(p)
    p.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    p.add_argument("--address", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.set_defaults(func=run)


def streamlit_command(app: Path, address: str, port: int) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", address,
            "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--global.developmentMode", "false", "--client.toolbarMode", "viewer"]


def _server_pythonpath() -> str:
    """PYTHONPATH for the server, so it imports the dilcompile this process
    imported: installed, or a checkout (e.g. ``python -m dilcompile`` run in it)."""
    root = str(_package_root())
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in entries and root not in site.getsitepackages():
        entries.insert(0, root)
    return os.pathsep.join(entries)


def _port_free(address: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def run(args) -> int:
    if not 1 <= args.port <= 65535:
        return fail(PROG, f"--port must be in 1..65535, got {args.port}", USAGE_ERROR)
    app = app_path()
    if not app.exists():
        return fail(PROG, f"the dashboard app is missing ({app}); reinstall dilcompile (pip install "
                          "'dilcompile[dashboard]') or run from a checkout", RUNTIME_ERROR)
    try:
        import plotly  # noqa: F401
        import streamlit  # noqa: F401
    except ImportError as exc:
        return fail(PROG, f"the dashboard needs streamlit and plotly ({exc.name} is missing): "
                          "pip install 'dilcompile[dashboard]'", RUNTIME_ERROR)
    if not _port_free(args.address, args.port):
        return fail(PROG, f"port {args.port} on {args.address} is in use; pass --port with a free one", RUNTIME_ERROR)
    db = os.path.abspath(args.db)
    env = {**os.environ, "DILCOMPILE_DB": db, "PYTHONPATH": _server_pythonpath()}
    print(f"dashboard: http://{args.address}:{args.port}  (store {db}; Ctrl+C stops it)", flush=True)
    # Become the server (exec, not a child): a signal to this process — Ctrl+C,
    # a supervisor's SIGTERM — reaches streamlit itself, so no server is orphaned.
    command = streamlit_command(app, args.address, args.port)
    os.execve(command[0], command, env)
