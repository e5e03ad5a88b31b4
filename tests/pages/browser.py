"""The pages in a real browser against a live stack: starting its processes, signing in,
opening a page live, and knowing it was not reloaded."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from django.db import connections
from playwright.sync_api import expect

from tests.oidc_provider.fixture import provider_password
from tests.processes.support import Process

WAIT_MS = 60_000


def off_loop(function, *args, **kwargs):
    """Call ``function`` in a thread of its own, as the control plane's code runs.

    Playwright's sync API keeps an event loop running in the test's thread, where
    async_to_sync (which tells the pages about a change) refuses to run.
    """

    def call():
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


def start(processes: list[Process], process: Process) -> Process:
    # The browser's event loop is this process's business, not the children's.
    process.env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    processes.append(process.start())
    return process


def signed_in_page(browser, base: str, username: str):
    context = browser.new_context(viewport={"width": 1400, "height": 900}, base_url=base)
    page = context.new_page()
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    return page


def open_live(page, path: str) -> None:
    """Open a page, wait for its socket, and mark it so a reload would show."""
    page.goto(path)
    expect(page.locator("#live-status")).to_have_attribute("data-live", "live", timeout=WAIT_MS)
    page.evaluate("window.llmgwTestMarker = 'not reloaded'")


def assert_not_reloaded(page) -> None:
    assert page.evaluate("window.llmgwTestMarker") == "not reloaded"


def answers(base: str) -> bool:
    """Whether the control plane at ``base`` serves its sign-in page."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}/accounts/login/", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def through_provider(browser, base: str, username: str, path: str = "/accounts/login/"):
    """A fresh browser that starts at llmgw, signs in at the provider as ``username`` and
    comes back wherever llmgw sends it."""
    page = browser.new_context(viewport={"width": 1200, "height": 800}).new_page()
    page.goto(base + path)
    page.get_by_role("link", name="Sign in with Test IdP").click()
    expect(page.locator("h1")).to_have_text("Test IdP", timeout=WAIT_MS)
    page.fill("#idp-username", username)
    page.fill("#idp-password", provider_password(username))
    page.click("#idp-submit")
    return page
