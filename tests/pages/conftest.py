"""A headless Chromium for the page tests: Debian's, driven by Playwright's Python API."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connections

# The process fixture (every process it starts is stopped after the test), shared with
# tests/processes.
from tests.processes.conftest import processes  # noqa: F401

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture
def browser(transactional_db, monkeypatch):
    """A browser for one test, closed before the database is flushed.

    Playwright's sync API keeps an event loop running in the test's thread, and Django
    refuses ORM calls from such a thread; the test's own calls are plain sync code, so
    the check is lifted here (and kept out of child processes by the tests' start()).
    """
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: run scripts/ensure-chromium (never playwright install)"
        )
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        # With Playwright's loop running, Django kept this test's connections apart from
        # the thread's own; close them now, or they would hold the test database open.
        connections.close_all()
        chromium.close()


@pytest.fixture
def screenshot():
    ARTIFACTS.mkdir(exist_ok=True)

    def take(page, name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
