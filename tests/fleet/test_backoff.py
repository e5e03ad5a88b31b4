"""A crash loop's replacement backoff says when the next try is due and why, and a new
spec (the profile's fingerprint) or a change of the node's engines starts it afresh.
Real PostgreSQL and Redis; time stands still where the test says so."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.actors import AGENT_LINK
from fleet import selectors
from fleet.actions.reports import register_node, update_engines
from fleet.models import Replica
from fleet.planning.backoff import replacement_backoff, replacement_backoffs, replacement_delay
from fleet.reconcile.passes import reconcile, retire_failed
from fleet.reconcile.report import ReconcileReport
from fleet.transitions import transition
from protocol import messages
from protocol.engines import EngineInstall
from tests.factories import SETUP, make_model, make_profile, make_replica, make_shard
from tests.fleet.inventories import inventory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
EXITED = "rank 0 failed: llama-server exited with code 0"


def link(node_id: str, *versions: str):
    engines = [EngineInstall(engine="llama.cpp", version=v, path=f"/e/{v}") for v in versions]
    register = messages.Register(inventory=inventory(node_id), engines_probed=True, engines=engines)
    return register_node(node_id, register, actor=AGENT_LINK)


def crash_loop(clock, profile, node, failures: int = 3, apart: int = 10) -> list[Replica]:
    """``failures`` replicas of ``profile`` that failed on ``node`` right after starting,
    ``apart`` seconds from each other; the clock ends at the last failure."""
    failed = []
    for _ in range(failures):
        replica = make_replica(profile, state="starting")
        make_shard(replica, node=node, state="failed", reason="llama-server exited with code 0")
        transition(Replica, replica.id, "failed", EXITED, reasons=[EXITED], actor=SETUP)
        failed.append(Replica.objects.get(id=replica.id))
        clock.shift(timedelta(seconds=apart))
    clock.shift(timedelta(seconds=-apart))
    return failed


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def test_status_and_the_model_page_say_when_the_next_try_is_due_and_why(clock, node_ids, reader):
    node = link(node_ids[0], "b6000")
    failed = crash_loop(clock, make_profile(), node)
    clock.shift(timedelta(seconds=5))
    expected = f"next try in 15 s: 3 failures in 30 min, last: {EXITED}"

    out = StringIO()
    call_command("llmgw_ctl", "status", stdout=out)
    assert expected in out.getvalue()
    call_command("llmgw_ctl", "status", "--json", stdout=(out := StringIO()))
    backoffs = {r["id"]: r["backoff"] for r in json.loads(out.getvalue())["replicas"]}
    assert backoffs[str(failed[-1].id)] == expected

    client = Client()
    client.force_login(reader)
    assert expected in client.get("/models/gemma/").content.decode()


def test_a_changed_profile_starts_the_backoff_afresh(clock, node_ids):
    node = link(node_ids[0], "b6000")
    profile = make_profile(replicas=3)  # no failed replica is a surplus to scale down
    last = crash_loop(clock, profile, node)[-1]
    clock.shift(timedelta(seconds=6))
    assert replacement_delay(last, NOW) == timedelta(seconds=20)

    profile.args = ["--threads", "1"]  # the fix: a new spec
    profile.save()

    assert replacement_delay(Replica.objects.get(id=last.id), NOW) == timedelta(seconds=5)
    reconcile()
    assert Replica.objects.get(id=last.id).state in ("stopping", "stopped")


def test_a_change_of_the_nodes_engines_starts_the_backoff_afresh(clock, node_ids):
    node = link(node_ids[0], "b6000", "b9999")
    other = link(node_ids[1], "b6000")
    profile = make_profile(replicas=4)  # no failed replica is a surplus to scale down
    crash_loop(clock, profile, other, failures=2)
    clock.shift(timedelta(seconds=10))
    last = crash_loop(clock, profile, node, failures=2)[-1]
    assert replacement_delay(last, NOW) == timedelta(seconds=40)

    clock.shift(timedelta(seconds=1))
    # The catalog dropped the build that exits at once: the node removed it.
    engines = [EngineInstall(engine="llama.cpp", version="b6000", path="/e/b6000")]
    update_engines(node.id, messages.Engines(engines=engines), actor=AGENT_LINK)

    # What failed on this node no longer counts; what failed elsewhere still does.
    assert replacement_delay(last, NOW) == timedelta(seconds=10)
    clock.shift(timedelta(seconds=10))
    reconcile()
    assert Replica.objects.get(id=last.id).state in ("stopping", "stopped")


def test_the_pass_reads_every_failed_replicas_backoff_in_the_same_queries_for_2_as_for_12(
    clock, node_ids
):
    node = link(node_ids[0], "b6000")
    loops = [
        crash_loop(clock, make_profile(make_model(f"model-{i}"), replicas=9), node, failures)
        for i, failures in enumerate((1, 3))
    ]

    def queries_of_retire_failed() -> int:
        with CaptureQueriesContext(connection) as queries:
            retire_failed(NOW, ReconcileReport())  # none is due yet: only reads
        return len(queries)

    few = queries_of_retire_failed()
    loops += [
        crash_loop(clock, make_profile(make_model(f"more-{i}"), replicas=9), node, 2)
        for i in range(5)
    ]
    assert queries_of_retire_failed() == few
    # Each profile's loop still counts its own failures only.
    last_of_each = [Replica.objects.get(id=loop[-1].id) for loop in loops]
    backoffs = replacement_backoffs(last_of_each, timezone.now())
    assert [backoffs[r.id].failures for r in last_of_each] == [1, 3, 2, 2, 2, 2, 2]
    assert all(backoffs[r.id] == replacement_backoff(r, timezone.now()) for r in last_of_each)


def test_the_pages_and_status_read_failed_replicas_backoffs_in_the_same_queries_for_2_as_for_7(
    clock, node_ids
):
    node = link(node_ids[0], "b6000")

    def queries_of(read) -> int:
        with CaptureQueriesContext(connection) as queries:
            read()
        return len(queries)

    reads = {
        "cluster page's models": lambda: selectors.model_rows(),
        "model page": lambda: selectors.model_detail("model-0"),
        "status": lambda: call_command("llmgw_ctl", "status", "--json", stdout=StringIO()),
    }
    for i in range(2):
        crash_loop(clock, make_profile(make_model(f"model-{i}"), replicas=9), node, 2)
    few = {name: queries_of(read) for name, read in reads.items()}
    for i in range(2, 7):
        crash_loop(clock, make_profile(make_model(f"model-{i}"), replicas=9), node, 2)
    assert {name: queries_of(read) for name, read in reads.items()} == few
    assert "2 failures in 30 min" in selectors.model_rows()[6]["replicas"][0]["backoff"]
