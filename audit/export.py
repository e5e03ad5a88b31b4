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
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import QuerySet

from audit.filters import batches
from audit.models import Event

COLUMNS = ("id", "at", "kind", "actor", "object", "from_state", "to_state", "reason")
# A cell a spreadsheet would run as a formula (a failed sign-in's username is anyone's
# text): such cells are written with a leading apostrophe, as OWASP advises.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


# What an export reads of each Event: plain rows (``values()``), not model instances,
# which cost a third of an export's time to build.
FIELDS = ("id", "at", "kind", "actor_name", "subject", "from_state", "to_state", "reason")


def as_record(row: dict[str, Any]) -> dict[str, object]:
    """An event (a row of ``FIELDS``) as an export writes it; ``actor`` is empty for what
    llmgw did by itself."""
    return {
        "id": row["id"],
        "at": row["at"].isoformat(),
        "kind": row["kind"],
        "actor": row["actor_name"],
        "object": row["subject"],
        "from_state": row["from_state"],
        "to_state": row["to_state"],
        "reason": row["reason"],
    }


def records(events: QuerySet[Event], limit: int = 0) -> Iterator[list[dict[str, object]]]:
    """The records of ``events``, newest first (the newest ``limit``), a batch at a time."""
    for batch in batches(events.values(*FIELDS), limit=limit):
        yield [as_record(row) for row in batch]


def csv_chunks(events: QuerySet[Event], limit: int = 0) -> Iterator[str]:
    """The header, then one chunk of lines per batch of events (the newest ``limit``)."""
    yield _csv_lines([COLUMNS])
    for batch in records(events, limit):
        yield _csv_lines([_cell(record[name]) for name in COLUMNS] for record in batch)


def json_chunks(events: QuerySet[Event], limit: int = 0) -> Iterator[str]:
    """One JSON array of records, in one chunk per batch of events (the newest ``limit``)."""
    yield "["
    separator = "\n"
    for batch in records(events, limit):
        yield separator + ",\n".join(json.dumps(record) for record in batch)
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
