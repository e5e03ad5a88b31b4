"""The fleet's Event rows move to the audit log whole: ids, times, and "by NAME" read back
as the operator who acted."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("fleet", "0005_leaderepoch"), ("audit", None)]


@pytest.mark.django_db(transaction=True)
def test_fleet_events_move_to_the_audit_log_with_their_times_and_operators():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state([("fleet", "0005_leaderepoch")]).apps
    olga = User.objects.create(username="olga")
    OldEvent = old.get_model("fleet", "Event")
    drained = OldEvent.objects.create(kind="node", subject="node01", reason="drained by olga")
    lost = OldEvent.objects.create(
        kind="node", subject="node02", from_state="connected", to_state="lost",
        reason="silent for 60 s",
    )  # fmt: skip
    stranger = OldEvent.objects.create(kind="catalog", subject="m", reason="paused by nobody")
    long_ago = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    OldEvent.objects.filter(id=lost.id).update(at=long_ago)

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    from audit.models import Event

    moved = {event.id: event for event in Event.objects.all()}
    assert moved[drained.id].reason == "drained"
    assert moved[drained.id].actor_id == olga.id and moved[drained.id].actor_name == "olga"
    assert moved[lost.id].at == long_ago and moved[lost.id].to_state == "lost"
    assert moved[lost.id].actor is None and moved[lost.id].reason == "silent for 60 s"
    # Not an account: the words stay as they were.
    assert moved[stranger.id].reason == "paused by nobody" and not moved[stranger.id].actor_name
    # New rows continue after the moved ids.
    assert Event.objects.create(kind="node", subject="x").id > max(moved)
