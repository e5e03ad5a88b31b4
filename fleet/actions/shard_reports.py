"""Verbs for what agents report of their shards: a shard moves on or downloads, a node's
register says which shards it runs (rebuilding replicas the control plane lost, settling
shards the node no longer runs), and a replica's state follows its shards'.

The agent link calls these with ``AGENT_LINK`` as the actor, the reconciler with its own.
State moves through ``fleet.transitions`` (compare-and-swap, with an event).
"""

from __future__ import annotations

import hmac
import logging
import uuid

from django.db import transaction
from django.utils import timezone

from audit import notices
from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind
from core.humanize import format_bytes
from fleet.models import Replica, ReplicaState, Shard, ShardState
from fleet.pki.keys import replica_secret
from fleet.pki.redaction import replica_secrets, without_secrets
from fleet.transitions import transition
from protocol import messages

log = logging.getLogger("llmgw.fleet")


def record_shard_status(node_id: str, message: messages.ShardStatus, *, actor: Actor) -> bool:
    """Apply a shard's transition as its node reports it; False if refused, stale or unknown."""
    shard = (
        Shard.objects.filter(id=message.shard_id)
        .only("node_id", "state", "status_seq", "replica_id")
        .first()
    )
    if shard is None:
        log.info("node %s reports unknown shard %s (%s)", node_id, message.shard_id, message.state)
        return False
    if shard.node_id != node_id:
        log.warning(
            "node %s reports shard %s, which belongs to %s; ignored",
            node_id, message.shard_id, shard.node_id,
        )  # fmt: skip
        return False
    if _is_stale(shard, message.seq):
        log.info(
            "node %s: %s of shard %s (seq %d) is older than what is held (seq %d); ignored",
            node_id, message.state, shard.id, message.seq, shard.status_seq,
        )  # fmt: skip
        return False
    if shard.state == message.state:
        if message.seq > shard.status_seq:
            Shard.objects.filter(id=shard.id).update(status_seq=message.seq)
        return False
    reason = message.reason or f"node {node_id} reports {message.state}"
    fields: dict[str, object] = {"progress": None, "reason": message.reason}
    if message.seq:
        fields["status_seq"] = message.seq
    if message.pid is not None:
        fields["pid"] = message.pid
    if message.output_tail:
        secrets = replica_secrets(replica_id=shard.replica_id)
        fields["output_tail"] = without_secrets(message.output_tail, secrets)
    changed = (
        transition(Shard, message.shard_id, message.state, reason, actor=actor, **fields)
        is not None
    )
    if changed:
        refresh_replica_state(Shard.objects.get(id=message.shard_id).replica_id, actor=actor)
    return changed


def _is_stale(shard: Shard, seq: int) -> bool:
    # 0 comes from an agent too old to number its statuses: taken as it comes, as before.
    return bool(seq) and seq < shard.status_seq


def record_shard_progress(node_id: str, message: messages.ShardProgress, *, actor: Actor) -> None:
    """Progress is not a transition: it never resets the startup timer. The first of a
    download is recorded (its size, once); the rest only redraw the pages.

    Taken only while the shard fetches: one read after the shard moved on (sent before a
    link drop, say) would show a finished download beside a loading engine until ready.
    """
    progress = {"bytes": message.bytes, "total": message.total, "rate": message.rate}
    fetching = Shard.objects.filter(id=message.shard_id, node_id=node_id, state=ShardState.FETCHING)
    with transaction.atomic():
        # Every transition clears progress: none yet means this download has just begun.
        if fetching.filter(progress__isnull=True).update(progress=progress):
            size = format_bytes(message.total) if message.total else "its length unknown"
            reason = f"downloading its weights ({size})"
            record_event(EventKind.SHARD, message.shard_id, reason, actor=actor)
        elif fetching.update(progress=progress):
            notices.pages_changed_on_commit(EventKind.SHARD, message.shard_id)


