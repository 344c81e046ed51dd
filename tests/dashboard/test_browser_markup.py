"""Run-store text is shown as written, never rendered as Markdown: in a real
browser, a tag, sweep name, device, pass, config or error holding an image or a
link to a local server makes no request to it and draws no <img> or <a>
(imported runs are other people's text) — in text, captions, tables, figures
and widget options alike (a radio's options are Markdown)."""

from __future__ import annotations

import http.server
import os
import shutil
import threading
from urllib.parse import urlparse

import pytest

from dashboard_server import dashboard_server
from test_browser import CHROMIUM, CHROMIUM_ARGS, ROOT, _need_browser, _settle

duckdb = pytest.importorskip("duckdb")
pytestmark = pytest.mark.xdist_group("browser")  # one browser at a time (test_browser.py)


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
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counter)  # port 0: the system picks a free one
    port = server.server_address[1]
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
    # two passes, so the Overview draws its pass radio; dilated gets a second config, named in its series
    con.execute("UPDATE measurements SET pass = ? WHERE seq_len = 48", [f"![p]({url}/pass.png)"])
    con.execute("UPDATE measurements SET config = ? WHERE variant = 'dilated' AND seq_len = 96",
                [f'{{"note": "![c]({url}/config.png)"}}'])
    con.close()

    from playwright.sync_api import sync_playwright

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(tmp_path), "DILCOMPILE_REFERENCE_RUNS": str(tmp_path / "none")}
    with dashboard_server(db, cwd=tmp_path, env=env) as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1600})
        fetched: list[str] = []  # what the browser asked of the bait server (the server counts too)
        page.on("request", lambda r: fetched.append(r.url) if urlparse(r.url).port == bait else None)
        page.goto(f"http://127.0.0.1:{port}")
        _settle(page, "Overview")
        assert page.get_by_text(f"![t]({url}/tag.png)", exact=False).count() >= 1  # shown as written
        assert page.get_by_text(f"![d]({url}/device.png)", exact=False).count() >= 1
        radio = page.get_by_test_id("stRadio")
        option = radio.get_by_text(f"![p]({url}/pass.png)", exact=True)
        option.wait_for(timeout=60_000)
        assert option.count() == 1  # a radio option, literally
        radio.get_by_text("fwd", exact=True).click()  # the other pass: the page reruns with it
        _settle(page, "Overview")
        for title in ("Overview", "Run", "Compare", "Regressions"):
            page.get_by_test_id("stSidebarNav").get_by_role("link", name=title).click()
            _settle(page, title)
            page.wait_for_timeout(1500)  # let images and fonts load, if any were made
            if title == "Run":
                assert page.get_by_text(f"![e]({url}/error.png)", exact=False).count() >= 1
            if title == "Compare":  # open the baseline's options: series named by the stored config
                box = page.get_by_test_id("stSelectbox").filter(has_text="baseline").locator("input")
                box.scroll_into_view_if_needed()
                box.click()
                assert page.get_by_role("option").filter(has_text=f"![c]({url}/config.png)").count() >= 1
                page.keyboard.press("Escape")
            links = page.locator(f'a[href*="127.0.0.1:{bait}"], img[src*="127.0.0.1:{bait}"]')
            assert links.count() == 0, f"{title}: {links.first.evaluate('e => e.outerHTML')}"
            assert page.get_by_test_id("stException").count() == 0
        browser.close()
    assert fetched == [] and _Counter.hits == [], f"the browser fetched {fetched} {_Counter.hits}"
