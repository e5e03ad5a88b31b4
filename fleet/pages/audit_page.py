"""The audit page: the Event log, filtered by actor, kind, object and time, a page at a
time, live on its newest page.

Its key (what the view and the page's socket both render from) is the reader's account
id and the page's query string, ``"7?kind=key&since=1d"``: which Events a page shows
depends on who reads (``fleet.audit_log.reading``), and a push is rendered for the
socket's own user, never from anything the browser sends.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import QueryDict
from django.urls import reverse
from django.utils import timezone

from audit.filters import EventFilter, page_of
from audit.models import Event, EventKind
from catalog.permissions import is_operator
from fleet.audit_log.reading import EventFilterRefused, asked_events, readable_events

EVENT_KINDS = frozenset(EventKind.values)


def audit_key(user, query: str) -> str:
    return f"{user.pk}?{query}"


def filter_of(key: str) -> EventFilter:
    return EventFilter.from_query(QueryDict(key.partition("?")[2]), timezone.now())


def _read(key: str) -> tuple[Any, EventFilter, QuerySet[Event], list[str]] | None:
    """The key's reader, what it asks, the Events that answers (paging aside) and what
    could not be asked; None when the reader's account is gone."""
    viewer, _, query = key.partition("?")
    user = get_user_model()._default_manager.filter(pk=int(viewer or 0)).first()
    if user is None or not user.is_active:
        return None
    asked = EventFilter.from_query(QueryDict(query), timezone.now())
    notes = list(asked.notes)
    try:
        events = asked_events(readable_events(user), asked)
    except EventFilterRefused as exc:
        notes.append(f"{exc}; showing every team's")
        asked = replace(asked, team="")
        events = asked_events(readable_events(user), asked)
    return user, asked, events, notes


def audit_outline(key: str) -> int | None:
    """What decides the newest page: the newest Event its reader may read that its filter
    picks (one row along the index), so a change the reader may not see pushes nothing."""
    read = _read(key)
    if read is None:
        return None
    return read[2].order_by("-at", "-id").values_list("id", flat=True).first()


def audit_context(key: str, fragments: Iterable[str]) -> dict[str, Any] | None:
    """The page of Events the key's query asks for, as its reader may read them; None
    when the reader's account is gone."""
    read = _read(key)
    if read is None:
        return None
    user, asked, events, notes = read
    page = page_of(events, asked)
    here = reverse("audit")

    def href(**cursor) -> str:
        query = asked.query(**{"before": 0, "after": 0, **cursor})
        return f"{here}?{query}" if query else here

    exports = asked.query(before=0, after=0)
    return {
        # For the page's socket: the rows shown (none is ever pushed alone) and the outline
        # they were drawn from.
        "shown": frozenset(),
        "outline": page.events[0].id
        if page.events and not asked.before and not asked.after
        else None,
        "asked": asked,
        "notes": notes,
        "events": page.events,
        "kinds": EventKind.values,
        "reads_everything": is_operator(user),
        "newest_href": href() if asked.before or asked.after else "",
        "newer_href": href(after=page.newer) if page.newer else "",
        "older_href": href(before=page.older) if page.older else "",
        "clear_href": here,
        "csv_href": f"{reverse('audit-csv')}?{exports}",
        "json_href": f"{reverse('audit-json')}?{exports}",
    }


def may_show(key: str, kind: str) -> bool:
    """Whether a new Event of ``kind`` may show on the key's page: on its newest page, if
    of a kind it asks for. An older page holds still while the reader reads it."""
    if kind not in EVENT_KINDS:
        return False
    asked = filter_of(key)
    return not (asked.before or asked.after or (asked.kind and asked.kind != kind))
