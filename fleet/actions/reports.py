"""Verbs for what agents report of their node: it links (its register), its engines and
weights change, it refused a command. What they report of shards is ``shard_reports``.

The agent link (``fleet.link.consumer``) calls these with ``AGENT_LINK`` as the actor, the
reconciler with its own; they never save a state field anywhere else. State moves
through ``fleet.transitions`` (compare-and-swap, with an event).
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from audit import notices
from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind
from fleet.actions.shard_reports import adopt_reported_shards, forget_unreported_shards
from fleet.models import (
    Node,
    NodeState,
    known_memory,
    ram_gained,
    unexpected_gpu_user_warning,
)  # fmt: skip
from fleet.transitions import transition
from protocol import messages
from protocol.engines import EngineInstall

log = logging.getLogger("llmgw.fleet")


def link_node(
    node_id: str, message: messages.Register, *, actor: Actor, key_generation: str = ""
) -> dict[str, str]:
    """Link a node by its register: refresh its row, settle its shards; return the answer.

    ``key_generation`` is what the link proved (the certificate's serial, or ``token…``):
    commands to the node are signed with the key derived from it from now on.

    One transaction, so a register that fails part way leaves the node as it was rather
    than refreshed with its shards unsettled; and one call, so the consumer hops to the
    database thread once per register.
    """
    with transaction.atomic():
        node = register_node(node_id, message, actor=actor, key_generation=key_generation)
        rebuilt = adopt_reported_shards(node_id, message, actor=actor)
        settled = forget_unreported_shards(node_id, message, actor=actor)
    log.info(
        "node %s linked, reporting %d shard(s): %d replica(s) rebuilt, %d shard(s) settled",
        node_id, len(message.shards), len(rebuilt), len(settled),
    )  # fmt: skip
    return {"type": "linked", "node": node.id}


def register_node(
    node_id: str,
    message: messages.Register,
    now: datetime | None = None,
    *,
    actor: Actor,
    key_generation: str = "",
) -> Node:
    """Create or refresh a node from its register message and mark it connected."""
    now = now or timezone.now()
    inventory = message.inventory.model_dump(mode="json")
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
        if message.engines_probed:
            # An agent that has not yet probed (it has just started) says nothing of its
            # engines: taken as "none", the node would lose SGLang for the seconds until the
            # probe, and gain it again with a "now qualifies" Event and every crash-loop
            # backoff on it forgiven (``engines_changed_at``).
            node.take_engines(_engines_json(message.engines), now)
        node.weights = [weight.model_dump(mode="json") for weight in message.weights]
        known_users = {user.get("pid") for user in node.unexpected_gpu_users}
        node.unexpected_gpu_users = [
            u.model_dump(mode="json") for u in message.unexpected_gpu_users
        ]
        node.registered_at = now
        node.last_heartbeat = now
        node.key_generation = key_generation
        node.save(
            update_fields=[
                "address", "agent_version", "inventory", "engines", "engines_changed_at", "weights",
                "unexpected_gpu_users", "registered_at", "last_heartbeat", "key_generation",
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
    if not message.probed:
        return  # says nothing of what is installed (see register_node)
    before, before_installs = _qualifications(node), node.engine_installs() or []
    node.take_engines(_engines_json(message.engines), timezone.now())
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
    """Take the list of weights the node holds, and record what it gained or no longer has."""
    if not message.listed:
        return
    weights = [weight.model_dump(mode="json") for weight in message.weights]
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(id=node_id).only("weights").first()
        if node is None:
            return
        Node.objects.filter(id=node_id).update(weights=weights)
        change = _weights_change(node.weights or [], weights)
        if change:
            record_event(EventKind.NODE, node_id, change, actor=actor)
    notices.pages_changed_on_commit(EventKind.NODE, node_id)  # the mirror pages show holders


def _weights_change(before: list[dict], after: list[dict]) -> str:
    """What a new list of weights says that the last did not, in an Event's words."""
    held, holds = {w["source"] for w in before}, {w["source"] for w in after}
    said = [
        f"{verb} {', '.join(sorted(sources)[:3])}{' and more' if len(sources) > 3 else ''}"
        for verb, sources in (("holds", holds - held), ("no longer holds", held - holds))
        if sources
    ]
    return "; ".join(said)


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
