"""Verbs on nodes: drain one (place nothing more there, move its replicas off) and undrain.

The agent is told too, so it refuses a shard that a stale pass still sends it.
"""

from __future__ import annotations

import logging

from django.db import transaction

from audit.events import record_event
from audit.models import EventKind
from fleet import commands
from fleet.models import Node

log = logging.getLogger("llmgw.fleet.actions")


def drain_node(node_id: str, *, actor=None) -> bool:
    """Place nothing more on ``node_id`` and move its replicas off; False if already draining."""
    return _set_draining(node_id, True, "drained", actor)


def undrain_node(node_id: str, *, actor=None) -> bool:
    """Let placement use ``node_id`` again; False if it was not draining."""
    return _set_draining(node_id, False, "returned to service", actor)


def _set_draining(node_id: str, draining: bool, reason: str, actor) -> bool:
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
