"""Silence says nothing while nobody could hear it: after a failover, or the first start
in a leader's term of the control plane that takes the agents' links, every node gets a
full NODE_LOST_AFTER; a restart after that, or a time in the future, gives none."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from fleet import leadership
from fleet.models import Node, NodeState
from fleet.tasks import check_liveness_task
from tests.factories import make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def lease_key(settings):
    settings.LEADER_LEASE_KEY = f"llmgw:test-lease:{uuid.uuid4().hex[:8]}"
    settings.NODE_LOST_AFTER = 60
    yield settings.LEADER_LEASE_KEY
    conn = leadership.client()
    conn.delete(*conn.keys(settings.LEADER_LEASE_KEY + "*"))


def leading_for(lease_key: str, seconds: float) -> None:
    """This control plane has held the lease for ``seconds``."""
    lease = leadership.acquire_or_renew()
    leadership.client().set(f"{lease_key}:since:{lease.epoch}", str(time.time() - seconds))


def silent_node(seconds: float) -> str:
    heard = timezone.now() - timedelta(seconds=seconds)
    make_node("node01", state=NodeState.UNREACHABLE, registered_at=heard, last_heartbeat=heard)
    return "node01"


def test_a_node_silent_since_before_the_link_server_restarted_is_not_lost_yet(lease_key):
    leading_for(lease_key, 3600)
    node = silent_node(90)
    leadership.record_links_opened(at=time.time() - 10)  # daphne came back 10 s ago

    report = check_liveness_task()

    assert report["lost"] == []
    assert Node.objects.get(id=node).state == NodeState.UNREACHABLE


def test_once_the_link_server_has_been_up_a_full_lost_after_the_node_is_lost(lease_key):
    leading_for(lease_key, 3600)
    node = silent_node(90)
    leadership.record_links_opened(at=time.time() - 61)

    report = check_liveness_task()

    assert report["lost"] == [node]


def test_links_opened_by_another_control_plane_give_no_grace(lease_key):
    leading_for(lease_key, 3600)
    node = silent_node(90)
    leadership.record_links_opened(at=time.time() - 10, me="ws://standby:8000")

    assert check_liveness_task()["lost"] == [node]


def test_a_node_still_reconnecting_after_the_control_plane_heard_nobody_is_not_lost(lease_key):
    # The control plane was cut off from every node: nobody could be heard, so nobody was
    # marked. Once the first nodes are back the silence is no longer mass, but the rest
    # reconnect on their own (jittered, backed-off) time: their silence says nothing yet.
    leading_for(lease_key, 3600)
    heard = timezone.now() - timedelta(seconds=90)
    for node_id in ("node01", "node02", "node03"):
        make_node(node_id, registered_at=heard, last_heartbeat=heard)

    deaf = check_liveness_task()  # every node silent: we suspect ourselves
    assert deaf["held_back"] and deaf["lost"] == []
    Node.objects.filter(id__in=["node02", "node03"]).update(last_heartbeat=timezone.now())
    back = check_liveness_task()

    assert back["lost"] == []
    assert Node.objects.get(id="node01").state == NodeState.UNREACHABLE


def test_a_node_silent_a_full_lost_after_past_the_deafness_is_lost(lease_key):
    leading_for(lease_key, 3600)
    heard = timezone.now() - timedelta(seconds=200)
    for node_id in ("node01", "node02", "node03"):
        make_node(node_id, registered_at=heard, last_heartbeat=heard)
    assert check_liveness_task()["held_back"]
    leadership.record_deaf(at=time.time() - 61)  # the last pass that heard nobody: 61 s ago
    Node.objects.filter(id__in=["node02", "node03"]).update(last_heartbeat=timezone.now())

    assert check_liveness_task()["lost"] == ["node01"]


def test_a_control_plane_that_keeps_restarting_does_not_hold_lost_detection_off(lease_key):
    # A daphne that OOMs every 30 s starts again each time (finding 19): its grace is the
    # term's first start, not every start, so a node that died is lost all the same.
    lost_after = 60
    with time_machine.travel(time.time(), tick=False) as clock:
        leading_for(lease_key, 3600)
        node = silent_node(200)
        lost_at = None
        for seconds in range(0, 2 * lost_after + 1, 30):
            leadership.record_links_opened()  # the process starts again
            if node in check_liveness_task()["lost"]:
                lost_at = seconds
                break
            clock.shift(30)

    assert lost_at is not None, "still not lost after 2 x NODE_LOST_AFTER"
    assert lost_at >= lost_after  # the first start's grace held, once


@pytest.mark.parametrize("record", [leadership.record_links_opened, leadership.record_deaf])
def test_a_grace_said_to_start_in_the_future_is_ignored(lease_key, record):
    # What anything that can write to Redis could set, to hold detection off for good.
    leading_for(lease_key, 3600)
    node = silent_node(90)
    record(at=time.time() + 24 * 3600)

    assert check_liveness_task()["lost"] == [node]


def test_a_leader_that_just_took_over_gives_nodes_time_to_relink_however_often_it_starts(
    lease_key,
):
    with time_machine.travel(time.time(), tick=False) as clock:
        leading_for(lease_key, 10)  # a failover 10 s ago: nodes are still finding it
        node = silent_node(90)
        for _restart in range(3):
            leadership.record_links_opened()
            assert check_liveness_task()["lost"] == []
            clock.shift(15)
        clock.shift(30)  # a full NODE_LOST_AFTER since the failover

        assert check_liveness_task()["lost"] == [node]
