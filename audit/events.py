"""Recording what happened: the one way a decision or an operator's change is written down.

Every verb records its Event inside its own transaction, and the pages hear of it once
that transaction commits (``audit.notices``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from django.contrib.auth.models import User

from audit import notices
from audit.actors import Actor, recorded_as
from audit.models import Event, EventKind


def record_event(
    kind: EventKind,
    subject: str,
    reason: str,
    from_state: str = "",
    to_state: str = "",
    *,
    actor: Actor,
) -> Event:
    """Record a decision or change, naming who acted (a part of llmgw names no one)."""
    user, name = recorded_as(actor)
    event = Event.objects.create(
        kind=kind,
        subject=subject,
        from_state=from_state,
        to_state=to_state,
        reason=reason,
        actor=cast("User | None", user),  # AUTH_USER_MODEL is Django's own User
        actor_name=name,
    )
    notices.pages_changed_on_commit(kind, subject)
    return event


def record_events(
    kind: EventKind, subjects: Sequence[str], reason: str, *, actor: Actor
) -> list[Event]:
    """Record one decision about many subjects (a pass telling fifty nodes their engines)
    in one INSERT, naming who acted, and tell pages in one message."""
    user, name = recorded_as(actor)
    events = Event.objects.bulk_create(
        Event(kind=kind, subject=subject, reason=reason, actor=cast("User | None", user),
              actor_name=name)
        for subject in subjects
    )  # fmt: skip
    notices.all_changed_on_commit(kind, subjects)
    return events


def record_news(kind: EventKind, subject: str, reason: str, *, actor: Actor) -> Event | None:
    """Record ``reason`` unless it is already the last thing said about ``subject``, so a
    condition that every pass finds again is said once, not every two seconds."""
    last = Event.objects.filter(subject=subject).order_by("-at", "-id").first()
    if last is not None and last.reason == reason:
        return None
    return record_event(kind, subject, reason, actor=actor)
