"""Verbs on the fleet's members (routers, control planes) and what nodes admit: keep what
the leader heard of them, and note which nodes were told the addresses their walls admit.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from audit.actors import Actor
from audit.events import record_events
from audit.models import EventKind
from fleet.members import Heard
from fleet.models import FleetMember, Node

# A member's row is written again only this often while nothing else about it changes:
# a pass every 2 s would otherwise write every router's row every pass.
SEEN_EVERY = 10.0
# Rows of members gone this long are deleted: nothing reads them any more.
FORGET_AFTER = 24 * 3600.0


def record_members(heard: Heard, now: datetime, *, actor: Actor) -> bool:
    """Keep what ``heard`` says of the routers and control planes; True when the members
    that engines admit changed (one joined, left, or moved). Observations, like
    heartbeats, recorded by ``actor`` without an Event each: the nodes told because of
    them record the change (``mark_callers_told``)."""
    del actor  # no Event of its own, see above
    changed = False
    with transaction.atomic():
        rows = {row.id: row for row in FleetMember.objects.select_for_update()}
        for member, addresses in heard.present.items():
            row = rows.get(member)
            role = member.split(":", 1)[0]
            if row is None:
                FleetMember.objects.create(id=member, role=role, addresses=addresses, seen_at=now)
                changed = True
            elif row.addresses != addresses or row.left_at is not None:
                FleetMember.objects.filter(id=member).update(addresses=addresses, seen_at=now,
                                                              left_at=None)  # fmt: skip
                changed = True
            elif (now - row.seen_at).total_seconds() >= SEEN_EVERY:
                FleetMember.objects.filter(id=member).update(seen_at=now)
        gone = [m for m in heard.left if m in rows and m not in heard.present]
        changed |= bool(
            FleetMember.objects.filter(id__in=gone, left_at__isnull=True).update(left_at=now)
        )
        forget = [m for m, row in rows.items()
                  if (now - row.seen_at).total_seconds() > FORGET_AFTER]  # fmt: skip
        FleetMember.objects.filter(id__in=forget).delete()
    return changed


def mark_callers_told(
    node_ids: list[str], callers: list[str], digest: str, now: datetime, *, actor: Actor
) -> None:
    """Note that ``node_ids`` were told their walls admit ``callers`` (``digest``) on
    engines' HTTP ports; those told a list they had not been told record it."""
    if not node_ids:
        return
    with transaction.atomic():
        told = Node.objects.filter(id__in=node_ids)
        news = list(told.exclude(callers_told=digest).values_list("id", flat=True))
        told.update(callers_told=digest, callers_told_at=now)
        admitted = ", ".join(callers) or "loopback only"
        record_events(EventKind.NODE, news, f"engine HTTP ports admit: {admitted}", actor=actor)
