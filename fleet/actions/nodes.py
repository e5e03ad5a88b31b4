"""Verbs on nodes: drain one (place nothing more there, move its replicas off), undrain it,
put it in a pool, and note what it was last told to have.

The agent is told of a drain too, so it refuses a shard that a stale pass still sends it.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from audit.actors import Actor
from audit.events import record_event, record_events
from audit.models import EventKind
from catalog.models import Pool
from core.humanize import no_such
from fleet import commands
from fleet.models import Node
from protocol.engines import WantedEngine

log = logging.getLogger("llmgw.fleet.actions")


class NodeRefused(Exception):
    """A node verb that cannot be done as asked; ``str()`` names the thing and the fix."""


def drain_node(node_id: str, *, actor: Actor) -> bool:
    """Place nothing more on ``node_id`` and move its replicas off; False if already draining."""
    return _set_draining(node_id, True, "drained", actor)


def undrain_node(node_id: str, *, actor: Actor) -> bool:
    """Let placement use ``node_id`` again; False if it was not draining."""
    return _set_draining(node_id, False, "returned to service", actor)


def _set_draining(node_id: str, draining: bool, reason: str, actor: Actor) -> bool:
    with transaction.atomic():
        changed = Node.objects.filter(id=node_id, draining=not draining).update(draining=draining)
        if changed:
            record_event(EventKind.NODE, node_id, reason, actor=actor)
            transaction.on_commit(lambda: _tell_agent(node_id, draining))
    return bool(changed)


def _tell_agent(node_id: str, draining: bool) -> None:
    # After the commit: the drain stands even if the broker is away; the node is told
    # again whenever it links.
    try:
        commands.send_drain(node_id, draining)
    except Exception as exc:
        log.warning("could not tell node %s to %s: %s", node_id,
                    "drain" if draining else "undrain", exc)  # fmt: skip


def set_node_pool(node_id: str, pool: str, *, actor: Actor) -> bool:
    """Put ``node_id`` in the catalog's pool ``pool`` ("": in no pool); False if it was.

    A profile that names a pool places only on its nodes, from the next reconcile pass;
    replicas already running stay where they are.
    """
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(id=node_id).first()
        if node is None:
            raise NodeRefused(
                no_such("node", node_id, list(Node.objects.values_list("id", flat=True)))
            )
        if pool and not Pool.objects.filter(name=pool).exists():
            pools = list(Pool.objects.order_by("name").values_list("name", flat=True))
            raise NodeRefused(
                f"{no_such('pool', pool, pools)}; apply a catalog that declares it first"
            )
        if node.pool == pool:
            return False
        was = f"pool {node.pool}" if node.pool else "no pool"
        Node.objects.filter(id=node_id).update(pool=pool)
        now = f"put in pool {pool}" if pool else "taken out of every pool"
        record_event(EventKind.NODE, node_id, f"{now} (was in {was})", actor=actor)
    return True


def mark_engines_told(
    node_ids: list[str], engines: list[WantedEngine], digest: str, now: datetime, *,
    actor: Actor,
) -> None:  # fmt: skip
    """Note that ``node_ids`` were sent the engine list ``engines`` (``digest``) at ``now``,
    so each is told again only when that list changes, the node links again, or the list
    is due anew.

    The nodes told a list they had not been told record it; a list told again (every ten
    minutes, or at a new link) records nothing. A read, one UPDATE and one INSERT for
    all of them, however many.
    """
    if not node_ids:
        return
    with transaction.atomic():
        told = Node.objects.filter(id__in=node_ids)
        news = list(told.exclude(engines_told=digest).values_list("id", flat=True))
        told.update(engines_told=digest, engines_told_at=now)
        wanted = ", ".join(f"{engine.name} {engine.version}" for engine in engines) or "none"
        record_events(EventKind.NODE, news, f"told to have engines: {wanted}", actor=actor)
