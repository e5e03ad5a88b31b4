"""The log as CSV and JSON (``audit.export``): every event a filter picks, a batch at a
time, in cells a spreadsheet will not run."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync

from audit.export import COLUMNS, csv_chunks, json_chunks, streamed
from audit.models import Event
from tests.audit.events_made import log_of

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_csv_holds_a_header_and_every_event_newest_first():
    made = log_of(1205, NOW - timedelta(days=1), timedelta(seconds=1), actor_name="olga")
    chunks = list(csv_chunks(Event.objects.all()))
    assert len(chunks) == 1 + 2  # the header, then one chunk per batch of 1000
    rows = list(csv.DictReader(io.StringIO("".join(chunks))))
    assert tuple(rows[0]) == COLUMNS
    assert [int(row["id"]) for row in rows] == [row.id for row in reversed(made)]
    first = rows[0]
    assert (first["kind"], first["actor"], first["object"]) == ("node", "olga", "node1204")
    assert datetime.fromisoformat(first["at"]) == made[-1].at


def test_json_is_one_array_of_records_and_the_newest_few_on_asking():
    made = log_of(3, NOW, kind="key", subject="sk-abc")
    records = json.loads("".join(json_chunks(Event.objects.all())))
    assert [r["id"] for r in records] == [row.id for row in reversed(made)]
    assert set(records[0]) == set(COLUMNS)
    assert records[0]["actor"] == ""  # llmgw by itself
    newest = json.loads("".join(json_chunks(Event.objects.all(), limit=2)))
    assert [r["id"] for r in newest] == [made[2].id, made[1].id]
    assert json.loads("".join(json_chunks(Event.objects.none()))) == []


def test_a_cell_a_spreadsheet_would_run_is_written_as_text():
    """A failed sign-in's username is anyone's text: =HYPERLINK(…) must stay words."""
    log_of(1, NOW, kind="sign-in", subject='=HYPERLINK("http://evil")')
    (row,) = csv.DictReader(io.StringIO("".join(csv_chunks(Event.objects.all()))))
    assert row["object"] == '\'=HYPERLINK("http://evil")'
    # JSON is data, not a sheet: kept as it was.
    (record,) = json.loads("".join(json_chunks(Event.objects.all())))
    assert record["object"] == '=HYPERLINK("http://evil")'


def test_the_stream_hands_over_the_chunks_one_at_a_time():
    log_of(2, NOW)

    async def read() -> list[str]:
        return [chunk async for chunk in streamed(json_chunks(Event.objects.all()))]

    chunks = async_to_sync(read)()
    assert chunks[0] == "[" and chunks[-1] == "\n]\n" and len(chunks) == 3
