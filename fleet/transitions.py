"""The state machines of DESIGN.md, enforced in one place.

Every state change is a compare-and-swap: ``UPDATE … WHERE id = … AND state IN
(allowed sources)``, so two workers racing on one row cannot both win, and an
Event row records each transition that happened with its reason.
"""

from __future__ import annotations

from django.db import models, transaction
from django.utils import timezone

from audit import notices
from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind
from fleet.models import Node, NodeState, Replica, ReplicaState, Shard, ShardState

NODE_TRANSITIONS: dict[str, frozenset[str]] = {
    NodeState.CONNECTED: frozenset({NodeState.UNREACHABLE, NodeState.LOST}),
    NodeState.UNREACHABLE: frozenset({NodeState.CONNECTED, NodeState.LOST}),
    NodeState.LOST: frozenset({NodeState.CONNECTED}),
}

SHARD_TRANSITIONS: dict[str, frozenset[str]] = {
    ShardState.PENDING: frozenset(
        {ShardState.FETCHING, ShardState.STARTING, ShardState.READY, ShardState.FAILED,
         ShardState.STOPPED}
    ),
    ShardState.FETCHING: frozenset({ShardState.STARTING, ShardState.FAILED, ShardState.STOPPED}),
    ShardState.STARTING: frozenset({ShardState.READY, ShardState.FAILED, ShardState.STOPPED}),
    # An adopted engine is health-checked again after an agent restart.
    ShardState.READY: frozenset({ShardState.STARTING, ShardState.FAILED, ShardState.STOPPED}),
    ShardState.FAILED: frozenset(),
    ShardState.STOPPED: frozenset(),
}  # fmt: skip

REPLICA_TRANSITIONS: dict[str, frozenset[str]] = {
    ReplicaState.PLACING: frozenset(
        {ReplicaState.STARTING, ReplicaState.UNPLACEABLE, ReplicaState.STOPPING}
    ),
    ReplicaState.UNPLACEABLE: frozenset({ReplicaState.PLACING, ReplicaState.STOPPING}),
    ReplicaState.STARTING: frozenset(
        {ReplicaState.READY, ReplicaState.FAILED, ReplicaState.STOPPING}
    ),
    # A rank that restarts (an adopted engine re-checking) takes the replica back to starting.
    ReplicaState.READY: frozenset(
        {ReplicaState.STARTING, ReplicaState.FAILED, ReplicaState.STOPPING}
    ),
    ReplicaState.FAILED: frozenset({ReplicaState.STOPPING}),
    ReplicaState.STOPPING: frozenset({ReplicaState.STOPPED}),
    ReplicaState.STOPPED: frozenset(),
}

_MACHINES: dict[type[models.Model], tuple[EventKind, dict[str, frozenset[str]]]] = {
    Node: (EventKind.NODE, NODE_TRANSITIONS),
    Shard: (EventKind.SHARD, SHARD_TRANSITIONS),
    Replica: (EventKind.REPLICA, REPLICA_TRANSITIONS),
}


def allowed_sources(model: type[models.Model], target: str) -> frozenset[str]:
    """Every state from which ``target`` may be entered."""
    _kind, machine = _MACHINES[model]
    return frozenset(source for source, targets in machine.items() if target in targets)


def transition(
    model: type[models.Model], pk: object, target: str, why: str, *, actor: Actor,
    **fields: object,
) -> str | None:  # fmt: skip
    """Move row ``pk`` to ``target`` if its current state allows it; return the old state.

    ``why`` becomes the event's reason, ``actor`` who acted (the verb's own actor).
    Returns None when the row is gone or its state does not allow the move (someone else
    won the race, or it is not an edge).
    Extra ``fields`` are written in the same UPDATE, so they change only if the
    transition happens. A shard's download progress is cleared by every transition.
    """
    kind, _machine = _MACHINES[model]
    if model is Shard:
        # Progress describes the state it was sent in; the next one starts without it.
        fields.setdefault("progress", None)
    sources = allowed_sources(model, target)
    now = timezone.now()
    with transaction.atomic():
        # SELECT … FOR UPDATE then a guarded UPDATE: the guard alone decides who wins;
        # the lock only lets us name the state we came from in the event.
        current = (
            model._default_manager.select_for_update()
            .filter(pk=pk)
            .values_list("state", flat=True)
            .first()
        )
        if current is None or current not in sources:
            return None
        updated = model._default_manager.filter(pk=pk, state=current).update(
            state=target, state_changed_at=now, **fields
        )
        if not updated:
            return None
        # Open pages re-render what this touches, once the change is visible to them.
        record_event(kind, str(pk), why, from_state=current, to_state=target, actor=actor)
        if model is Replica and ReplicaState.READY in (current, target):
            # Routers reload within a second instead of at their next periodic refresh.
            notices.routers_reload_on_commit()
    return current
