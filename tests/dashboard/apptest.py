"""Opening a dashboard page under Streamlit's AppTest, for the page tests."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def open_page(name: str) -> AppTest:
    """``views/<name>.py`` run once; fails on any exception the page raised."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page(f"views/{name}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at