def adopt_reported_shards(node_id: str, message: messages.Register, *, actor: Actor) -> list[str]:
    """Rebuild replicas and shards from what the agent says it runs; the rebuilt ids.

    A node speaks only for its own shards. A shard the database knows is updated (unless
    what is held is newer); one whose replica is stopping or stopped is told to stop, so
    a lost node that returns after its stop commands expired leaves no orphan engine. A
    replica the database does not know counts toward its profile only if the control
    plane created it (its secret is the one derived from its id) for the profile as it
    is now; anything else is recorded as the node's and stopped.
    """
    rebuilt: list[str] = []
    if not message.shards:
        return rebuilt
    # No savepoint inside link_node's transaction: a failure there undoes the whole register.
    with transaction.atomic(savepoint=False):
        for running in message.shards:
            replica_id = _adopt_reported_shard(node_id, running, actor)
            if replica_id is not None:
                rebuilt.append(replica_id)
    return rebuilt


def _adopt_reported_shard(
    node_id: str, running: messages.ReportedShard, actor: Actor
) -> str | None:
    spec = running.spec
    locked = Shard.objects.select_for_update(of=("self",)).select_related("replica")
    shard = locked.filter(id=spec.shard_id).first()
    if shard is not None:
        if shard.node_id != node_id or str(shard.replica_id) != spec.replica_id:
            _refuse_report(node_id, spec, f"it belongs to {shard.node_id}, replica "
                           f"{shard.replica_id}", actor)  # fmt: skip
            return None
        replica = shard.replica
        if replica.state in ReplicaState.ENDING or (
            shard.state in ShardState.FINAL and running.state not in ShardState.FINAL
        ):
            _stop_reported(node_id, shard.id, f"replica {replica.id} is {replica.state}")
            return None
        stale = _is_stale(shard, running.seq)
        if not stale and shard.state != running.state:
            fields: dict[str, object] = {"pid": running.pid}
            if running.seq:
                fields["status_seq"] = running.seq
            transition(Shard, shard.id, running.state, f"node {node_id} reports "
                       f"{running.state}", actor=actor, **fields)  # fmt: skip
        elif not stale and running.seq > shard.status_seq:
            Shard.objects.filter(id=shard.id).update(status_seq=running.seq)
        refresh_replica_state(replica.id, actor=actor)
        return None
    try:
        replica_uuid = uuid.UUID(spec.replica_id)
    except ValueError:
        _refuse_report(node_id, spec, f"{spec.replica_id!r} is not a replica id", actor)
        return None
    if Replica.objects.filter(id=replica_uuid).exists():
        _refuse_report(node_id, spec, f"replica {spec.replica_id} has no such shard", actor)
        return None
    return _rebuild_replica(node_id, running, replica_uuid, actor)


def _rebuild_replica(
    node_id: str, running: messages.ReportedShard, replica_id: uuid.UUID, actor: Actor
) -> str:
    """A replica the database lost (or never had), as one node reports it."""
    from catalog.models import Profile

    spec = running.spec
    profile = Profile.objects.filter(model__name=spec.model, name=spec.profile).first()
    ours = bool(spec.api_key) and hmac.compare_digest(spec.api_key, replica_secret(replica_id))
    if not ours:
        distrust = "the control plane did not create it (its secret is not ours)"
    elif profile is None:
        distrust = f"{spec.model}/{spec.profile} is not in the catalog"
    elif spec.fingerprint != profile.fingerprint():
        distrust = f"it was started from another version of {profile}"
    else:
        distrust = ""
    now = timezone.now()
    replica = Replica.objects.create(
        id=replica_id,
        model_name=spec.model,
        profile_name=spec.profile,
        profile=None if distrust else profile,
        fingerprint=spec.fingerprint,
        engine=spec.engine,
        engine_version=spec.engine_version,
        secret=spec.api_key if ours else "",
        state=ReplicaState.STOPPING if distrust else ReplicaState.STARTING,
        reasons=[f"stopping: {distrust}"] if distrust else [],
        starting_since=now,
    )
    why = f"rebuilt from node {node_id}'s report of shard {spec.shard_id}"
    if distrust:
        why += f"; stopping it: {distrust}"
    record_event(EventKind.REPLICA, str(replica.id), why, to_state=replica.state, actor=actor)
    Shard.objects.create(
        id=spec.shard_id,
        replica=replica,
        rank=spec.rank,
        node_id=node_id,
        gpus=spec.gpus,
        port=spec.port,
        state=running.state,
        pid=running.pid,
        status_seq=running.seq,
    )
    if distrust:
        _stop_reported(node_id, spec.shard_id, distrust)
    else:
        refresh_replica_state(replica.id, actor=actor)
    return str(replica.id)


