"""Verbs that change the fleet's state from what agents report.

Consumers and tasks call these; they never save a state field themselves. State
moves through ``fleet.transitions`` (compare-and-swap, with an event).
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from fleet import notify
from fleet.models import Node, NodeState, Shard, ShardState
from fleet.transitions import record_event, transition
from protocol import messages

log = logging.getLogger("llmgw.fleet")


def register_node(node_id: str, message: messages.Register, now: datetime | None = None) -> Node:
    """Create or refresh a node from its register message and mark it connected."""
    now = now or timezone.now()
    inventory = message.inventory.model_dump(mode="json")
    engines = (
        {name: install.model_dump(mode="json") for name, install in message.engines.items()}
        if message.engines_probed
        else None
    )
    with transaction.atomic():
        node, created = Node.objects.select_for_update().get_or_create(
            id=node_id,
            defaults={"state": NodeState.CONNECTED, "state_changed_at": now},
        )
        before = _qualifications(node)
        node.address = message.inventory.address
        node.agent_version = message.agent_version
        node.inventory = inventory
        node.engines = engines
        node.weights = [weight.model_dump(mode="json") for weight in message.weights]
        node.registered_at = now
        node.last_heartbeat = now
        node.save(
            update_fields=[
                "address", "agent_version", "inventory", "engines", "weights", "registered_at",
                "last_heartbeat",
            ]
        )  # fmt: skip
        if created:
            record_event("node", node_id, f"registered from {node.address}", to_state="connected")
        elif node.state != NodeState.CONNECTED:
            transition(Node, node_id, NodeState.CONNECTED, f"registered from {node.address}")
        if not created:
            _log_new_qualifications(node, before)
        for problem in message.problems:
            record_event("node", node_id, f"agent reports: {problem}")
    node.refresh_from_db()
    return node


def _qualifications(node: Node) -> dict[str, object]:
    inventory = node.inventory or {}
    return {
        "memory": inventory.get("memory_total", 0),
        "gpus": len(inventory.get("gpus", [])),
        "engines": set(node.engines or {}),
    }


def _log_new_qualifications(node: Node, before: dict[str, object]) -> None:
    """Say when a node gains what could make it a candidate: that answers "why now?"."""
    after = _qualifications(node)
    gained = []
    if after["memory"] > before["memory"] and before["memory"]:  # type: ignore[operator]
        gained.append(f"RAM grew to {after['memory']} bytes")
    if after["gpus"] > before["gpus"]:  # type: ignore[operator]
        gained.append(f"{after['gpus']} GPUs")
    new_engines = after["engines"] - before["engines"]  # type: ignore[operator]
    if new_engines:
        gained.append("engine " + ", ".join(sorted(new_engines)))
    if gained:
        reason = f"node {node.id} now qualifies for more: {'; '.join(gained)}"
        log.info(reason)
        record_event("node", node.id, reason)


def update_engines(node_id: str, message: messages.Engines) -> None:
    engines = {name: install.model_dump(mode="json") for name, install in message.engines.items()}
    node = Node.objects.filter(id=node_id).first()
    if node is None:
        return
    before = _qualifications(node)
    node.engines = engines if message.probed else None
    node.save(update_fields=["engines"])
    _log_new_qualifications(node, before)


def update_weights(node_id: str, message: messages.Weights) -> None:
    if not message.listed:
        return
    Node.objects.filter(id=node_id).update(
        weights=[weight.model_dump(mode="json") for weight in message.weights]
    )


def record_shard_status(node_id: str, message: messages.ShardStatus) -> bool:
    """Apply a shard's transition as its node reports it; False if refused or unknown."""
    shard = Shard.objects.filter(id=message.shard_id).only("node_id", "state").first()
    if shard is None:
        log.info("node %s reports unknown shard %s (%s)", node_id, message.shard_id, message.state)
        return False
    if shard.node_id != node_id:
        log.warning(
            "node %s reports shard %s, which belongs to %s; ignored",
            node_id, message.shard_id, shard.node_id,
        )  # fmt: skip
        return False
    if shard.state == message.state:
        return False
    reason = message.reason or f"node {node_id} reports {message.state}"
    fields: dict[str, object] = {"progress": None, "reason": message.reason}
    if message.pid is not None:
        fields["pid"] = message.pid
    if message.output_tail:
        fields["output_tail"] = message.output_tail
    changed = transition(Shard, message.shard_id, message.state, reason, **fields) is not None
    if changed:
        refresh_replica_state(Shard.objects.get(id=message.shard_id).replica_id)
    return changed


