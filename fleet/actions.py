"""Verbs an operator runs: drain a node, restart a replica, scale a profile, pause a rollout.

Each changes one thing, records an event naming who asked, and (through
``record_event`` / ``transition``) tells the open pages once the change commits.
The reconciler does the rest: it places nothing on a draining node, replaces a
stopping replica, and starts or stops replicas until a profile has as many as it wants.
"""

from __future__ import annotations

from django.db import transaction

from catalog.models import Model, Profile
from fleet.models import Node, Replica
from fleet.transitions import record_event


def _who(by) -> str:
    return getattr(by, "username", None) or "someone"


def drain_node(node_id: str, by=None) -> bool:
    """Place nothing more on ``node_id`` and move its replicas off; False if already draining."""
    with transaction.atomic():
        changed = Node.objects.filter(id=node_id, draining=False).update(draining=True)
        if changed:
            record_event("node", node_id, f"drained by {_who(by)}")
    return bool(changed)


def undrain_node(node_id: str, by=None) -> bool:
    """Let placement use ``node_id`` again; False if it was not draining."""
    with transaction.atomic():
        changed = Node.objects.filter(id=node_id, draining=True).update(draining=False)
        if changed:
            record_event("node", node_id, f"returned to service by {_who(by)}")
    return bool(changed)


def restart_replica(replica_id, by=None) -> bool:
    """Mark a replica for replacement: it stops, and the reconciler starts a fresh one.

    That is how a stale replica picks up its profile's new settings. False when the
    replica is gone or already stopping.
    """
    from fleet.reconciler import stop_replica

    with transaction.atomic():
        replica = Replica.objects.filter(id=replica_id).first()
        # Through the reconciler's verb, so the nodes are told to stop the engines.
        return replica is not None and stop_replica(replica, f"restart requested by {_who(by)}")


def scale_profile(profile_id: int, replicas: int, by=None) -> int | None:
    """Set how many replicas a profile wants; return the previous count (None: no profile).

    The catalog file still says what it said: the next ``apply`` of that file sets the
    count back, which is what an operator who keeps the catalog in git wants.
    """
    if replicas < 0:
        raise ValueError(f"a profile cannot want {replicas} replicas; use 0 or more")
    with transaction.atomic():
        profile = Profile.objects.select_for_update().select_related("model")
        profile = profile.filter(id=profile_id).first()
        if profile is None:
            return None
        previous = profile.replicas
        if previous != replicas:
            Profile.objects.filter(id=profile_id).update(replicas=replicas)
            record_event(
                "catalog",
                f"{profile.model.name}/{profile.name}",
                f"scaled from {previous} to {replicas} replicas by {_who(by)}",
            )
    return previous


def pause_rollout(model_name: str, by=None) -> bool:
    """Stop replacing ``model_name``'s stale replicas until resumed; False if already paused.

    A drain already begun still ends (that replica serves nothing any more); nothing new
    is started or drained. Held in the database, so applying the catalog never lifts it.
    """
    return _set_rollout_paused(model_name, True, f"rollout paused by {_who(by)}")


def resume_rollout(model_name: str, by=None) -> bool:
    """Let ``model_name``'s rolling restarts go on; False if they were not paused."""
    return _set_rollout_paused(model_name, False, f"rollout resumed by {_who(by)}")


def _set_rollout_paused(model_name: str, paused: bool, why: str) -> bool:
    with transaction.atomic():
        changed = Model.objects.filter(name=model_name, rollout_paused=not paused).update(
            rollout_paused=paused
        )
        if changed:
            record_event("catalog", model_name, why)
    return bool(changed)
