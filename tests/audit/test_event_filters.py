"""The audit log's filters and keyset paging (``audit.filters``): what a query string
asks, what the database answers, and pages that neither skip nor repeat an event."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.http import QueryDict

from audit.filters import EventFilter, batches, own_events, page_of, parse_when
from audit.models import Event, EventKind
from tests.audit.events_made import log_of
from tests.factories import make_user

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def asked(query: str) -> EventFilter:
    return EventFilter.from_query(QueryDict(query), NOW)


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("1h", NOW - timedelta(hours=1)),
        ("7d", NOW - timedelta(days=7)),
        ("90m", NOW - timedelta(minutes=90)),
        ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01T10:30", datetime(2026, 12, 1, 10, 30, tzinfo=UTC)),
        ("2026-12-01T10:30+02:00", datetime(2026, 12, 1, 8, 30, tzinfo=UTC)),
    ],
    ids=["hours-ago", "days-ago", "minutes-ago", "a-date", "a-time-is-utc", "an-offset"],
)
def test_a_moment_is_a_time_ago_or_an_iso_time_in_utc(text, moment):
    assert parse_when(text, NOW) == moment


@pytest.mark.parametrize("text", ["2026", "yesterday", "1 week"])
def test_what_is_not_a_moment_is_refused_in_words(text):
    with pytest.raises(ValueError, match="is not a time; write 2026-12-06"):
        parse_when(text, NOW)


def test_what_a_query_gets_wrong_is_noted_and_left_out():
    wrong = asked("kind=nodes&since=soon&before=x&actor=olga")
    assert (wrong.kind, wrong.since, wrong.before, wrong.actor) == ("", None, 0, "olga")
    assert len(wrong.notes) == 3
    assert "'nodes' is not a kind of event" in wrong.notes[0]
    assert wrong.notes[1].startswith("since: 'soon' is not a time")


def test_a_filter_writes_back_the_query_it_read():
    read = asked("actor=olga&kind=key&object=sk-&since=1d&until=2026-12-06&before=7")
    assert read.query() == "actor=olga&kind=key&object=sk-&since=1d&until=2026-12-06&before=7"
    assert read.query(before=0, after=9) == (
        "actor=olga&kind=key&object=sk-&since=1d&until=2026-12-06&after=9"
    )


@pytest.mark.django_db
def test_each_filter_narrows_the_log():
    start = NOW - timedelta(hours=3)
    log_of(3, start, timedelta(hours=1), kind="node", subject="node07", actor_name="olga")
    log_of(2, start, timedelta(hours=1), kind="key", subject="sk-abc", actor_name="")
    log_of(1, start, kind="catalog", subject="model/gemma", actor_name="sam")

    def reasons(query: str) -> list[tuple[str, str]]:
        rows = Event.objects.filter(asked(query).where()).order_by("id")
        return [(row.kind, row.subject) for row in rows]

    assert reasons("actor=olga") == [("node", "node07")] * 3
    assert reasons("actor=llmgw") == [("key", "sk-abc")] * 2  # what llmgw did by itself
    assert reasons("kind=catalog") == [("catalog", "model/gemma")]
    assert reasons("object=model/") == [("catalog", "model/gemma")]  # a subject's start
    assert reasons("object=node07") == [("node", "node07")] * 3
    # since is at or after, until is before: 09:00, 10:00, 11:00 -> two since 10:00.
    assert len(reasons("kind=node&since=2h")) == 2
    assert len(reasons("kind=node&until=2026-12-06T10:00")) == 1
    assert reasons("actor=olga&kind=key") == []


@pytest.mark.django_db
@pytest.mark.parametrize("step", [timedelta(seconds=7), timedelta(0)], ids=["apart", "all-tied"])
def test_pages_back_and_forth_hold_every_event_once_in_order(step):
    """Keyset paging by (at, id): events at the same instant are neither lost nor repeated."""
    made = log_of(23, NOW - timedelta(hours=1), step)
    newest_first = [row.id for row in sorted(made, key=lambda r: (r.at, r.id), reverse=True)]
    events = Event.objects.all()

    pages, page = [], page_of(events, asked(""), per_page=5)
    pages.append([e.id for e in page.events])
    while page.older:
        page = page_of(events, asked(f"before={page.older}"), per_page=5)
        pages.append([e.id for e in page.events])
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [i for p in pages for i in p] == newest_first

    back = []
    while page.newer:
        page = page_of(events, asked(f"after={page.newer}"), per_page=5)
        back.append([e.id for e in page.events])
    assert back == pages[-2::-1]  # the same pages, nearer now each time, to the newest


@pytest.mark.django_db
def test_a_page_costs_its_rows_along_an_index_however_long_the_log(django_assert_max_num_queries):
    made = log_of(300, NOW - timedelta(days=1), kind="key", subject="sk-abc")
    events = Event.objects.filter(asked("kind=key").where())
    deep = made[40].id
    with django_assert_max_num_queries(2):  # the mark's time, then the page
        page = page_of(events, asked(f"kind=key&before={deep}"), per_page=10)
    assert [e.id for e in page.events] == [row.id for row in made[39:29:-1]]
    # The page's query can seek along (kind, at, id) rather than sort the table (on a few
    # hundred rows the planner may rightly read them all: only whether it can is asked).
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
    plan = events.filter(at__lte=made[40].at).order_by("-at", "-id")[:11].explain()
    assert "Index Scan Backward using audit_event_kind_at_id" in plan, plan


@pytest.mark.django_db
def test_batches_read_every_event_newest_first_or_the_newest_few():
    made = log_of(25, NOW - timedelta(hours=1), timedelta(0))  # all at one instant
    newest_first = [row.id for row in reversed(made)]
    assert [[e.id for e in b] for b in batches(Event.objects.all(), size=10)] == [
        newest_first[:10], newest_first[10:20], newest_first[20:],
    ]  # fmt: skip
    assert [e.id for b in batches(Event.objects.all(), size=10, limit=12) for e in b] == (
        newest_first[:12]
    )


@pytest.mark.django_db
def test_a_reader_without_the_operator_role_reads_their_own_events():
    rita = make_user("rita")
    Event.objects.all().delete()  # the account's own making aside
    log_of(1, NOW, kind=EventKind.KEY, subject="sk-rita")
    Event.objects.filter(subject="sk-rita").update(actor=rita, actor_name="rita")
    log_of(1, NOW, kind=EventKind.SIGN_IN, subject="rita")  # done to her account
    log_of(1, NOW, kind=EventKind.NODE, subject="rita")  # a node of her name: not hers
    log_of(1, NOW, kind=EventKind.KEY, subject="sk-olga", actor_name="olga")

    hers = Event.objects.filter(own_events(rita)).order_by("subject", "kind")
    assert [(e.kind, e.subject) for e in hers] == [("sign-in", "rita"), ("key", "sk-rita")]
