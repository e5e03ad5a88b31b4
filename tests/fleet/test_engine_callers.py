"""Who engines' HTTP ports admit: the routers and control planes the leader hears of, told to
every walled node that runs an engine at the next pass after one joins or leaves."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from core.addresses import own_addresses
from fleet.members import MEMBER_GRACE
from fleet.members import engine_callers as computed_callers
from fleet.models import FleetMember
from fleet.reconcile.passes import reconcile
from protocol.commands import ENGINE_CALLERS
from protocol.members import LEFT_KEY_PREFIX, MEMBER_KEY_PREFIX
from protocol.routing import INFLIGHT_KEY_PREFIX
from tests.factories import make_model, make_node, make_profile, make_replica, make_shard
from tests.fleet.inventories import inventory
from tests.fleet.queues import broker, queued_commands

pytestmark = pytest.mark.django_db


@pytest.fixture
def reports():
    """Write routers' and control planes' reports into the real Redis; removed after."""
    client = broker()
    for pattern in (INFLIGHT_KEY_PREFIX, MEMBER_KEY_PREFIX, LEFT_KEY_PREFIX):
        leftover = client.keys(pattern + "*")  # another test's router, a daphne's thread
        if leftover:
            client.delete(*leftover)
    written: list[str] = []

    def write(key: str, body: dict) -> str:
        client.set(key, json.dumps(body), ex=60)
        written.append(key)
        return key

    yield write
    if written:
        client.delete(*written)


def router(write, address: str) -> str:
    name = f"test-{uuid.uuid4().hex[:8]}"
    write(INFLIGHT_KEY_PREFIX + name, {"at": 0, "routed": [], "addresses": [address]})
    return name


def serving_node(node_id: str, address: str, firewall: str = "nftables"):
    facts = inventory(node_id, address=address, firewall=firewall).model_dump(mode="json")
    node = make_node(node_id, address=address, inventory=facts, registered_at=timezone.now())
    profile = make_profile(make_model(f"model-{node_id}"))
    make_shard(make_replica(profile, state="ready"), node=node, port=20000, state="ready")
    return node


# A router another test of this worker ran may still report this machine's own addresses
# for a while: this module's routers have addresses of their own, so those are left out.
MACHINE = set(own_addresses())


def told(node_id: str) -> list[list[str]]:
    """The callers each ENGINE_CALLERS command named."""
    return [[a for a in args[0] if a not in MACHINE]
            for task, args in queued_commands(node_id, orders=True)
            if task == ENGINE_CALLERS]  # fmt: skip


def engine_callers(now=None) -> list[str]:
    """The callers the walls admit, as the reconciler computes them."""
    found = computed_callers(now) if now is not None else computed_callers()
    return [a for a in found if a not in MACHINE]


def test_a_router_and_a_control_plane_heard_are_told_to_walled_nodes_at_the_next_pass(
    reports, node_ids, django_capture_on_commit_callbacks
):
    walled, open_, idle = node_ids
    serving_node(walled, "10.0.0.1")
    serving_node(open_, "10.0.0.2", firewall="unavailable")
    make_node(idle, address="10.0.0.3",
              inventory=inventory(idle, address="10.0.0.3").model_dump(mode="json"))  # fmt: skip
    router(reports, "198.18.0.20")
    reports(MEMBER_KEY_PREFIX + "control-plane:ws://cp1:8000", {"addresses": ["198.18.0.11"]})

    with django_capture_on_commit_callbacks(execute=True):
        report = reconcile()

    assert report.told_callers == [walled]
    assert told(walled) == [["198.18.0.11", "198.18.0.20"]]
    assert told(open_) == [] and told(idle) == []  # no walls there; no engine there
    # Told once: the next pass has nothing new to say.
    with django_capture_on_commit_callbacks(execute=True):
        assert reconcile().told_callers == []


def test_a_router_joining_is_told_within_one_pass_and_one_leaving_cleanly_too(
    reports, node_ids, django_capture_on_commit_callbacks
):
    serving_node(node_ids[0], "10.0.0.1")
    first = router(reports, "198.18.0.20")
    with django_capture_on_commit_callbacks(execute=True):
        reconcile()

    second = router(reports, "198.18.0.21")
    with django_capture_on_commit_callbacks(execute=True):
        reconcile()
    assert told(node_ids[0])[-1] == ["198.18.0.20", "198.18.0.21"]

    broker().delete(INFLIGHT_KEY_PREFIX + first)
    reports(f"{LEFT_KEY_PREFIX}router:{first}", {"at": 0})  # what a router says as it stops
    with django_capture_on_commit_callbacks(execute=True):
        reconcile()
    assert told(node_ids[0])[-1] == ["198.18.0.21"]
    assert FleetMember.objects.get(id=f"router:{second}").left_at is None


def test_a_silent_router_is_admitted_through_a_grace_and_not_after(reports, node_ids):
    name = router(reports, "198.18.0.20")
    now = timezone.now()
    reconcile(now=now)
    broker().delete(INFLIGHT_KEY_PREFIX + name)  # a Redis restart, or a router that stalled

    assert engine_callers(now + MEMBER_GRACE - timedelta(seconds=1)) == ["198.18.0.20"]
    assert engine_callers(now + MEMBER_GRACE + timedelta(seconds=1)) == []


def test_networks_an_operator_names_are_admitted_too(reports, settings):
    settings.ENGINE_CALLERS = ["10.8.0.0/16"]
    router(reports, "198.18.0.20")
    reconcile()

    assert engine_callers() == ["10.8.0.0/16", "198.18.0.20"]


def test_a_report_naming_no_address_is_not_admitted(reports):
    reports(INFLIGHT_KEY_PREFIX + "odd", {"at": 0, "addresses": ["router.example", "10.1.1.1"]})
    reconcile()

    assert engine_callers() == ["10.1.1.1"]
