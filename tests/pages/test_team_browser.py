"""The team pages in Chromium against a live control plane and the test identity provider
(tests/oidc_provider), each its own process: a lead whose provider groups make her
research's lead signs in, lands on its page, sees only its models, makes a key for the team
(shown once) and finds another team's page missing; a member signing in with a password lands
on the team's page too, and is refused an operator's page."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from catalog.models import ApiKey, Membership, Team
from tests.factories import make_model, make_user
from tests.oidc_provider.fixture import ROLE_MAP, start_test_provider
from tests.pages.browser import WAIT_MS, answers, start, through_provider
from tests.processes.support import control_plane, free_port, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_a_lead_and_a_member_on_their_team_page(browser, processes, tmp_path, screenshot):
    research = Team.objects.create(name="research", key_cap={"tokens_per_day": 300})
    blue = Team.objects.create(name="blue")
    make_model("qwen", source="/models/qwen.gguf").teams.add(research)
    make_model("llama", source="/models/llama.gguf").teams.add(blue)
    Membership.objects.create(team=research, user=make_user("mia"), role="member")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    idp = start_test_provider(processes, tmp_path / "provider", [f"{base}/accounts/oidc/callback/"])
    env = {
        **idp.llmgw_environment(),
        "LLMGW_OIDC_ROLE_MAP": f"{ROLE_MAP},ml-leads=team:research:lead",
    }
    start(processes, control_plane(port, tmp_path, **env))
    wait_until(lambda: answers(base), 90, "the control plane")

    # tess is in ml-leads at the provider: research's lead, landing on its page.
    page = through_provider(browser, base, "tess")
    page.wait_for_url(f"{base}/teams/research/", timeout=WAIT_MS)
    expect(page.locator("#team-role")).to_contain_text("You are its lead.")
    expect(page.locator("#team-models li")).to_have_count(1)
    expect(page.locator('#team-models li[data-model="qwen"]')).to_be_visible()
    expect(page.locator("tr[data-member]")).to_have_count(2)
    expect(page.locator("#team-usage")).to_contain_text("No requests in the last day.")

    # A key for the team (not for a member), shown once.
    page.fill("#key-name", "research-ci")
    page.select_option("#key-member", "")
    page.check('input[name="models"][value="qwen"]')
    page.click("#new-key-form button[type=submit]")
    expect(page.locator("#new-key")).to_contain_text("shown this once")
    key = page.locator("#new-key-value").inner_text()
    made = ApiKey.objects.get(name="research-ci")
    assert key.startswith(made.prefix) and len(key) > len(made.prefix)
    assert (made.team.name, made.member, made.allowed_models) == ("research", None, ["qwen"])
    expect(page.locator(f'tr[data-key="{made.prefix}"]')).to_contain_text("the team")
    screenshot(page, "team-lead-new-key")
    page.goto(f"{base}/teams/research/")
    expect(page.locator(f'tr[data-key="{made.prefix}"]')).to_be_visible()
    assert key not in page.content()

    # Another team's page, and its usage, do not exist for her.
    answer = page.goto(f"{base}/teams/blue/")
    assert answer is not None and answer.status == 404
    answer = page.goto(f"{base}/usage/teams/blue/")
    assert answer is not None and answer.status == 404
    page.goto(f"{base}/teams/")
    expect(page.locator("tr[data-team]")).to_have_count(1)
    expect(page.locator('tr[data-team="research"]')).to_contain_text("lead")

    # mia, a member with a password, lands on the team too, and is no operator.
    page = browser.new_context(viewport={"width": 1200, "height": 800}).new_page()
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", "mia")
    page.fill("#id_password", "pw-mia")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/teams/research/", timeout=WAIT_MS)
    expect(page.locator("#team-role")).to_contain_text("You are its member.")
    expect(page.locator(f'tr[data-key="{made.prefix}"] button.revoke')).to_have_count(0)
    answer = page.goto(f"{base}/deploy/")
    assert answer is not None and answer.status == 403
    expect(page.locator("body")).to_contain_text("needs the operator role")
