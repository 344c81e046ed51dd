"""The server `dilcompile dashboard` starts: what it refuses (a real Streamlit process).

A DNS-rebinding page reaches 127.0.0.1 under its own name: its requests carry
``Host: <its name>``. Streamlit checks the Host header of the WebSocket (all
the app's data goes over it) against ``server.allowedHosts``; a cross-site
``Origin`` is refused by its CORS check. The plain HTTP routes (the static
page, the health check) answer any Host but carry no data.
"""

from __future__ import annotations

import base64
import os
import socket
from pathlib import Path

import pytest

from dashboard_server import dashboard_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def port(sweep_db, tmp_path_factory):
    pytest.importorskip("streamlit")
    tmp = tmp_path_factory.mktemp("server")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(tmp)}
    with dashboard_server(sweep_db, cwd=tmp, env=env, extra_args=("--allowed-host", "dash.example")) as port:
        yield port


def _websocket_status(port: int, host: str, origin: str | None) -> int:
    """The HTTP status of a WebSocket handshake on the app's stream (101: connected)."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET /_stcore/stream HTTP/1.1", f"Host: {host}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13", "Sec-WebSocket-Protocol: streamlit"]
    if origin:
        lines.append(f"Origin: {origin}")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = s.recv(4096).decode(errors="replace")
    return int(head.split()[1])


def test_websocket_refuses_a_rebound_host_and_a_foreign_origin(port):
    here = f"127.0.0.1:{port}"
    assert _websocket_status(port, here, f"http://{here}") == 101
    assert _websocket_status(port, f"localhost:{port}", f"http://localhost:{port}") == 101
    assert _websocket_status(port, f"dash.example:{port}", f"http://dash.example:{port}") == 101  # --allowed-host
    # DNS rebinding: the attacker's name in Host (and Origin) while the socket is 127.0.0.1
    assert _websocket_status(port, f"evil.example:{port}", f"http://evil.example:{port}") != 101
    assert _websocket_status(port, f"evil.example:{port}", None) != 101
    # another site's page scripting a WebSocket to the right host
    assert _websocket_status(port, here, "http://evil.example") != 101