def _refuse_report(node_id: str, spec, why: str, actor: Actor) -> None:
    reason = f"refused node {node_id}'s report of shard {spec.shard_id}: {why}"
    log.warning(reason)
    record_event(EventKind.NODE, node_id, reason, actor=actor)


def _stop_reported(node_id: str, shard_id: str, why: str) -> None:
    from fleet import commands

    log.info("node %s runs shard %s, but %s; stopping it", node_id, shard_id, why)
    transaction.on_commit(lambda: commands.send_stop_shard(node_id, shard_id))


def forget_unreported_shards(
    node_id: str, message: messages.Register, *, actor: Actor
) -> list[str]:
    """Settle shards placed on this node that its agent no longer runs; their ids.

    A shard the agent had reported on (fetching, starting, ready) has failed: its agent or
    engine restarted. A shard of a stopping replica has stopped, whether or not its stop
    was ever answered. A pending shard of a live replica may still be on its way in the
    node's queue, and its startup timeout covers it.
    """
    reported = {running.spec.shard_id for running in message.shards}
    mine = Shard.objects.filter(node_id=node_id).exclude(id__in=reported)
    unsettled = mine.exclude(state__in=ShardState.FINAL).values_list(
        "id", "replica_id", "state", "replica__state"
    )
    settled = []
    for shard_id, replica_id, state, replica_state in unsettled:
        if replica_state in ReplicaState.ENDING:
            reason = f"node {node_id} registered without it: it is not running there"
            if transition(Shard, shard_id, ShardState.STOPPED, reason, actor=actor,
                          reason=reason, progress=None):  # fmt: skip
                settled.append(shard_id)
        elif state != ShardState.PENDING:
            reason = f"node {node_id} registered without it (its agent or engine restarted)"
            if transition(Shard, shard_id, ShardState.FAILED, reason, actor=actor,
                          reason=reason, progress=None):  # fmt: skip
                settled.append(shard_id)
                refresh_replica_state(replica_id, actor=actor)
    return settled


def refresh_replica_state(replica_id, *, actor: Actor) -> str | None:
    """Derive a replica's state from its shards: ready when every rank is, failed when one is."""
    replica = Replica.objects.filter(id=replica_id).first()
    if replica is None or replica.state in ReplicaState.ENDING:
        return None
    states = list(replica.shards.values_list("state", flat=True))
    if not states:
        return None
    # A replica already where its ranks put it is left be: no transition to try.
    if any(state == ShardState.FAILED for state in states):
        if replica.state == ReplicaState.FAILED:
            return None
        failed = replica.shards.filter(state=ShardState.FAILED).first()
        assert failed is not None  # one of the states just read
        reason = f"rank {failed.rank} failed: {failed.reason or 'no reason given'}"
        return transition(Replica, replica.id, ReplicaState.FAILED, reason, actor=actor,
                          reasons=[reason])  # fmt: skip
    if all(state == ShardState.READY for state in states):
        if replica.state == ReplicaState.READY:
            return None
        return transition(Replica, replica.id, ReplicaState.READY, "every rank is ready",
                          actor=actor, reasons=[])  # fmt: skip
    if replica.state == ReplicaState.READY:
        # The startup clock starts again: it measures this start, not the first one.
        return transition(Replica, replica.id, ReplicaState.STARTING, "a rank is not ready",
                          actor=actor, starting_since=timezone.now())  # fmt: skip
    return None
