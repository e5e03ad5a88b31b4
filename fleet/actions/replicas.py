"""Verbs on replicas: create one for a profile, stop one, restart one (stop, and let the
reconciler start a fresh one with the profile's current settings)."""

from __future__ import annotations

import uuid

from django.db import transaction

from audit.events import record_event
from audit.models import EventKind
from catalog.models import Profile, newest_engine_versions
from fleet import commands
from fleet.models import Replica, ReplicaState, ShardState, replica_secret
from fleet.reconcile_report import ReconcileReport
from fleet.transitions import transition


def create_replica(profile: Profile, why: str, report: ReconcileReport | None = None) -> Replica:
    """A new replica of ``profile`` with its current settings, waiting to be placed.

    Its engine version is the profile's resolved one; "" (no pin, none in the catalog)
    is settled when it is placed, from what the chosen node has.
    """
    replica_id = uuid.uuid4()
    newest = newest_engine_versions()
    with transaction.atomic():
        replica = Replica.objects.create(
            id=replica_id,
            model_name=profile.model.name,
            profile_name=profile.name,
            profile=profile,
            fingerprint=profile.fingerprint(newest),
            engine=profile.engine,
            engine_version=profile.resolved_engine_version(newest),
            secret=replica_secret(replica_id),
        )
        record_event(EventKind.REPLICA, str(replica.id), why, to_state=ReplicaState.PLACING)
    if report is not None:
        report.created.append(str(replica.id))
    return replica


def stop_replica(
    replica: Replica,
    reason: str,
    report: ReconcileReport | None = None,
    epoch: int | None = None,
    *,
    actor=None,
) -> bool:
    """Move a replica to stopping and tell its nodes to stop its shards.

    ``epoch`` is the leader epoch the caller acts under (the reconciler's own); None for
    an operator's action, which acts under the current lease.
    """

    with transaction.atomic():
        if (
            transition(Replica, replica.id, ReplicaState.STOPPING, reason, actor=actor,
                       reasons=[reason])
            is None
        ):  # fmt: skip
            return False
        live = replica.shards.exclude(state__in=ShardState.FINAL).exclude(node=None)
        for node_id, shard_id in live.values_list("node_id", "id"):
            transaction.on_commit(
                lambda n=node_id, s=shard_id: commands.send_stop_shard(n, s, epoch)
            )
    if report is not None:
        report.stopping.append(str(replica.id))
    return True


def restart_replica(replica_id, *, actor=None) -> bool:
    """Mark a replica for replacement: it stops, and the reconciler starts a fresh one.

    That is how a stale replica picks up its profile's new settings. False when the
    replica is gone or already stopping.
    """
    with transaction.atomic():
        replica = Replica.objects.filter(id=replica_id).first()
        # Stopping tells the nodes to stop the engines; the reconciler replaces it.
        return replica is not None and stop_replica(replica, "restart requested", actor=actor)
