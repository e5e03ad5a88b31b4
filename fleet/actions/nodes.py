"""Verbs on nodes: drain one (place nothing more there, move its replicas off) and undrain."""

from __future__ import annotations

from django.db import transaction

from audit.events import record_event
from audit.models import EventKind
from fleet.models import Node


def drain_node(node_id: str, *, actor=None) -> bool:
    """Place nothing more on ``node_id`` and move its replicas off; False if already draining."""
    with transaction.atomic():
        changed = Node.objects.filter(id=node_id, draining=False).update(draining=True)
        if changed:
            record_event(EventKind.NODE, node_id, "drained", actor=actor)
    return bool(changed)


def undrain_node(node_id: str, *, actor=None) -> bool:
    """Let placement use ``node_id`` again; False if it was not draining."""
    with transaction.atomic():
        changed = Node.objects.filter(id=node_id, draining=True).update(draining=False)
        if changed:
            record_event(EventKind.NODE, node_id, "returned to service", actor=actor)
    return bool(changed)
