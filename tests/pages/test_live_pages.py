"""The pages in a real browser against a live stack: daphne, an agent worker, Redis, PostgreSQL.

Nothing here reloads a page after loading it: every change must arrive over the page's
websocket (checked with a marker set in the page's JavaScript, which a reload would lose).
"""

from __future__ import annotations

import signal
import time
import uuid
from datetime import timedelta

import pytest
from playwright.sync_api import expect

from catalog.actions.entries import apply_catalog
from catalog.models import Profile
from fleet import commands
from fleet.link.liveness import check_liveness
from fleet.models import Node, NodeState, Replica, ReplicaState, Shard, ShardState
from fleet.pki.tokens import node_token
from fleet.transitions import transition
from protocol.commands import EngineCheck
from router.traffic import Traffic
from tests.factories import SETUP, make_user
from tests.pages.browser import (
    WAIT_MS,
    answers,
    assert_not_reloaded,
    off_loop,
    open_live,
    signed_in_page,
    start,
)
from tests.pages.rows import heartbeating_node, router_reported, stale_replica_on
from tests.processes.support import agent, control_plane, free_port, wait_until

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
]

CATALOG = """
models:
  - name: smollm
    source: /models/smollm2-135m.gguf
    profiles:
      - name: cpu
        engine: llama.cpp
        replicas: 1
"""


def heartbeats_stopped(node_id: str):
    """The heartbeat time, once two reads 3 s apart agree (batched writes lag ~2 s)."""
    first = Node.objects.get(id=node_id).last_heartbeat
    time.sleep(3)
    second = Node.objects.get(id=node_id).last_heartbeat
    return second if first == second else None


