"""The reconciler's beat tasks (queue ``control``); thin wrappers over plain functions.

Only the leader runs them: each task first takes or renews the Redis lease.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import wraps

from celery import shared_task
from django.conf import settings

from fleet import commands, leadership
from fleet.link.liveness import check_liveness
from fleet.pki.broker_users import sync_broker_users
from fleet.reconcile.passes import reconcile


def lease_as_leader() -> leadership.Lease:
    """Take or renew the lease; on taking it, tell every node the new epoch first."""
    lease = leadership.acquire_or_renew()
    if lease.acquired_now and lease.holder == leadership.identity():
        commands.announce_epoch(lease.epoch)
    return lease


def leader_only(task: Callable[[leadership.Lease], dict]) -> Callable[[], dict]:
    """Run ``task`` with the lease on the leader only; anywhere else, say who leads."""

    @wraps(task, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
    def on_the_leader() -> dict:
        lease = lease_as_leader()
        if lease.holder != leadership.identity():
            return {"leader": lease.holder}
        return task(lease)

    return on_the_leader


@shared_task(name="fleet.reconcile")
@leader_only
def reconcile_task(lease: leadership.Lease) -> dict:
    report = reconcile(
        epoch=lease.epoch, still_leading=lambda: leadership.still_leading(lease.epoch)
    )
    return report.summary()


@shared_task(name="fleet.check_liveness")
@leader_only
def check_liveness_task(lease: leadership.Lease) -> dict:
    # After a failover, a restart of the control plane taking the links, or a spell in
    # which it heard no node at all, give every node a grace period before declaring it
    # lost: nobody could hear its heartbeats.
    since = leadership.listening_since(lease)
    grace_until = None
    if since is not None:
        grace_until = datetime.fromtimestamp(since, UTC) + timedelta(
            seconds=settings.NODE_LOST_AFTER
        )
    report = check_liveness(grace_until=grace_until)
    if report.deaf:
        leadership.record_deaf()
    return {"unreachable": report.unreachable, "lost": report.lost, "held_back": report.held_back}


@shared_task(name="fleet.sync_broker_users")
def sync_broker_users_task() -> dict:
    """Every node's broker user made again if Redis forgot it (a restart), and revoked
    nodes' deleted; on every control plane's beat (it changes nothing when all is well)."""
    return sync_broker_users()
