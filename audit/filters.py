"""Which Events a reader asks for: by actor, kind, object and time, a page at a time.

Read from a query string (``?actor=olga&kind=key&object=node07&since=1d``) or from
``llmgw_ctl events``' flags, so the page, its socket, its exports and the command line
ask the database the same thing. What a query string gets wrong is never an error on
the page: it is set aside, said in ``notes``, and the log shows as if it had not been
asked; the command line refuses it instead (``EventFilter.refusals``).

Paging is by keyset, never by offset: a page is the ``PER_PAGE`` events just older (or
newer) than an event the reader was shown, read newest first along an index on
``(at, id)`` (with the kind or actor in front when one is asked), so the ten-thousandth
page costs what the first does. Nothing here counts the whole log.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import Q, QuerySet

from audit.models import Event, EventKind

PER_PAGE = 50
# The export reads the log in batches of this many rows along the same index: memory
# stays flat however many rows match, and no query holds a cursor open between batches.
EXPORT_BATCH = 1000
TEXT_MAX = 150  # an actor's name (Django's username) or an object's start
# "1h", "7d", "30m": that long before now. A bare number is refused, not read as seconds:
# "2026" is a year to a person.
_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_when(text: str, now: datetime) -> datetime:
    """A moment from ``1h`` / ``7d`` (that long before ``now``), an ISO date or time
    (``2026-12-06``, ``2026-12-06T10:30``, with or without an offset; none means UTC)."""
    text = text.strip()
    ago = _AGO.match(text)
    if ago:
        return now - timedelta(seconds=float(ago.group(1)) * _UNITS[ago.group(2).lower()])
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text[:40]!r} is not a time; write 2026-12-06, 2026-12-06T10:30 (UTC) or 1h, 7d"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class EventFilter:
    """What the log is narrowed to, and where in it a page starts."""

    actor: str = ""  # who acted: a username; "llmgw" for what llmgw did by itself
    kind: str = ""  # one of EventKind
    object: str = ""  # the subject, or how it starts ("node07", "model/", a key's prefix)
    since: datetime | None = None  # at or after
    until: datetime | None = None  # before
    # A team's name: read by the rule the app that owns teams plugs in (see
    # ``fleet.audit_log.reading.events_of_team``); audit knows no teams.
    team: str = ""
    before: int = 0  # the page holds the events just older than this event (by id)
    after: int = 0  # ...or just newer than this one
    # The text the reader typed for since/until, shown back in the form as typed.
    since_text: str = ""
    until_text: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_query(cls, query: Mapping[str, str], now: datetime) -> EventFilter:
        """Read a query string (a QueryDict, or options); anything not understood is noted
        and left out."""
        notes: list[str] = []
        kind = _text(query.get("kind") or "", 16)
        if kind and kind not in EventKind.values:
            notes.append(f"{kind!r} is not a kind of event (choose {', '.join(EventKind.values)})")
            kind = ""
        moments: dict[str, datetime | None] = {}
        for name in ("since", "until"):
            text = _text(query.get(name) or "", 40)
            try:
                moments[name] = parse_when(text, now) if text else None
            except ValueError as exc:
                notes.append(f"{name}: {exc}")
                moments[name] = None
        cursors = {}
        for name in ("before", "after"):
            text = (query.get(name) or "").strip()
            cursors[name] = int(text) if text.isdigit() else 0
            if text and not text.isdigit():
                notes.append(f"{name} {text[:20]!r} is not an event's number; showing the newest")
        return cls(
            actor=_text(query.get("actor") or "", TEXT_MAX),
            kind=kind,
            object=_text(query.get("object") or "", TEXT_MAX),
            since=moments["since"],
            until=moments["until"],
            team=_text(query.get("team") or "", TEXT_MAX),
            before=cursors["before"],
            after=0 if cursors["before"] else cursors["after"],
            since_text=_text(query.get("since") or "", 40) if moments["since"] else "",
            until_text=_text(query.get("until") or "", 40) if moments["until"] else "",
            notes=tuple(notes),
        )

    @property
    def narrowed(self) -> bool:
        return bool(self.actor or self.kind or self.object or self.since or self.until or self.team)

    def where(self) -> Q:
        """The filter as a database condition (Q() when nothing is asked); the team is not
        in it: that rule belongs to the app that owns teams."""
        where = Q()
        if self.actor:
            # The log keeps the name beside the account, so a deleted account's acts stay
            # findable; what llmgw did by itself names no one.
            where &= Q(actor_name="" if self.actor == "llmgw" else self.actor)
        if self.kind:
            where &= Q(kind=self.kind)
        if self.object:
            where &= Q(subject__startswith=self.object)
        if self.since:
            where &= Q(at__gte=self.since)
        if self.until:
            where &= Q(at__lt=self.until)
        return where

    def query(self, **changes) -> str:
        """This filter as a query string (empty fields left out), with changes."""
        chosen = replace(self, **changes)
        pairs = [
            ("actor", chosen.actor),
            ("kind", chosen.kind),
            ("object", chosen.object),
            ("since", chosen.since_text or _iso(chosen.since)),
            ("until", chosen.until_text or _iso(chosen.until)),
            ("team", chosen.team),
            ("before", str(chosen.before or "")),
            ("after", str(chosen.after or "")),
        ]
        return urlencode([(name, value) for name, value in pairs if value])


def own_events(user: AbstractBaseUser) -> Q:
    """The events a signed-in user without the operator role may read: what they did, and
    what was done to their account (its sign-ins, failed ones, its roles)."""
    return Q(actor=user) | Q(subject=user.get_username(), kind__in=ACCOUNT_KINDS)


ACCOUNT_KINDS = (EventKind.SIGN_IN, EventKind.ROLE)


@dataclass(frozen=True)
class EventPage:
    """One page of the log: its events, newest first, and where the pages beside it start
    (0 when there are none that way)."""

    events: list[Event]
    older: int  # the ``before`` of the next page back in time
    newer: int  # the ``after`` of the page nearer now; 0 on the newest page


def page_of(events: QuerySet[Event], asked: EventFilter, per_page: int = PER_PAGE) -> EventPage:
    """The page ``asked`` points at (``before``, ``after``, or the newest) of ``events``
    already narrowed to what the reader may see and asked for."""
    if asked.after:
        mark = _mark(asked.after)
        rows = list(
            events.filter(_newer_than(mark)).order_by("at", "id")[: per_page + 1]
            if mark
            else events.none()
        )
        if len(rows) <= per_page:  # the newest events are within a page: show the newest
            return page_of(events, replace(asked, after=0), per_page)
        rows = rows[:per_page][::-1]
        return EventPage(rows, rows[-1].id, rows[0].id)
    start = events
    if asked.before:
        mark = _mark(asked.before)
        start = events.filter(_older_than(mark)) if mark else events.none()
    rows = list(start.order_by("-at", "-id")[: per_page + 1])
    older = rows[per_page - 1].id if len(rows) > per_page else 0
    rows = rows[:per_page]
    newer = rows[0].id if asked.before and rows else 0
    return EventPage(rows, older, newer)


def batches(events: QuerySet[Any], size: int = EXPORT_BATCH, limit: int = 0) -> Iterator[list[Any]]:
    """Every event of ``events`` (the newest ``limit`` if not 0), newest first, in lists of
    ``size``: each a query of its own along the index, starting where the last ended.
    ``events`` may be a ``values()`` query (rows as dicts, with ``at`` and ``id``)."""
    mark: tuple[datetime, int] | None = None
    left = limit or None
    while left is None or left > 0:
        batch = events.filter(_older_than(mark)) if mark else events
        wanted = size if left is None else min(size, left)
        rows = list(batch.order_by("-at", "-id")[:wanted])
        if rows:
            yield rows
        if len(rows) < wanted:
            return
        left = None if left is None else left - len(rows)
        last = rows[-1]
        mark = (last["at"], last["id"]) if isinstance(last, dict) else (last.at, last.id)


def _mark(event_id: int) -> tuple[datetime, int] | None:
    at = Event.objects.filter(id=event_id).values_list("at", flat=True).first()
    return (at, event_id) if at is not None else None


def _older_than(mark: tuple[datetime, int]) -> Q:
    # ``at <= x`` is what the index can seek to; the OR then drops the mark's own equals.
    at, event_id = mark
    return Q(at__lte=at) & (Q(at__lt=at) | Q(id__lt=event_id))


def _newer_than(mark: tuple[datetime, int]) -> Q:
    at, event_id = mark
    return Q(at__gte=at) & (Q(at__gt=at) | Q(id__gt=event_id))


def _text(value: str, limit: int) -> str:
    """A name as typed, less control characters (PostgreSQL refuses NUL)."""
    return "".join(char for char in value if char.isprintable()).strip()[:limit]


def _iso(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment else ""
