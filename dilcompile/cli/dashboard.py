"""``dilcompile dashboard``: the Streamlit dashboard over the run store."""

from __future__ import annotations

import errno
import importlib.util
import os
import site
import socket
import sys
from pathlib import Path

from ..store import StoreError
from ..store.connection import stat_path
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
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 only on a trusted "
                        "network: the dashboard has no login)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="repeatable: another host name the browser uses to reach the dashboard (the Host header is "
                        "checked against this machine's names, the --address and these)")
    p.set_defaults(func=run)


LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


def allowed_hosts(address: str, extra=()) -> list[str]:
    """Host header values the server accepts (Streamlit's ``server.allowedHosts``): a page on
    another site that rebinds its DNS name to this machine sends its own name and is refused."""
    hosts = list(LOCAL_HOSTS)
    if address in WILDCARDS:
        hosts += [socket.gethostname(), socket.getfqdn()]
    else:
        hosts.append(address)
    return list(dict.fromkeys(h.lower() for h in [*hosts, *extra] if h))


def streamlit_command(app: Path, address: str, port: int, extra_hosts=()) -> list[str]:
    hosts = [arg for h in allowed_hosts(address, extra_hosts) for arg in ("--server.allowedHosts", h)]
    return [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", address,
            "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--global.developmentMode", "false", "--client.toolbarMode", "viewer",
            # Same-origin only: no cross-site WebSocket or XHR, XSRF tokens on, nothing else served.
            *hosts, "--server.enableCORS", "true", "--server.enableXsrfProtection", "true",
            "--server.enableAgentApi", "false", "--server.enableStaticServing", "false"]


def _server_pythonpath() -> str:
    """PYTHONPATH for the server, so it imports the dilcompile this process
    imported: installed, or a checkout (e.g. ``python -m dilcompile`` run in it)."""
    root = str(_package_root())
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in entries and root not in site.getsitepackages():
        entries.insert(0, root)
    return os.pathsep.join(entries)


def _bind_error(address: str, port: int) -> OSError | None:
    """Why the server could not listen on (address, port); None if it can."""
    try:
        infos = socket.getaddrinfo(address or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        return OSError(errno.EADDRNOTAVAIL, f"not an address ({exc})")
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as s:
        try:
            s.bind(sockaddr)
        except OSError as exc:
            return exc
    return None


def run(args) -> int:
    if not 1 <= args.port <= 65535:
        return fail(PROG, f"--port must be in 1..65535, got {args.port}", USAGE_ERROR)
    try:  # no store yet is fine (the reference runs show); a name the file system refuses broke the page
        stat_path(args.db)
    except StoreError as exc:
        return fail(PROG, str(exc), RUNTIME_ERROR)
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
    error = _bind_error(args.address, args.port)
    if error is not None and error.errno == errno.EADDRINUSE:
        return fail(PROG, f"port {args.port} on {args.address} is in use; pass --port with a free one", RUNTIME_ERROR)
    if error is not None:
        return fail(PROG, f"cannot listen on --address {args.address!r}: {error.strerror or error}; pass an address "
                          "of this machine (127.0.0.1, the default, or 0.0.0.0 for every interface)", USAGE_ERROR)
    db = os.path.abspath(args.db)
    env = {**os.environ, "DILCOMPILE_DB": db, "PYTHONPATH": _server_pythonpath()}
    print(f"dashboard: http://{args.address}:{args.port}  (store {db}; Ctrl+C stops it)", flush=True)
    # Become the server (exec, not a child): a signal to this process — Ctrl+C,
    # a supervisor's SIGTERM — reaches streamlit itself, so no server is orphaned.
    command = streamlit_command(app, args.address, args.port, args.allowed_host)
    os.execve(command[0], command, env)
