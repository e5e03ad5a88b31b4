"""The log as a file: CSV or JSON, every event a filter picks, newest first, streamed.

Rows are read in batches along the log's index (``audit.filters.batches``) and written
as they come, so an export of a million events holds a thousand in memory, and the
first bytes leave before the last row is read. The page serves them through an
asynchronous iterator (``streamed``): under ASGI, Django reads a synchronous one whole
before sending a byte.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Iterable, Iterator

from asgiref.sync import sync_to_async
from django.db.models import QuerySet

from audit.filters import batches
from audit.models import Event

COLUMNS = ("id", "at", "kind", "actor", "object", "from_state", "to_state", "reason")
# A cell a spreadsheet would run as a formula (a failed sign-in's username is anyone's
# text): such cells are written with a leading apostrophe, as OWASP advises.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def as_record(event: Event) -> dict[str, object]:
    """An event as an export writes it; ``actor`` is empty for what llmgw did by itself."""
    return {
        "id": event.id,
        "at": event.at.isoformat(),
        "kind": event.kind,
        "actor": event.actor_name,
        "object": event.subject,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "reason": event.reason,
    }


def csv_chunks(events: QuerySet[Event], limit: int = 0) -> Iterator[str]:
    """The header, then one chunk of lines per batch of events (the newest ``limit``)."""
    yield _csv_lines([COLUMNS])
    for batch in batches(events, limit=limit):
        yield _csv_lines(
            [_cell(record[name]) for name in COLUMNS] for record in map(as_record, batch)
        )


def json_chunks(events: QuerySet[Event], limit: int = 0) -> Iterator[str]:
    """One JSON array of records, in one chunk per batch of events (the newest ``limit``)."""
    yield "["
    separator = "\n"
    for batch in batches(events, limit=limit):
        yield separator + ",\n".join(json.dumps(as_record(event)) for event in batch)
        separator = ",\n"
    yield "\n]\n"


async def streamed(chunks: Iterator[str]) -> AsyncIterator[str]:
    """``chunks`` read one at a time in Django's thread (each batch is a query)."""

    def read() -> str | None:
        return next(chunks, None)

    while (chunk := await sync_to_async(read, thread_sensitive=True)()) is not None:
        yield chunk


def _csv_lines(rows: Iterable[Iterable[object]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    return buffer.getvalue()


def _cell(value: object) -> object:
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value
