"""Events written straight into the log for the audit tests, at chosen times."""

from __future__ import annotations

from datetime import datetime, timedelta

from audit.models import Event


def log_of(count: int, start: datetime, step: timedelta = timedelta(minutes=1), **fields):
    """``count`` Events, one every ``step`` from ``start`` (ids rise with time); returns
    them oldest first."""
    rows = Event.objects.bulk_create(
        Event(kind=fields.get("kind", "node"), subject=fields.get("subject", f"node{i:03}"),
              reason=f"event {i}", actor_name=fields.get("actor_name", ""))
        for i in range(count)
    )  # fmt: skip
    for i, row in enumerate(rows):
        row.at = start + i * step
    Event.objects.bulk_update(rows, ["at"])
    return rows
