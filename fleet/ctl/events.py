"""``llmgw_ctl events``: the audit log at the shell, filtered as the audit page filters it.

The shell's user holds the database already, so it reads every Event
(``fleet.audit_log.reading``). ``--json`` writes the records the page's JSON export
writes, streamed a batch at a time.
"""

from __future__ import annotations

from django.core.management.base import CommandError
from django.utils import timezone

from audit.export import json_chunks, records
from audit.filters import EventFilter
from audit.models import Event, EventKind
from core.tables import render_table
from fleet.audit_log.reading import EventFilterRefused, asked_events

LIMIT_DEFAULT = 100


def add_parsers(subparsers) -> None:
    events = subparsers.add_parser(
        "events", help="the audit log: who did what, filtered by actor, kind, object and time"
    )
    events.add_argument(
        "--since", default="", help="at or after: 1h, 7d, or 2026-12-06T10:30 (UTC)"
    )
    events.add_argument("--until", default="", help="before: as --since")
    events.add_argument(
        "--actor", default="", help="who acted: a username, or llmgw for llmgw itself"
    )
    events.add_argument("--kind", default="", choices=["", *EventKind.values], metavar="KIND",
                        help=f"one of {', '.join(EventKind.values)}")  # fmt: skip
    events.add_argument(
        "--object", default="", help="the subject, or how it starts (node07, model/)"
    )
    events.add_argument("--team", default="", help="one team's events")
    events.add_argument("--limit", type=int, default=LIMIT_DEFAULT,
                        help=f"the newest this many ({LIMIT_DEFAULT}); 0 for all")  # fmt: skip
    events.add_argument("--json", action="store_true", help="a JSON array, as the page exports")
    events.set_defaults(handler=events_command)


def events_command(options, out) -> None:
    asked = EventFilter.from_query(
        {name: options[name] for name in ("since", "until", "actor", "kind", "object", "team")},
        timezone.now(),
    )
    if asked.notes:
        raise CommandError("; ".join(asked.notes))
    if options["limit"] < 0:
        raise CommandError("--limit: give a number of events, or 0 for all")
    try:
        events = asked_events(Event.objects.all(), asked)
    except EventFilterRefused as exc:
        raise CommandError(str(exc)) from None
    if options["json"]:
        for chunk in json_chunks(events, limit=options["limit"]):
            out.write(chunk, ending="")
        return
    rows = [_row(record) for batch in records(events, options["limit"]) for record in batch]
    if not rows:
        out.write("no events" + (" match this filter" if asked.narrowed else " yet"))
        return
    out.write(render_table(["AT", "KIND", "ACTOR", "OBJECT", "CHANGE", "REASON"], rows))
    if options["limit"] and len(rows) == options["limit"]:
        out.write(f"(the newest {len(rows)}; --limit 0 for all, --json for a file)")


def _row(record: dict) -> list[str]:
    change = (
        f"{record['from_state'] or '·'} -> {record['to_state'] or '·'}"
        if record["from_state"] or record["to_state"]
        else ""
    )
    return [
        str(record["at"])[:19].replace("T", " "),
        str(record["kind"]),
        str(record["actor"] or "llmgw"),
        str(record["object"]),
        change,
        str(record["reason"]),
    ]
