"""Sign-in with the company's identity provider, in Chromium: the test provider
(tests/oidc_provider, django-oauth-toolkit) and the control plane each in their own process.
A person in a mapped group lands signed in with its role; one in no mapped group, and an
answer forged into the callback, are refused on the sign-in page in words."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from tests.oidc_provider.fixture import start_test_provider
from tests.pages.browser import WAIT_MS, answers, start, through_provider
from tests.processes.support import control_plane, free_port, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_sign_in_through_the_provider_in_chromium(browser, processes, tmp_path, screenshot):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    idp = start_test_provider(processes, tmp_path / "provider", [f"{base}/accounts/oidc/callback/"])
    start(processes, control_plane(port, tmp_path, **idp.llmgw_environment()))
    wait_until(lambda: answers(base), 90, "the control plane")

    # lena is in llm-ops at the provider: an operator here, sent on to the page she asked for.
    page = through_provider(browser, base, "lena", "/accounts/login/?next=/deploy/")
    page.wait_for_url(f"{base}/deploy/", timeout=WAIT_MS)
    expect(page.locator("header form.logout button")).to_have_text("Sign out lena")
    expect(page.locator("h1")).not_to_contain_text("Sign in")
    lena = User.objects.get(username="lena")
    assert sorted(lena.groups.values_list("name", flat=True)) == ["operators", "playground"]
    screenshot(page, "oidc-signed-in")

    # otto's groups map to nothing: refused, and told why, on the sign-in page.
    page = through_provider(browser, base, "otto")
    page.wait_for_url(f"{base}/accounts/login/", timeout=WAIT_MS)
    expect(page.locator("p.error[role=alert]")).to_contain_text(
        "Sign-in with Test IdP refused: your account there holds no role here"
    )
    expect(page.locator("header form.logout")).to_have_count(0)
    screenshot(page, "oidc-refused")

    # A callback no sign-in of this browser started (a forged link): refused as such.
    page = browser.new_context().new_page()
    page.goto(f"{base}/accounts/oidc/callback/?code=forged&state=forged")
    page.wait_for_url(f"{base}/accounts/login/", timeout=WAIT_MS)
    expect(page.locator("p.error[role=alert]")).to_contain_text(
        "does not belong to a sign-in started from this browser"
    )
    expect(page.locator("header form.logout")).to_have_count(0)
    assert not User.objects.filter(username="otto").exists()
