"""Verbs for what agents report: a node links, a shard moves on, engines and weights change.

The agent link (``fleet.link.consumer``) calls these with ``AGENT_LINK`` as the actor, the
reconciler with its own; they never save a state field anywhere else. State moves
through ``fleet.transitions`` (compare-and-swap, with an event).
"""

from __future__ import annotations

import hmac
import logging
import uuid
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from audit import notices
from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind
from fleet.models import (
    Node,
    NodeState,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
    known_memory,
    ram_gained,
    replica_secret,
    unexpected_gpu_user_warning,
)  # fmt: skip
from fleet.transitions import transition
from protocol import messages
from protocol.engines import EngineInstall

log = logging.getLogger("llmgw.fleet")


def link_node(node_id: str, message: messages.Register, *, actor: Actor) -> dict[str, str]:
    """Link a node by its register: refresh its row, settle its shards; return the answer.

    One transaction, so a register that fails part way leaves the node as it was rather
    than refreshed with its shards unsettled; and one call, so the consumer hops to the
    database thread once per register.
    """
    with transaction.atomic():
        node = register_node(node_id, message, actor=actor)
        rebuilt = adopt_reported_shards(node_id, message, actor=actor)
        settled = forget_unreported_shards(node_id, message, actor=actor)
    log.info(
        "node %s linked, reporting %d shard(s): %d replica(s) rebuilt, %d shard(s) settled",
        node_id, len(message.shards), len(rebuilt), len(settled),
    )  # fmt: skip
    return {"type": "linked", "node": node.id}


def register_node(
    node_id: str, message: messages.Register, now: datetime | None = None, *, actor: Actor
) -> Node:
    """Create or refresh a node from its register message and mark it connected."""
    now = now or timezone.now()
    inventory = message.inventory.model_dump(mode="json")
    engines = _engines_json(message.engines) if message.engines_probed else None
    # No savepoint inside link_node's transaction: a failure there undoes the whole register.
    with transaction.atomic(savepoint=False):
        node, created = Node.objects.select_for_update().get_or_create(
            id=node_id,
            defaults={"state": NodeState.CONNECTED, "state_changed_at": now},
        )
        before = _qualifications(node)
        node.address = message.inventory.address
        node.agent_version = message.agent_version
        node.inventory = inventory
        node.take_engines(engines, now)
        node.weights = [weight.model_dump(mode="json") for weight in message.weights]
        known_users = {user.get("pid") for user in node.unexpected_gpu_users}
        node.unexpected_gpu_users = [
            u.model_dump(mode="json") for u in message.unexpected_gpu_users
        ]
        node.registered_at = now
        node.last_heartbeat = now
        node.save(
            update_fields=[
                "address", "agent_version", "inventory", "engines", "engines_changed_at", "weights",
                "unexpected_gpu_users", "registered_at", "last_heartbeat",
            ]
        )  # fmt: skip
        registered = f"registered from {node.address}"
        # Read back only what a transition writes, and only when one was tried.
        moving = not created and node.state != NodeState.CONNECTED
        if created:
            record_event(EventKind.NODE, node_id, registered, to_state="connected", actor=actor)
        elif moving:
            transition(Node, node_id, NodeState.CONNECTED, registered, actor=actor)
        if not created:
            _log_new_qualifications(node, before, actor)
        for problem in message.problems:
            record_event(EventKind.NODE, node_id, f"agent reports: {problem}", actor=actor)
        for user in node.unexpected_gpu_users:
            if user["pid"] not in known_users:
                warning = unexpected_gpu_user_warning(user)
                record_event(EventKind.NODE, node_id, warning, actor=actor)
    if moving:
        node.refresh_from_db(fields=["state", "state_changed_at"])
    return node


def _qualifications(node: Node) -> dict[str, object]:
    facts, usage = node.inventory_facts(), node.latest_usage()
    return {
        # A heartbeat re-reads it (a resized VM), so the larger of the two is the latest.
        "memory": known_memory(
            facts.memory_total if facts else 0, usage.memory_total if usage else 0
        ),
        "gpus": len(facts.gpus) if facts else 0,
        "engines": set(node.installed_engines()),
    }


