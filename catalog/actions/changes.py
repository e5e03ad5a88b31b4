"""What every catalog verb does once it changed what routers serve: record it, tell them."""

from __future__ import annotations

from audit import notices
from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind


def catalog_changed(subject: str, reason: str, *, actor: Actor) -> None:
    """Record a catalog change and tell routers: names, aliases and wanted counts change
    what they serve, and they should learn it now, not at their next refresh."""
    record_event(EventKind.CATALOG, subject, reason, actor=actor)
    notices.routers_reload_on_commit("catalog")
