"""Benchmark the audit page on a long log: how long a page takes to read, first or deep,
under each filter, for an operator and for a reader, and how fast an export streams.

Run: DATABASE_URL=postgresql://… REDIS_URL=redis://… .venv/bin/python -m bench.audit_log
         [--events 1000000]

It creates (once) and migrates a database ``llmgw_bench_audit`` on the DATABASE_URL
server, fills it with --events Events over a year (in one INSERT … SELECT: 200 accounts
acting on 2,000 nodes, 100 models and 5,000 keys, 40% by llmgw itself, ids rising with
time), ANALYZEs it, and measures in this process, through Django's test client:

- GET /audit/ with each filter (the newest page, one 90% of the way back, an actor, a
  kind, an object, a day a year ago, a combination that picks few rows), as an operator,
  and the newest page as a reader (their own events only): median of 5 after one warm-up;
- the JSON export of one kind (a seventh of the log), rows a second, read to the end.

The figures are printed, never judged: compare runs made the same way on the same machine.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

from bench.database import bench_django
from bench.report import median_seconds

BENCH_DATABASE = "llmgw_bench_audit"

SEED = """
INSERT INTO audit_event (at, kind, subject, from_state, to_state, reason, actor_name)
SELECT now() - interval '365 days' + (i * (interval '365 days' / %(count)s)),
       (ARRAY['node','replica','shard','catalog','placement','key','sign-in','role'])[1 + i %% 8],
       CASE i %% 8
           WHEN 3 THEN 'model/m' || (i %% 100)
           WHEN 5 THEN 'sk-' || lpad((i %% 5000)::text, 6, '0')
           WHEN 6 THEN 'user' || lpad((i %% 200)::text, 3, '0')
           WHEN 7 THEN 'user' || lpad((i %% 200)::text, 3, '0')
           ELSE 'node' || lpad((i %% 2000)::text, 5, '0') END,
       '', '', 'event ' || i,
       CASE WHEN i %% 5 < 2 THEN '' ELSE 'user' || lpad((i %% 197)::text, 3, '0') END
FROM generate_series(1, %(count)s) AS i
"""


def seed(count: int) -> None:
    from django.db import connection

    from audit.models import Event

    Event.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(SEED, {"count": count})
        cursor.execute("ANALYZE audit_event")


def timed_get(client, path: str) -> tuple[float, int]:
    """Median seconds of 5 GETs after one warm-up, and how many rows the page shows."""

    def get():
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code)
        return response

    seconds, response = median_seconds(get)
    return seconds, response.content.decode().count('class="event"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    with bench_django(BENCH_DATABASE):
        measure(args)


def measure(args: argparse.Namespace) -> None:
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.utils import timezone

    from audit.export import json_chunks
    from audit.models import Event
    from catalog.permissions import OPERATORS_GROUP

    setup_test_environment()
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    began = time.perf_counter()
    seed(args.events)
    print(f"seeded {args.events} events in {time.perf_counter() - began:.1f} s", flush=True)
    operator, _ = User.objects.get_or_create(username="bench-operator")
    operator.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    reader, _ = User.objects.get_or_create(username="user007")
    Event.objects.filter(actor_name="user007").update(actor=reader)
    deep = Event.objects.order_by("id").values_list("id", flat=True)[args.events // 10]
    a_year_ago = (timezone.now() - timedelta(days=360)).date()
    day = f"since={a_year_ago}&until={a_year_ago + timedelta(days=1)}"
    as_operator, as_reader = Client(), Client()
    as_operator.force_login(operator)
    as_reader.force_login(reader)

    for who, client, query in [
        ("operator", as_operator, ""),
        ("operator", as_operator, f"before={deep}"),
        ("operator", as_operator, "actor=user042"),
        ("operator", as_operator, "kind=role"),
        ("operator", as_operator, "object=node00042"),
        ("operator", as_operator, "object=model%2F"),
        ("operator", as_operator, day),
        ("operator", as_operator, "actor=user042&kind=key&since=30d"),
        ("reader", as_reader, ""),
    ]:
        seconds, rows = timed_get(client, f"/audit/?{query}" if query else "/audit/")
        print(f"{who:<8} /audit/?{query:<40} {seconds * 1000:8.1f} ms median of 5, {rows} rows")

    began = time.perf_counter()
    written = sum(len(chunk) for chunk in json_chunks(Event.objects.filter(kind="key")))
    seconds = time.perf_counter() - began
    exported = Event.objects.filter(kind="key").count()
    print(
        f"JSON export of kind=key: {exported} events, {written / 2**20:.1f} MiB in {seconds:.1f} s "
        f"({exported / seconds:,.0f} events/s)"
    )


if __name__ == "__main__":
    main()