def test_pages_follow_a_live_agent(browser, processes, tmp_path, screenshot):
    node_id = f"page-{uuid.uuid4().hex[:8]}"
    make_user("olga", operator=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    start(processes, control_plane(port, tmp_path))
    worker = start(
        processes, agent(node_id, f"ws://127.0.0.1:{port}", node_token(node_id), tmp_path, tmp_path)
    )
    wait_until(lambda: Node.objects.filter(id=node_id).exists(), 90, f"node {node_id} to register")
    page = signed_in_page(browser, base, "olga")

    # The cluster page: the node connected, with CPU and RAM as bars.
    open_live(page, "/")
    row = page.locator(f'tr[id="node-{node_id}"]')
    expect(row).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
    expect(row.locator("td.cpu .bar span")).to_have_count(1, timeout=WAIT_MS)
    expect(row.locator("td.ram .bar span")).to_have_count(1)
    expect(row.locator("td.ram .meter-label")).to_contain_text("GiB")

    # A model applied appears; its replica starting, then ready, shows in place.
    off_loop(apply_catalog, CATALOG, actor=SETUP)
    model_row = page.locator('tr.model[data-model="smollm"]')
    expect(model_row).to_contain_text("0 / 1", timeout=WAIT_MS)
    profile = Profile.objects.get(model__name="smollm")
    replica = Replica.objects.create(
        model_name="smollm", profile_name="cpu", profile=profile, fingerprint=profile.fingerprint()
    )
    shard = Shard.objects.create(id=Shard.new_id(), replica=replica, node_id=node_id, port=8011)
    off_loop(transition, Replica, replica.id, ReplicaState.STARTING, "placed on the test node",
             actor=SETUP)  # fmt: skip
    replica_box = page.locator(f'[id="replica-{replica.id}"]')
    expect(replica_box).to_have_attribute("data-state", "starting", timeout=WAIT_MS)
    off_loop(transition, Shard, shard.id, ShardState.STARTING, "engine starting", actor=SETUP)
    off_loop(transition, Shard, shard.id, ShardState.READY, "engine answers /health", actor=SETUP)
    off_loop(transition, Replica, replica.id, ReplicaState.READY, "every rank is ready",
             actor=SETUP)  # fmt: skip
    expect(replica_box).to_have_attribute("data-state", "ready", timeout=WAIT_MS)
    expect(model_row).to_contain_text("1 / 1")
    assert_not_reloaded(page)
    screenshot(page, "cluster")

    # The node page: current use, the engine running there, and charts with points.
    open_live(page, f"/nodes/{node_id}/")
    expect(page.locator(f'#node-summary tr[data-shard="{shard.id}"]')).to_contain_text("smollm")
    page.wait_for_function(
        """() => {
            const data = document.getElementById('history-data');
            const charts = data && JSON.parse(data.textContent).charts;
            return charts && charts[0].x.length >= 2
                && document.querySelectorAll('#node-history canvas').length >= 3;
        }""",
        timeout=90_000,
    )
    points = page.evaluate(
        "JSON.parse(document.getElementById('history-data').textContent).charts"
        ".map(c => [c.id, c.x.length])"
    )
    assert dict(points)["cpu"] >= 2 and dict(points)["memory"] >= 2
    expect(page.locator('[data-chart="queue"] .no-data')).to_contain_text("no data yet")
    screenshot(page, "node")

    # The model page, as an operator sees it, with the traffic a router reported for it.
    served = Traffic()
    for ttft in (0.2, 0.3, 0.9):
        served.first_byte("smollm", ttft)
        served.request("smollm", 200)
    off_loop(router_reported, served.take(), time.time())
    open_live(page, "/models/smollm/")
    expect(page.locator(f'[id="replica-{replica.id}"]')).to_have_attribute("data-state", "ready")
    expect(page.locator('#model-traffic [data-chart="requests"] canvas')).to_have_count(1)
    expect(page.locator('#model-traffic [data-chart="ttft"] canvas')).to_have_count(1)
    expect(page.locator("form.scale button.action")).to_have_count(1)
    screenshot(page, "model")

    # The logs page: the agent's own lines, then new ones as they come (follow mode).
    open_live(page, f"/nodes/{node_id}/logs/?source=agent&n=200&follow=1")
    log = page.locator("#log-lines pre.log")
    expect(log).to_contain_text(f"linked to control plane ws://127.0.0.1:{port}", timeout=WAIT_MS)
    marker = f"marker-{uuid.uuid4().hex}"
    # A signed command whose handling the agent logs, naming the marker.
    off_loop(commands.send, node_id, EngineCheck(engine=marker), 30)
    expect(log).to_contain_text(marker, timeout=WAIT_MS)
    assert_not_reloaded(page)
    screenshot(page, "logs")

    # Stopping the agent turns its row unreachable, without a reload.
    open_live(page, "/")
    expect(row).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
    worker.signal(signal.SIGSTOP)
    silent_since = wait_until(lambda: heartbeats_stopped(node_id), 60, "heartbeats to stop")
    report = off_loop(check_liveness, now=silent_since + timedelta(seconds=20))
    assert report.unreachable == [node_id]
    expect(row).to_have_attribute("data-state", "unreachable", timeout=WAIT_MS)
    expect(row.locator(".badge.state-unreachable")).to_have_text("unreachable")
    assert_not_reloaded(page)
    screenshot(page, "cluster-unreachable")


def test_a_reader_sees_no_action_buttons(browser, processes, tmp_path, screenshot):
    node = heartbeating_node("node01")
    _profile, stale, _fetching, _unplaceable = stale_replica_on(node)
    make_user("rita")
    make_user("olga", operator=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    start(processes, control_plane(port, tmp_path))
    wait_until(lambda: answers(base), 60, "the control plane to answer")

    reader = signed_in_page(browser, base, "rita")
    for path, name, shows in (
        ("/", "cluster-reader", "stale: a rolling restart replaces it"),
        ("/nodes/node01/", "node-reader", "downloading: 2.9 of 14.2 GiB, 39 MiB/s"),
        ("/models/gemma/", "model-reader", "stale: a rolling restart replaces it"),
    ):
        open_live(reader, path)
        expect(reader.locator("main")).to_contain_text(shows)
        expect(reader.locator("button.action")).to_have_count(0)
        expect(reader.locator("[hx-post]")).to_have_count(0)
        screenshot(reader, name)

    operator = signed_in_page(browser, base, "olga")
    open_live(operator, "/")
    expect(operator.locator(f'[id="replica-{stale.id}"] button.action')).to_have_text("Restart")
    open_live(operator, "/nodes/node01/")
    # The node's own action, and the refusals worked out here with theirs (issue 42 item 4).
    expect(operator.locator("button.action")).to_have_text(["Drain", "Check again"])
    # Draining from the page: the button posts, and the change comes back over the socket.
    operator.once("dialog", lambda dialog: dialog.accept())
    operator.get_by_role("button", name="Drain").click()
    expect(operator.locator("#node-summary .badge.draining")).to_have_text("draining")
    expect(operator.locator("button.action")).to_have_text(["Return to service", "Check again"])
    assert Node.objects.get(id="node01").draining
    assert_not_reloaded(operator)


def test_a_dropped_socket_reconnects_and_resyncs(browser, processes, tmp_path, screenshot):
    heartbeating_node("node01")
    make_user("rita")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    daphne = start(processes, control_plane(port, tmp_path))
    wait_until(lambda: answers(base), 60, "the control plane to answer")
    page = signed_in_page(browser, base, "rita")
    open_live(page, "/")
    row = page.locator('tr[id="node-node01"]')
    expect(row).to_have_attribute("data-state", "connected")

    daphne.stop()
    expect(page.locator("#live-status")).to_have_attribute("data-live", "down", timeout=WAIT_MS)
    expect(page.locator("#live-status")).to_contain_text("not live")
    screenshot(page, "cluster-not-live")
    # A change while the page cannot hear: it must still show once the socket is back.
    off_loop(transition, Node, "node01", NodeState.UNREACHABLE, "silent while the page was away",
             actor=SETUP)  # fmt: skip

    start(processes, control_plane(port, tmp_path))
    expect(page.locator("#live-status")).to_have_attribute("data-live", "live", timeout=WAIT_MS)
    expect(row).to_have_attribute("data-state", "unreachable", timeout=WAIT_MS)
    assert_not_reloaded(page)
