"""Node liveness: connected → unreachable (15 s) → lost (60 s), one pass with an injected clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from audit.models import Event
from fleet.link.liveness import check_liveness
from fleet.models import Node, NodeState
from tests.factories import make_node

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
CONNECTED, UNREACHABLE, LOST = NodeState.CONNECTED, NodeState.UNREACHABLE, NodeState.LOST


def node_silent_for(node_id: str, seconds: float | None, state: str = CONNECTED) -> Node:
    """A node last heard from ``seconds`` before NOW (None: never heard from at all)."""
    heard = None if seconds is None else NOW - timedelta(seconds=seconds)
    return make_node(node_id, state=state, registered_at=heard, last_heartbeat=heard)


def state_of(node_id: str) -> str:
    return Node.objects.get(id=node_id).state


def events_for(node_id: str) -> list[tuple[str, str, str]]:
    return list(
        Event.objects.filter(kind="node", subject=node_id)
        .order_by("id")
        .values_list("from_state", "to_state", "reason")
    )


# (state before, seconds of silence, state after, reason recorded or None)
ONE_NODE = [
    pytest.param(CONNECTED, 2, CONNECTED, None, id="heard-2s-ago-stays-connected"),
    pytest.param(CONNECTED, 14, CONNECTED, None, id="silent-14s-stays-connected"),
    pytest.param(CONNECTED, 15, CONNECTED, None, id="silent-exactly-15s-stays-connected"),
    pytest.param(CONNECTED, 16, UNREACHABLE, "no heartbeat for 16s", id="silent-16s-unreachable"),
    pytest.param(CONNECTED, 45, UNREACHABLE, "no heartbeat for 45s", id="silent-45s-unreachable"),
    pytest.param(CONNECTED, 60, UNREACHABLE, "no heartbeat for 60s",
                 id="silent-exactly-60s-only-unreachable"),
    pytest.param(CONNECTED, 61, LOST, "no heartbeat for 61s", id="connected-silent-61s-lost"),
    pytest.param(UNREACHABLE, 30, UNREACHABLE, None, id="unreachable-30s-stays-unreachable"),
    pytest.param(UNREACHABLE, 75, LOST, "no heartbeat for 75s", id="unreachable-75s-lost"),
    pytest.param(UNREACHABLE, 3, UNREACHABLE, None,
                 id="unreachable-heard-3s-ago-is-revived-by-heartbeats-not-by-liveness"),
    pytest.param(LOST, 600, LOST, None, id="lost-is-not-touched-again"),
    pytest.param(CONNECTED, None, CONNECTED, None, id="never-heard-from-is-left-alone"),
]  # fmt: skip


@pytest.mark.parametrize(("before", "silence", "after", "reason"), ONE_NODE)
def test_one_node_moves_along_by_its_silence(before, silence, after, reason):
    node_silent_for("node01", silence, state=before)

    report = check_liveness(now=NOW)

    assert state_of("node01") == after
    assert report.held_back is False
    assert report.unreachable == (["node01"] if after == UNREACHABLE != before else [])
    assert report.lost == (["node01"] if after == LOST != before else [])
    assert events_for("node01") == ([(before, after, reason)] if reason else [])


def test_a_node_walks_from_connected_to_unreachable_to_lost_as_time_passes():
    node_silent_for("node01", 0)
    steps = [(10, CONNECTED), (16, UNREACHABLE), (40, UNREACHABLE), (61, LOST), (3600, LOST)]
    for seconds, expected in steps:
        check_liveness(now=NOW + timedelta(seconds=seconds))
        assert state_of("node01") == expected, f"after {seconds}s"
    assert events_for("node01") == [
        (CONNECTED, UNREACHABLE, "no heartbeat for 16s"),
        (UNREACHABLE, LOST, "no heartbeat for 61s"),
    ]


def test_a_heartbeat_resets_the_clock():
    node = node_silent_for("node01", 14)
    Node.objects.filter(id=node.id).update(last_heartbeat=NOW)
    check_liveness(now=NOW + timedelta(seconds=10))
    assert state_of("node01") == CONNECTED


def test_a_heartbeat_batch_written_during_the_pass_wins(monkeypatch):
    # The batcher's UPDATE lands after the pass listed the silent nodes but before it marks
    # them: the node just spoke, so it must stay connected rather than be declared lost.
    node_silent_for("node01", 90)
    listed = Node.silence

    def silence_then_heartbeat(node, now):
        silence = listed(node, now)
        Node.objects.filter(id=node.id).update(last_heartbeat=NOW)
        return silence

    monkeypatch.setattr(Node, "silence", silence_then_heartbeat)
    report = check_liveness(now=NOW)
    assert (report.unreachable, report.lost, state_of("node01")) == ([], [], CONNECTED)
    assert events_for("node01") == []


def test_the_registration_counts_as_hearing_from_a_node_before_its_first_heartbeat():
    make_node("node01", registered_at=NOW - timedelta(seconds=20), last_heartbeat=None)
    check_liveness(now=NOW)
    assert events_for("node01") == [(CONNECTED, UNREACHABLE, "no heartbeat for 20s")]


def test_a_second_pass_changes_nothing_more():
    node_silent_for("node01", 20)
    node_silent_for("node02", 90)
    for node_id in ("node03", "node04", "node05"):
        node_silent_for(node_id, 1)
    check_liveness(now=NOW)
    report = check_liveness(now=NOW)
    assert (report.unreachable, report.lost) == ([], [])
    assert Event.objects.count() == 2


# Fleets as {node: seconds silent}; what is expected of one pass over them.
FLEETS = [
    pytest.param({"a": 20, "b": 2, "c": 3}, False, {"a": UNREACHABLE}, id="1-of-3-silent-marked"),
    pytest.param({"a": 90, "b": 2, "c": 3}, False, {"a": LOST}, id="1-of-3-lost-marked"),
    pytest.param({"a": 20, "b": 90, "c": 3}, True, {}, id="2-of-3-silent-none-marked"),
    pytest.param({"a": 90, "b": 90, "c": 90}, True, {}, id="whole-fleet-silent-none-marked"),
    pytest.param({"a": 20, "b": 25, "c": 3, "d": 4}, False, {"a": UNREACHABLE, "b": UNREACHABLE},
                 id="half-of-4-silent-still-marked"),
    pytest.param({"a": 20, "b": 25, "c": 70, "d": 4}, True, {}, id="3-of-4-silent-none-marked"),
    pytest.param({"a": 90, "b": 90}, False, {"a": LOST, "b": LOST},
                 id="fleet-of-2-is-too-small-to-hold-back"),
    pytest.param({"a": 20, "b": 20, "c": 1, "d": 1, "e": 1}, False,
                 {"a": UNREACHABLE, "b": UNREACHABLE}, id="2-of-5-silent-marked"),
    pytest.param({"a": 20, "b": 20, "c": 20, "d": 1, "e": 1}, True, {},
                 id="3-of-5-silent-none-marked"),
]  # fmt: skip


@pytest.mark.parametrize(("silences", "held_back", "changed"), FLEETS)
def test_mass_silence_suspects_the_control_plane_not_the_nodes(silences, held_back, changed):
    for node_id, seconds in silences.items():
        node_silent_for(node_id, seconds)

    report = check_liveness(now=NOW)

    assert report.held_back is held_back
    assert {n: state_of(n) for n in silences} == {n: changed.get(n, CONNECTED) for n in silences}
    assert sorted(report.unreachable) == sorted(n for n, s in changed.items() if s == UNREACHABLE)
    assert sorted(report.lost) == sorted(n for n, s in changed.items() if s == LOST)
    assert Event.objects.count() == len(changed)


def test_lost_nodes_do_not_count_towards_mass_silence():
    # Two nodes lost long ago are out of the fleet being judged: of the three left, one is silent.
    node_silent_for("gone1", 3600, state=LOST)
    node_silent_for("gone2", 3600, state=LOST)
    node_silent_for("a", 20)
    node_silent_for("b", 1)
    node_silent_for("c", 1)
    report = check_liveness(now=NOW)
    assert (report.held_back, report.unreachable) == (False, ["a"])


GRACE = [
    pytest.param(CONNECTED, 20, UNREACHABLE, "no heartbeat for 20s",
                 id="in-grace-unreachable-is-allowed"),
    pytest.param(CONNECTED, 90, UNREACHABLE, "no heartbeat for 90s",
                 id="in-grace-long-silent-becomes-only-unreachable"),
    pytest.param(UNREACHABLE, 90, UNREACHABLE, None, id="in-grace-unreachable-is-not-lost"),
    pytest.param(CONNECTED, 5, CONNECTED, None, id="in-grace-heard-recently-stays"),
]  # fmt: skip


@pytest.mark.parametrize(("before", "silence", "after", "reason"), GRACE)
def test_after_a_failover_no_node_is_declared_lost_during_the_grace(before, silence, after, reason):
    node_silent_for("node01", silence, state=before)

    report = check_liveness(now=NOW, grace_until=NOW + timedelta(seconds=30))

    assert state_of("node01") == after
    assert report.lost == []
    assert events_for("node01") == ([(before, after, reason)] if reason else [])


def test_once_the_grace_is_over_the_silent_node_is_lost():
    node_silent_for("node01", 90, state=UNREACHABLE)
    grace_until = NOW + timedelta(seconds=30)
    check_liveness(now=NOW, grace_until=grace_until)
    assert state_of("node01") == UNREACHABLE
    report = check_liveness(now=grace_until, grace_until=grace_until)
    assert report.lost == ["node01"]
    assert events_for("node01") == [(UNREACHABLE, LOST, "no heartbeat for 120s")]


def test_a_grace_that_already_ended_changes_nothing():
    node_silent_for("node01", 90)
    report = check_liveness(now=NOW, grace_until=NOW - timedelta(seconds=1))
    assert report.lost == ["node01"]


@pytest.mark.parametrize(
    ("unreachable_after", "lost_after", "silence", "after"),
    [
        pytest.param(5, 20, 6, UNREACHABLE, id="shorter-unreachable"),
        pytest.param(5, 20, 21, LOST, id="shorter-lost"),
        pytest.param(30, 120, 20, CONNECTED, id="longer-unreachable"),
        pytest.param(30, 120, 90, UNREACHABLE, id="longer-lost"),
    ],
)
def test_the_thresholds_come_from_settings(settings, unreachable_after, lost_after, silence, after):
    settings.NODE_UNREACHABLE_AFTER = unreachable_after
    settings.NODE_LOST_AFTER = lost_after
    node_silent_for("node01", silence)
    check_liveness(now=NOW)
    assert state_of("node01") == after


# -- the mass-silence hold ends: it suspects the control plane only while that is likely ----


def heartbeat_then_check(node_ids: tuple[str, ...], at: datetime):
    """The nodes still alive are heard at ``at``; then one liveness pass runs."""
    Node.objects.filter(id__in=node_ids).update(last_heartbeat=at)
    return check_liveness(now=at)


def test_a_control_plane_that_hears_no_node_loses_none_however_long_that_lasts():
    # Its network or Redis is gone: every node went silent at once. Declaring them lost
    # would move every replica the moment the first node is heard again.
    for node_id in ("a", "b", "c"):
        node_silent_for(node_id, 20)

    for later in (timedelta(minutes=1), timedelta(minutes=6), timedelta(hours=2)):
        report = check_liveness(now=NOW + later)
        assert report.held_back is True, f"after {later}"
        assert (report.unreachable, report.lost) == ([], [])
    assert {n: state_of(n) for n in "abc"} == {"a": CONNECTED, "b": CONNECTED, "c": CONNECTED}
    assert Event.objects.count() == 0


def test_two_dead_nodes_of_three_are_lost_within_five_minutes_fifteen_of_their_silence():
    # c is still heard, so this control plane's link works: the hold lasts at most
    # NODE_MASS_SILENCE_HOLD (5 min) from when the silence became mass (the second node's
    # heartbeat plus 15 s), after which the dead nodes are marked as any silent node is.
    node_silent_for("a", 20)
    node_silent_for("b", 20)
    node_silent_for("c", 0)
    heard = NOW - timedelta(seconds=20)

    held = heartbeat_then_check(("c",), heard + timedelta(minutes=5, seconds=14))
    report = heartbeat_then_check(("c",), heard + timedelta(minutes=5, seconds=15))

    assert (held.held_back, held.lost, held.unreachable) == (True, [], [])
    assert report.held_back is False
    assert sorted(report.lost) == ["a", "b"]
    assert {n: state_of(n) for n in "abc"} == {"a": LOST, "b": LOST, "c": CONNECTED}
    assert events_for("a") == [(CONNECTED, LOST, "no heartbeat for 315s")]


def test_the_hold_counts_from_when_the_silence_became_mass_not_from_the_first_silence():
    # b went silent alone (1 of 3) and was marked unreachable; 30 s later c went silent
    # too, and only then did the silence become mass: the hold counts from c's.
    node_silent_for("b", 50, state=UNREACHABLE)
    node_silent_for("c", 20)
    node_silent_for("d", 0)
    mass_since = NOW - timedelta(seconds=20) + timedelta(seconds=15)

    held = heartbeat_then_check(("d",), mass_since + timedelta(minutes=4, seconds=59))
    b_while_held = state_of("b")
    report = heartbeat_then_check(("d",), mass_since + timedelta(minutes=5))

    assert (held.held_back, b_while_held) == (True, UNREACHABLE)
    assert sorted(report.lost) == ["b", "c"]
