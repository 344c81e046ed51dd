"""The dashboard in a real browser: started by its own command over a real
sweep's store, driven by Playwright in headless Chromium (Debian's package).

Set DILCOMPILE_SCREENSHOTS=<folder> to keep a full-page PNG of every page.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

import pytest

from dashboard_server import dashboard_server

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("DILCOMPILE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
PAGES = ["Overview", "Compare", "Serving", "Run", "Patterns", "Regressions", "SQL"]
# One browser at a time under pytest-xdist: two Chromiums and their servers on two cores would only
# make each wait longer for its pages.
pytestmark = pytest.mark.xdist_group("browser")


def _need_browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"BROWSER TEST SKIPPED: no Chromium at {CHROMIUM}; install it with `apt-get install -y chromium` "
                    "(`make test` does this when run as root)")
    pytest.importorskip("playwright.sync_api", reason="BROWSER TEST SKIPPED: pip install playwright "
                        "(in the test extra: pip install -e '.[test]')")


@pytest.fixture
def server(sweep_db, tmp_path):
    _need_browser()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(tmp_path), "DILCOMPILE_REFERENCE_RUNS": str(tmp_path / "none")}
    with dashboard_server(sweep_db, cwd=tmp_path, env=env) as port:
        yield f"http://127.0.0.1:{port}"


def _settle(page, title: str) -> None:
    """Wait until the page's title is drawn and Streamlit has finished the run."""
    page.get_by_role("heading", name=title, exact=True).wait_for(timeout=90_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=90_000)


def test_click_through_every_page(server):
    from playwright.sync_api import sync_playwright

    shots = os.environ.get("DILCOMPILE_SCREENSHOTS")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # Streamlit scrolls inside its main pane, so a screenshot shows one viewport: make it tall.
        page = browser.new_page(viewport={"width": 1440, "height": 2400 if shots else 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        # Nothing is fetched from outside: the dashboard runs on machines with no internet (its
        # favicon, a Material icon, came from fonts.gstatic.com).
        outside: list[str] = []
        page.on("request", lambda r: outside.append(r.url) if urlparse(r.url).scheme in ("http", "https", "ws", "wss")
                and urlparse(r.url).hostname not in ("127.0.0.1", "localhost") else None)
        page.goto(server)
        _settle(page, "Overview")
        for title in PAGES:
            page.get_by_test_id("stSidebarNav").get_by_role("link", name=title).click()
            _settle(page, title)
            if title == "Compare":
                page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
                assert page.locator(".js-plotly-plot").count() >= 1
                assert page.locator(".js-plotly-plot .scatterlayer .trace").count() >= 2  # sdpa and dilated lines
            if title in ("Run", "Patterns", "Regressions"):
                page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
            if title == "SQL":
                page.get_by_test_id("stDataFrame").first.wait_for(timeout=60_000)  # the example query ran
            assert page.get_by_test_id("stException").count() == 0, f"{title}: {page.get_by_test_id('stException').first.inner_text()}"
            if shots:
                Path(shots).mkdir(parents=True, exist_ok=True)
                page.wait_for_timeout(1000)  # screenshots only: let Plotly finish drawing
                page.screenshot(path=str(Path(shots) / f"{PAGES.index(title)}-{title.lower()}.png"), full_page=True)
        # A deep link opens its page inside the app (titles in the nav, not file names).
        page.goto(f"{server}/compare")
        _settle(page, "Compare")
        assert page.get_by_test_id("stSidebarNav").get_by_role("link", name="Regressions").count() == 1
        page.goto(f"{server}/sql")
        _settle(page, "SQL")
        page.get_by_test_id("stDataFrame").first.wait_for(timeout=60_000)
        # A write on the SQL page is refused, and the store is untouched.
        box = page.get_by_label("query (Ctrl+Enter runs it)")
        box.fill("DROP TABLE measurements")
        box.press("Control+Enter")
        page.get_by_test_id("stAlertContentError").filter(has_text="refused").wait_for(timeout=60_000)
        _settle(page, "SQL")
        if shots:
            page.screenshot(path=str(Path(shots) / "6-sql-refused.png"), full_page=True)
        browser.close()
    assert not errors, errors
    assert not outside, sorted(set(outside))
