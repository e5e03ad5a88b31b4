"""The cluster page in Chromium against 2,000 nodes (rows as agents leave them, no agents):
it shows the fleet's counts and a page of nodes, a filter narrows it, and it stays live
through the real heartbeat writer (and the transition it makes), without a reload."""

from __future__ import annotations

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from fleet.link.heartbeats import write_heartbeats
from fleet.models import Node, NodeState
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
from tests.pages.rows import many_nodes, usage
from tests.processes.support import control_plane, free_port, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_the_cluster_page_of_2000_nodes_pages_filters_and_stays_live(
    browser, processes, tmp_path, screenshot
):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    start(processes, control_plane(port, tmp_path))
    # Seeded while the control plane starts; it reads nothing of the fleet until asked.
    many_nodes(2000)  # gpu00099, gpu00199, … gpu01999 unreachable: 20 of them
    make_user("rita")
    wait_until(lambda: answers(base), 60, "the control plane to answer")
    page = signed_in_page(browser, base, "rita")
    rows = page.locator("#nodes tr.node")
    counts = page.locator("#nodes .node-counts")

    # The whole fleet counted, and its first page of 50 shown.
    open_live(page, "/")
    expect(counts).to_have_text("2,000 nodes: 1,980 connected, 20 unreachable")
    expect(rows).to_have_count(50)
    expect(rows.first).to_have_attribute("id", "node-gpu00000")
    expect(page.locator(".node-pager").first).to_contain_text("showing 1–50 of 2,000")
    # A heartbeat of a node shown, through the heartbeat writer, redraws its row.
    cpu = page.locator('tr[id="node-gpu00001"] td.cpu')
    expect(cpu).to_contain_text("1%")
    off_loop(write_heartbeats, {"gpu00001": (timezone.now(), usage(cpu_percent=77.0))})
    expect(cpu).to_contain_text("77%", timeout=WAIT_MS)
    assert_not_reloaded(page)

    page.locator('.node-pager a[rel="next"]').first.click()
    page.wait_for_url(f"{base}/?page=2")
    expect(rows.first).to_have_attribute("id", "node-gpu00050")

    # The filter bar, as a plain form: only the unreachable ones.
    page.select_option("form.node-filter select[name=state]", "unreachable")
    page.click("form.node-filter button[type=submit]")
    page.wait_for_url(f"{base}/?state=unreachable")
    expect(page.locator("#live-status")).to_have_attribute("data-live", "live", timeout=WAIT_MS)
    page.evaluate("window.llmgwTestMarker = 'not reloaded'")
    expect(rows).to_have_count(20)
    expect(page.locator(".node-pager").first).to_contain_text("showing 1–20 of 20 matching")
    screenshot(page, "cluster-2000-unreachable")

    # One is heard again: the writer brings it back (the transition verb), so it leaves
    # this filter, and the counts say so.
    off_loop(write_heartbeats, {"gpu00199": (timezone.now(), usage())})
    expect(counts).to_have_text("2,000 nodes: 1,981 connected, 19 unreachable", timeout=WAIT_MS)
    expect(rows).to_have_count(19)
    expect(page.locator('tr[id="node-gpu00199"]')).to_have_count(0)
    assert Node.objects.get(id="gpu00199").state == NodeState.CONNECTED
    assert_not_reloaded(page)
