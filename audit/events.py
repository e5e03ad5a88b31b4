"""Recording what happened: the one way a decision or an operator's change is written down.

Every verb records its Event inside its own transaction, and the pages hear of it once
that transaction commits (``audit.notices``).
"""

from __future__ import annotations

from audit import notices
from audit.models import Event


def record_event(
    kind: str,
    subject: str,
    reason: str,
    from_state: str = "",
    to_state: str = "",
    actor=None,
) -> Event:
    """Record a decision or change; ``actor`` is the user who asked (None: llmgw itself)."""
    event = Event.objects.create(
        kind=kind,
        subject=subject,
        from_state=from_state,
        to_state=to_state,
        reason=reason,
        actor=actor if getattr(actor, "pk", None) else None,
        actor_name=getattr(actor, "username", "") or "",
    )
    notices.pages_changed_on_commit(kind, subject)
    return event


def record_news(kind: str, subject: str, reason: str) -> Event | None:
    """Record ``reason`` unless it is already the last thing said about ``subject``, so a
    condition that every pass finds again is said once, not every two seconds."""
    last = Event.objects.filter(subject=subject).order_by("-at", "-id").first()
    if last is not None and last.reason == reason:
        return None
    return record_event(kind, subject, reason)
