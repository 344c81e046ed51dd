"""Run-store text is shown as written, never rendered as Markdown: in a real
browser, a tag, sweep name, device or error holding an image or a link to a
local server makes no request to it and draws no <img> or <a> (imported runs
are other people's text)."""

from __future__ import annotations

import http.server
import os
import shutil
import threading

import pytest

from dashboard_server import dashboard_server, free_port
from test_browser import CHROMIUM, CHROMIUM_ARGS, ROOT, _need_browser, _settle

duckdb = pytest.importorskip("duckdb")


class _Counter(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802
        _Counter.hits.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def bait():
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Counter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Counter.hits = []
    yield port
    server.shutdown()
    server.server_close()


def test_stored_text_with_markup_renders_as_text(sweep_db, tmp_path, bait):
    _need_browser()
    db = str(tmp_path / "imported.duckdb")
    shutil.copy(sweep_db, db)
    url = f"http://127.0.0.1:{bait}"
    con = duckdb.connect(db)
    con.execute("UPDATE sweeps SET tag = ?, sweep_name = ?", [f"![t]({url}/tag.png)", f"[docs]({url}/name)"])
    con.execute("UPDATE measurements SET tag = ?, device = ?",
                [f"![t]({url}/tag.png)", f"![d]({url}/device.png) :red[x] $y$ www.example.com"])
    latest = con.execute("SELECT run_id FROM measurements ORDER BY started_at DESC LIMIT 1").fetchone()[0]
    con.execute("UPDATE measurements SET status = 'error', error = ?, telemetry_status = ? WHERE run_id = ?",
                [f"![e]({url}/error.png) [more]({url}/more)", f"[tele]({url}/tele)", latest])
    con.close()

    from playwright.sync_api import sync_playwright

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(tmp_path), "DILCOMPILE_REFERENCE_RUNS": str(tmp_path / "none")}
    with dashboard_server(db, cwd=tmp_path, env=env) as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1600})
        page.goto(f"http://127.0.0.1:{port}")
        _settle(page, "Overview")
        assert page.get_by_text(f"![t]({url}/tag.png)", exact=False).count() >= 1  # shown as written
        assert page.get_by_text(f"![d]({url}/device.png)", exact=False).count() >= 1
        for title in ("Overview", "Run", "Compare", "Regressions"):
            page.get_by_test_id("stSidebarNav").get_by_role("link", name=title).click()
            _settle(page, title)
            page.wait_for_timeout(1500)  # let images and fonts load, if any were made
            if title == "Run":
                assert page.get_by_text(f"![e]({url}/error.png)", exact=False).count() >= 1
            links = page.locator(f'a[href*="127.0.0.1:{bait}"], img[src*="127.0.0.1:{bait}"]')
            assert links.count() == 0, f"{title}: {links.first.evaluate('e => e.outerHTML')}"
            assert page.get_by_test_id("stException").count() == 0
        browser.close()
    assert _Counter.hits == [], f"the browser fetched {_Counter.hits}"
