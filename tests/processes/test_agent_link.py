"""A real agent worker and a real control plane (daphne) over real Redis and PostgreSQL."""

from __future__ import annotations

import signal
import uuid
from datetime import timedelta

import pytest

from audit.models import Event
from fleet.link.liveness import check_liveness
from fleet.models import Node
from fleet.pki.tokens import node_token
from tests.processes.support import agent, control_plane, free_port, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def node_row(node_id):
    return Node.objects.filter(id=node_id).first()


def test_agent_registers_heartbeats_goes_silent_and_comes_back(processes, tmp_path):
    node_id = f"test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    processes.append(control_plane(port, tmp_path).start())
    worker = agent(node_id, f"ws://127.0.0.1:{port}", node_token(node_id), tmp_path, tmp_path)
    processes.append(worker.start())

    node = wait_until(lambda: node_row(node_id), 60, f"node {node_id} to register")
    assert node.state == "connected"
    assert node.inventory["hostname"] == node_id
    assert node.inventory["cpu"]["cores"] >= 1
    assert node.engines is not None  # the agent probed, so a list (maybe empty) is meant

    first = wait_until(lambda: node_row(node_id).usage_reported_at, 30, "a heartbeat to be written")
    wait_until(lambda: node_row(node_id).usage_reported_at > first, 30, "a second heartbeat")
    usage = node_row(node_id).usage
    assert usage["memory_total"] > 0 and 0 <= usage["cpu_percent"] <= 100

    worker.signal(signal.SIGSTOP)
    # Heartbeats stop: the row's time stops moving.
    silent_since = wait_until(
        lambda: _stable(node_id), 30, "heartbeats to stop while the agent is stopped"
    )
    report = check_liveness(now=silent_since + timedelta(seconds=20))
    assert report.unreachable == [node_id]
    assert node_row(node_id).state == "unreachable"
    report = check_liveness(now=silent_since + timedelta(seconds=70))
    assert report.lost == [node_id]
    assert node_row(node_id).state == "lost"

    worker.kill()
    restarted = agent(node_id, f"ws://127.0.0.1:{port}", node_token(node_id), tmp_path, tmp_path)
    processes.append(restarted.start())
    wait_until(lambda: node_row(node_id).state == "connected", 60, "the node to be connected again")
    assert Node.objects.filter(id=node_id).count() == 1
    reasons = list(
        Event.objects.filter(subject=node_id)
        .exclude(to_state="")
        .order_by("at", "id")
        .values_list("to_state", flat=True)
    )
    assert reasons == ["connected", "unreachable", "lost", "connected"]


def _stable(node_id):
    """The heartbeat time, once two reads 3 s apart agree (batched writes lag ~2 s)."""
    import time

    first = node_row(node_id).last_heartbeat
    time.sleep(3)
    second = node_row(node_id).last_heartbeat
    return second if first == second else None


def test_a_node_with_another_nodes_token_is_refused_naming_both(processes, tmp_path):
    node_id = f"test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    processes.append(control_plane(port, tmp_path).start())
    impostor = agent(node_id, f"ws://127.0.0.1:{port}", node_token("someone-else"), tmp_path,
                     tmp_path)  # fmt: skip
    processes.append(impostor.start())
    wait_until(
        lambda: "but its token was issued to 'someone-else'" in impostor.output(),
        60,
        "the agent to log the refusal",
    )
    assert f"claims to be node '{node_id}'" in impostor.output()
    assert node_row(node_id) is None
