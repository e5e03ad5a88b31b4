"""The audit page in Chromium against a live control plane: an operator filters the log,
sees a new Event arrive without a reload, and exports what the filter picks."""

from __future__ import annotations

import csv
import json
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from audit.events import record_event
from audit.models import Event, EventKind
from catalog.actions.api_keys import create_key, revoke_key
from catalog.teams.actions import create_team
from tests.audit.events_made import log_of
from tests.factories import make_user
from tests.pages.browser import (
    WAIT_MS,
    answers,
    assert_not_reloaded,
    off_loop,
    open_live,
    signed_in_page,
    start,
)
from tests.processes.support import control_plane, free_port, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_an_operator_filters_the_log_follows_it_live_and_exports_it(
    browser, processes, tmp_path, screenshot
):
    olga = make_user("olga", operator=True)
    make_user("rita")
    log_of(70, timezone.now() - timedelta(hours=3), kind="node", subject="node07",
           actor_name="sam")  # fmt: skip
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    start(processes, control_plane(port, tmp_path))
    wait_until(lambda: answers(base), 60, "the control plane to answer")
    page = signed_in_page(browser, base, "olga")

    # Olga's sign-in is an Event; the log shows it first, a page of 50 at a time.
    open_live(page, "/audit/")
    rows = page.locator("#audit-events tr.event")
    expect(rows.first).to_have_attribute("data-object", "olga")
    expect(rows.first).to_contain_text("signed in from 127.0.0.1")
    expect(rows).to_have_count(50)

    # Filter to keys: none yet; a key made and revoked arrives live.
    page.select_option('select[name="kind"]', "key")
    page.click(".event-filter button[type=submit]")
    expect(page).to_have_url(f"{base}/audit/?kind=key")
    expect(rows).to_have_count(0)
    open_live(page, "/audit/?kind=key")
    row, _key = off_loop(create_key, "ci", actor=olga)
    off_loop(revoke_key, row.prefix, actor=olga)
    off_loop(record_event, EventKind.NODE, "node08", "drained", actor=olga)  # not a key
    expect(rows).to_have_count(2, timeout=WAIT_MS)
    expect(rows.first).to_contain_text("revoked (it was ci's)")
    expect(rows.nth(1)).to_contain_text("created for ci")
    assert_not_reloaded(page)
    screenshot(page, "audit-keys")

    # Narrow by actor and time, then export what the filter picks, as CSV and JSON.
    page.goto("/audit/")
    page.fill('input[name="actor"]', "sam")
    page.fill('input[name="since"]', "2h")
    page.click(".event-filter button[type=submit]")
    expect(rows.first).to_have_attribute("data-actor", "sam")
    with page.expect_download() as download:
        page.click('a.export[data-format="csv"]')
    with open(download.value.path(), newline="") as file:
        exported = list(csv.DictReader(file))
    picked = Event.objects.filter(actor_name="sam", at__gte=timezone.now() - timedelta(hours=2))
    assert len(exported) == picked.count() > 0
    assert {r["actor"] for r in exported} == {"sam"}
    assert download.value.suggested_filename.endswith(".csv")
    with page.expect_download() as download:
        page.click('a.export[data-format="json"]')
    records = json.loads(download.value.path().read_text())
    assert [r["id"] for r in records] == [int(r["id"]) for r in exported]

    # By team: what was done to its keys and by its members, and nothing of another team's.
    off_loop(create_team, "search", actor=olga)
    off_loop(create_team, "sales", actor=olga)
    search_key, _ = off_loop(create_key, "indexer", team="search", actor=olga)
    sales_key, _ = off_loop(create_key, "crm", team="sales", actor=olga)
    page.goto("/audit/")
    page.fill('input[name="team"]', "search")
    page.click(".event-filter button[type=submit]")
    expect(page).to_have_url(f"{base}/audit/?team=search")
    objects = rows.evaluate_all("rows => rows.map(row => row.dataset.object)")
    assert search_key.prefix in objects and "search" in objects, objects
    assert sales_key.prefix not in objects and "sales" not in objects, objects
    with page.expect_download() as download:
        page.click('a.export[data-format="json"]')
    exported_objects = {r["object"] for r in json.loads(download.value.path().read_text())}
    assert search_key.prefix in exported_objects and sales_key.prefix not in exported_objects
    screenshot(page, "audit-team")

    # A reader sees only her own: her sign-in.
    rita = signed_in_page(browser, base, "rita")
    rita.goto("/audit/")
    expect(rita.locator("#audit-events tr.event")).to_have_count(1)
    expect(rita.locator("#audit-events tr.event")).to_have_attribute("data-object", "rita")