def _log_new_qualifications(node: Node, before: dict[str, object], actor: Actor) -> None:
    """Say when a node gains what could make it a candidate: that answers "why now?"."""
    after = _qualifications(node)
    gained = ram_gained(before["memory"], after["memory"])  # type: ignore[arg-type]
    if after["gpus"] > before["gpus"]:  # type: ignore[operator]
        gained.append(f"{after['gpus']} GPUs")
    new_engines = after["engines"] - before["engines"]  # type: ignore[operator]
    if new_engines:
        gained.append("engine " + ", ".join(sorted(new_engines)))
    record_qualifications_gained(node.id, gained, actor=actor)


def record_qualifications_gained(node_id: str, gained: list[str], *, actor: Actor) -> None:
    """Record what a node gained that could make it a candidate, if anything."""
    if gained:
        reason = f"node {node_id} now qualifies for more: {'; '.join(gained)}"
        log.info(reason)
        record_event(EventKind.NODE, node_id, reason, actor=actor)


def update_engines(node_id: str, message: messages.Engines, *, actor: Actor) -> None:
    """Take the node's engine list: what is installed, and how each install is going."""
    node = Node.objects.filter(id=node_id).first()
    if node is None:
        return
    before, before_installs = _qualifications(node), node.engine_installs() or []
    node.take_engines(_engines_json(message.engines) if message.probed else None, timezone.now())
    node.save(update_fields=["engines", "engines_changed_at"])
    _log_new_qualifications(node, before, actor)
    _record_install_outcomes(node_id, before_installs, node.engine_installs() or [], actor)
    notices.pages_changed_on_commit(EventKind.NODE, node_id)


def _record_install_outcomes(
    node_id: str, before: list[EngineInstall], after: list[EngineInstall], actor: Actor
) -> None:
    """An Event when an engine version ends an install (installed, or failed and why);
    progress on the way is status, not history."""
    said = {(install.engine, install.version): install.words for install in before}
    for install in after:
        key = (install.engine, install.version)
        if install.status in ("installed", "failed") and said.get(key) != install.words:
            outcome = f"{install.engine} {install.version} {install.words}"
            record_event(EventKind.NODE, node_id, outcome, actor=actor)


def _engines_json(installs: list[EngineInstall]) -> list[dict]:
    return [install.model_dump(mode="json") for install in installs]


def update_weights(node_id: str, message: messages.Weights, *, actor: Actor) -> None:
    """Take the list of weights the node holds."""
    if not message.listed:
        return
    Node.objects.filter(id=node_id).update(
        weights=[weight.model_dump(mode="json") for weight in message.weights]
    )
    notices.pages_changed_on_commit(EventKind.NODE, node_id)  # the mirror pages show holders


def record_refused_command(node_id: str, message: messages.CommandRefused, *, actor: Actor) -> None:
    """The node dropped commands it could not trust: someone put them on its queue. An
    agent tells a flood as one count a minute, so it is one Event a minute at most."""
    if message.count == 1:
        reason = f"agent refused a command {message.task}: {message.reason}"
    else:
        reason = (f"agent refused {message.count} commands in the last minute; the last, "
                  f"{message.task}: {message.reason}")  # fmt: skip
    log.warning("node %s: %s", node_id, reason)
    record_event(EventKind.NODE, node_id, reason, actor=actor)


def record_shard_status(node_id: str, message: messages.ShardStatus, *, actor: Actor) -> bool:
    """Apply a shard's transition as its node reports it; False if refused, stale or unknown."""
    shard = Shard.objects.filter(id=message.shard_id).only("node_id", "state", "status_seq").first()
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
        fields["output_tail"] = message.output_tail
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
    """Progress is not a transition: it never resets the startup timer.

    Taken only while the shard fetches: one read after the shard moved on (sent before a
    link drop, say) would show a finished download beside a loading engine until ready.
    """
    progress = {"bytes": message.bytes, "total": message.total, "rate": message.rate}
    updated = Shard.objects.filter(
        id=message.shard_id,
        node_id=node_id,
        state=ShardState.FETCHING,
    ).update(progress=progress)
    if updated:
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
