"""The leader epoch only grows, even when Redis loses the lease and its counter.

Agents refuse commands from an epoch older than the newest they have seen; an epoch that
started again at 1 after a Redis restart would have every command ignored, for good.
"""

from __future__ import annotations

import uuid

import pytest

from fleet import leadership
from fleet.models import Node
from fleet.tasks import lease_as_leader
from tests.fleet.queues import queued_commands

pytestmark = pytest.mark.django_db


@pytest.fixture
def lease_key(settings):
    settings.LEADER_LEASE_KEY = f"llmgw:test-lease:{uuid.uuid4().hex[:8]}"
    yield settings.LEADER_LEASE_KEY
    leadership.client().delete(settings.LEADER_LEASE_KEY, settings.LEADER_LEASE_KEY + ":epoch")


def test_an_epoch_taken_after_redis_lost_everything_is_above_every_earlier_one(lease_key):
    first = leadership.acquire_or_renew("ws://a:8000")
    assert first.acquired_now
    leadership.release("ws://a:8000")
    second = leadership.acquire_or_renew("ws://b:8000")
    assert second.epoch > first.epoch
    # A restarted Redis holds neither the lease nor the epoch counter.
    leadership.client().delete(lease_key, lease_key + ":epoch")
    third = leadership.acquire_or_renew("ws://a:8000")
    assert third.acquired_now and third.holder == "ws://a:8000"
    assert third.epoch > second.epoch


def test_renewing_keeps_the_epoch(lease_key):
    taken = leadership.acquire_or_renew("ws://a:8000")
    renewed = leadership.acquire_or_renew("ws://a:8000")
    assert (renewed.epoch, renewed.acquired_now) == (taken.epoch, False)
    other = leadership.acquire_or_renew("ws://b:8000")
    assert (other.holder, other.epoch) == ("ws://a:8000", taken.epoch)


def test_a_control_plane_taking_the_lease_tells_every_node_its_epoch(lease_key, settings):
    # Agents learn epochs from commands; one the new leader never commands would still
    # obey the deposed leader's late stop without this.
    nodes = [f"epoch-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    Node.objects.create(id=nodes[0], state="connected")
    Node.objects.create(id=nodes[1], state="lost")  # one that comes back reads its queue
    leadership.acquire_or_renew("ws://other:8000")
    leadership.release("ws://other:8000")
    settings.CONTROL_PLANE_ID = "ws://me:8000"

    taken = lease_as_leader()
    lease_as_leader()  # renewing says nothing more

    assert taken.acquired_now and taken.epoch >= 2
    for node in nodes:
        assert queued_commands(node, orders=True) == [("agent.leader_epoch", [taken.epoch])]
