"""What every ``llmgw_ctl`` command of the fleet shares: the refusals (a node or a model that
does not exist is refused in one wording, naming what does: ``core.humanize.no_such``) and
how long ago something happened."""

from __future__ import annotations

from datetime import datetime

from django.core.management.base import CommandError
from django.utils import timezone

from catalog.models import Model
from core.humanize import format_seconds, no_such
from fleet.models import Node


def known_node(node_id: str) -> str:
    """``node_id`` if the control plane knows that node; else CommandError listing those
    it knows."""
    if not Node.objects.filter(id=node_id).exists():
        raise CommandError(
            no_such("node", node_id, list(Node.objects.values_list("id", flat=True)))
        )
    return node_id


def known_model(name: str) -> str:
    """``name`` if the catalog has that model; else CommandError listing those it has."""
    if not Model.objects.filter(name=name).exists():
        models = list(Model.objects.order_by("name").values_list("name", flat=True))
        raise CommandError(no_such("model", name, models))
    return name


def ago(moment: datetime | None) -> str:
    """``moment`` as how long ago it was, in words ("3s ago"), or "never"."""
    if moment is None:
        return "never"
    return f"{format_seconds((timezone.now() - moment).total_seconds())} ago"
