"""Two control planes: one leads, the standby refuses links, and a failover loses no node."""

from __future__ import annotations

import uuid

import pytest

from audit.models import Event
from fleet import leadership
from fleet.models import Node
from fleet.pki.tokens import node_token
from tests.processes.support import (
    agent,
    control_plane,
    free_port,
    listening,
    reconciler,
    wait_until,
)

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_one_leader_standby_refuses_links_and_failover_marks_no_node_lost(
    processes, tmp_path, settings
):
    lease_key = f"llmgw:test-leader:{uuid.uuid4().hex[:8]}"
    settings.LEADER_LEASE_KEY = lease_key
    ports = {"a": free_port(), "b": free_port()}
    planes = {}
    for name, port in ports.items():
        env = {
            "LLMGW_CONTROL_PLANE_ID": f"ws://127.0.0.1:{port}",
            "LLMGW_LEADER_LEASE_KEY": lease_key,
            "LLMGW_DEMO": "0",
        }
        web = control_plane(port, tmp_path, **env).start()
        beat = reconciler(f"reconciler-{name}", tmp_path, **env).start()
        processes.extend([web, beat])
        planes[name] = (web, beat)
        if name == "a":
            wait_until(leadership.current, 60, "control plane a to take the lease")
    assert leadership.current().holder == f"ws://127.0.0.1:{ports['a']}"
    for port in ports.values():
        wait_until(lambda p=port: listening(p), 60, f"control plane on port {port}")

    node_id = f"test-{uuid.uuid4().hex[:8]}"
    servers = f"ws://127.0.0.1:{ports['b']},ws://127.0.0.1:{ports['a']}"
    worker = agent(node_id, servers, node_token(node_id), tmp_path, tmp_path).start()
    processes.append(worker)
    wait_until(lambda: Node.objects.filter(id=node_id, state="connected").exists(), 60,
             "the agent to link through the leader")  # fmt: skip
    assert (
        f"refused the link: this control plane is a standby; the leader is "
        f"ws://127.0.0.1:{ports['a']}" in worker.output()
    )

    for process in planes["a"]:
        process.kill()
    new_leader = f"ws://127.0.0.1:{ports['b']}"
    wait_until(lambda: (leadership.current() or leadership.Lease("", 0)).holder == new_leader, 20,
             "the standby to take over within the lease time")  # fmt: skip
    wait_until(lambda: f"linked to control plane {new_leader}/agent/" in worker.output(), 60,
             "the agent to relink to the new leader")  # fmt: skip
    wait_until(lambda: Node.objects.get(id=node_id).usage_reported_at is not None, 30, "heartbeats")
    assert Node.objects.get(id=node_id).state == "connected"
    assert not Event.objects.filter(subject=node_id, to_state="lost").exists()
