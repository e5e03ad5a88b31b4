"""The leader epoch only grows, even when Redis loses the lease and its counter.

Agents refuse commands from an epoch older than the newest they have seen; an epoch that
started again at 1 after a Redis restart would have every command ignored, for good.
"""

from __future__ import annotations

import uuid

import pytest

from fleet import leadership

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