def record_shard_progress(node_id: str, message: messages.ShardProgress) -> None:
    """Progress is not a transition: it never resets the startup timer."""
    progress = {"bytes": message.bytes, "total": message.total, "rate": message.rate}
    updated = Shard.objects.filter(
        id=message.shard_id,
        node_id=node_id,
        state__in=[ShardState.PENDING, ShardState.FETCHING, ShardState.STARTING],
    ).update(progress=progress)
    if updated:
        notify.fleet_changed_on_commit("shard", message.shard_id)


def adopt_reported_shards(node_id: str, message: messages.Register) -> list[str]:
    """Rebuild replicas and shards from what the agent says it runs.

    The control plane keeps no belief about processes that agents cannot confirm: a
    restarted control plane learns its replicas from here. The fingerprint is the one
    the agent reports — empty reads as unknown, never as matching.
    """
    from catalog.models import Profile
    from fleet.models import Replica, ReplicaState

    rebuilt = []
    for running in message.shards:
        spec = running.spec
        with transaction.atomic():
            profile = Profile.objects.filter(model__name=spec.model, name=spec.profile).first()
            replica, created = Replica.objects.get_or_create(
                id=spec.replica_id,
                defaults={
                    "model_name": spec.model,
                    "profile_name": spec.profile,
                    "profile": profile,
                    "fingerprint": spec.fingerprint,
                    "secret": spec.api_key,
                    "state": ReplicaState.STARTING,
                    "starting_since": timezone.now(),
                },
            )
            if created:
                rebuilt.append(str(replica.id))
                record_event(
                    "replica", str(replica.id),
                    f"rebuilt from node {node_id}'s report of shard {spec.shard_id}",
                    to_state=ReplicaState.STARTING,
                )  # fmt: skip
            shard, shard_created = Shard.objects.get_or_create(
                id=spec.shard_id,
                defaults={
                    "replica": replica,
                    "rank": spec.rank,
                    "node_id": node_id,
                    "gpus": spec.gpus,
                    "port": spec.port,
                    "state": running.state,
                    "pid": running.pid,
                },
            )
            if not shard_created and shard.state != running.state:
                transition(
                    Shard, shard.id, running.state, f"node {node_id} reports {running.state}",
                    pid=running.pid,
                )  # fmt: skip
        refresh_replica_state(replica.id)
    return rebuilt


def forget_unreported_shards(node_id: str, message: messages.Register) -> list[str]:
    """Fail shards the control plane placed on this node that its agent no longer runs.

    Only shards the agent had already reported on (fetching, starting, ready): a pending
    one may still be on its way in the node's queue, and its startup timeout covers it.
    """
    reported = {running.spec.shard_id for running in message.shards}
    gone = Shard.objects.filter(
        node_id=node_id,
        state__in=[ShardState.FETCHING, ShardState.STARTING, ShardState.READY],
    ).exclude(id__in=reported)
    failed = []
    for shard_id, replica_id in gone.values_list("id", "replica_id"):
        reason = f"node {node_id} registered without it (its agent or engine restarted)"
        if transition(Shard, shard_id, ShardState.FAILED, reason, reason=reason, progress=None):
            failed.append(shard_id)
            refresh_replica_state(replica_id)
    return failed


def refresh_replica_state(replica_id) -> str | None:
    """Derive a replica's state from its shards: ready when every rank is, failed when one is."""
    from fleet.models import Replica, ReplicaState

    replica = Replica.objects.filter(id=replica_id).first()
    if replica is None or replica.state in (ReplicaState.STOPPING, ReplicaState.STOPPED):
        return None
    states = list(replica.shards.values_list("state", flat=True))
    if not states:
        return None
    if any(state == ShardState.FAILED for state in states):
        failed = replica.shards.filter(state=ShardState.FAILED).first()
        reason = f"rank {failed.rank} failed: {failed.reason or 'no reason given'}"
        return transition(Replica, replica.id, ReplicaState.FAILED, reason, reasons=[reason])
    if all(state == ShardState.READY for state in states):
        return transition(Replica, replica.id, ReplicaState.READY, "every rank is ready",
                          reasons=[])  # fmt: skip
    if replica.state == ReplicaState.READY:
        return transition(Replica, replica.id, ReplicaState.STARTING, "a rank is not ready")
    return None
