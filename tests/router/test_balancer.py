"""The balancer's rules, called directly with an injected clock and random source."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from router.balance.balancer import Balancer
from router.table.routes import Endpoint


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def balancer(clock: Clock, **options) -> Balancer:
    return Balancer(clock=clock, rng=random.Random(7), **options)


def pick(b: Balancer, replicas, **options) -> str | None:
    """The replica of the endpoint picked among ``replicas`` (``exclude`` as replicas too)."""
    endpoints = {
        r: Endpoint(replica=r, url=f"http://{r}:9000", authorization=b"") for r in replicas
    }
    if "exclude" in options:
        options["exclude"] = [endpoints[r] for r in options["exclude"]]
    picked = b.pick(list(endpoints.values()), **options)
    return None if picked is None else picked.replica


def load(b: Balancer, replica: str, requests: int) -> None:
    for _ in range(requests):
        b.started(replica)


def test_least_outstanding_replica_is_chosen(clock):
    b = balancer(clock)
    load(b, "a", 3)
    load(b, "b", 1)
    load(b, "c", 2)
    assert pick(b, ["a", "b", "c"]) == "b"


def test_ties_are_spread_over_every_tied_replica(clock):
    b = balancer(clock)
    picks = Counter(pick(b, ["a", "b", "c"]) for _ in range(300))
    assert set(picks) == {"a", "b", "c"}


def test_excluded_replicas_are_never_picked_and_none_is_left_means_none(clock):
    b = balancer(clock)
    assert pick(b, ["a", "b"], exclude=["a"]) == "b"
    assert pick(b, ["a", "b"], exclude=["a", "b"]) is None
    assert pick(b, []) is None


def test_a_session_sticks_to_one_replica_while_load_is_even(clock):
    b = balancer(clock)
    replicas = ["a", "b", "c", "d"]
    first = pick(b, replicas, session="user-42")
    assert {pick(b, replicas, session="user-42") for _ in range(20)} == {first}


def test_sessions_spread_over_replicas(clock):
    b = balancer(clock)
    chosen = {pick(b, ["a", "b", "c", "d"], session=f"user-{n}") for n in range(100)}
    assert chosen == {"a", "b", "c", "d"}


def test_a_session_keeps_its_replica_when_another_replica_leaves(clock):
    b = balancer(clock)
    home = pick(b, ["a", "b", "c", "d"], session="user-7")
    others = [r for r in ["a", "b", "c", "d"] if r != home]
    assert pick(b, [home, *others[1:]], session="user-7") == home


def test_an_overloaded_session_replica_gives_way(clock):
    b = balancer(clock, load_factor=1.25)
    replicas = ["a", "b", "c", "d"]
    home = pick(b, replicas, session="heavy")
    load(b, home, 10)  # far over 1.25 x the mean load
    assert pick(b, replicas, session="heavy") != home


def test_repeated_failures_take_a_replica_out_until_the_cooldown_ends(clock):
    b = balancer(clock, failure_threshold=3, cooldown=5.0)
    for _ in range(3):
        b.started("bad")
        b.finished("bad", ok=False)
    assert b.is_open("bad")
    assert {pick(b, ["bad", "good"]) for _ in range(30)} == {"good"}
    clock.now += 5.0
    assert not b.is_open("bad")
    assert b.admits("bad")


def test_fewer_failures_than_the_threshold_or_a_success_between_keep_it_in(clock):
    b = balancer(clock, failure_threshold=3)
    for ok in (False, False, True, False, False):
        b.started("flaky")
        b.finished("flaky", ok=ok)
    assert not b.is_open("flaky")


def test_half_open_lets_one_trial_through_and_its_success_closes_the_breaker(clock):
    b = balancer(clock, failure_threshold=1, cooldown=5.0)
    b.started("r")
    b.finished("r", ok=False)
    clock.now += 5.0
    assert pick(b, ["r", "other"], exclude=["other"]) == "r"
    trial = b.started("r")
    assert trial
    assert not b.admits("r")  # one trial at a time
    b.finished("r", ok=True, trial=trial)
    assert b.admits("r") and not b.is_open("r")


def test_a_failed_trial_opens_the_breaker_again_at_once(clock):
    b = balancer(clock, failure_threshold=3, cooldown=5.0)
    for _ in range(3):
        b.started("r")
        b.finished("r", ok=False)
    clock.now += 5.0
    trial = b.started("r")
    b.finished("r", ok=False, trial=trial)
    assert b.is_open("r")


def test_when_every_replica_is_out_they_are_tried_anyway(clock):
    b = balancer(clock, failure_threshold=1)
    for replica in ("a", "b"):
        b.started(replica)
        b.finished(replica, ok=False)
    assert pick(b, ["a", "b"]) in {"a", "b"}


def test_an_outcome_that_says_nothing_of_the_replica_changes_no_breaker(clock):
    b = balancer(clock, failure_threshold=1)
    b.started("r")
    b.finished("r", ok=None)  # the client hung up
    assert not b.is_open("r")
    assert b.inflight("r") == 0


def test_forgetting_keeps_replicas_with_requests_in_flight(clock):
    b = balancer(clock)
    b.started("busy")
    b.started("idle")
    b.finished("idle", ok=True)
    b.forget_except([])
    assert set(b.health) == {"busy"}


def test_equal_replicas_share_sequential_requests(clock):
    b = balancer(clock)
    picks = []
    for _ in range(50):
        replica = pick(b, ["a", "b"])
        b.started(replica)
        b.finished(replica, ok=True)
        picks.append(replica)
    assert set(picks) == {"a", "b"}


class Wall:
    """Wall-clock time that moves with the monotonic test clock (2026-01-02 03:04:05 UTC
    when the test clock reads 1000)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def __call__(self) -> float:
        return 1_767_323_045.0 + self.clock.now - 1000.0


def endpoints_of(*replicas: str) -> list[Endpoint]:
    return [Endpoint(replica=r, url=f"http://{r}:9000", authorization=b"") for r in replicas]


def test_every_breaker_open_is_an_outage_saying_how_many_and_since_when(clock):
    b = Balancer(clock=clock, wall=Wall(clock), rng=random.Random(7), failure_threshold=2,
                 cooldown=30)  # fmt: skip
    for replica, at in (("a", 1000.0), ("b", 1010.0)):
        clock.now = at
        for _ in range(2):
            b.started(replica)
            b.finished(replica, ok=False)
    clock.now = 1025.0
    outage = b.outage(endpoints_of("a", "b"))
    assert outage is not None
    assert (outage.replicas, outage.retry_after) == (2, 5)  # a lets a trial through first
    assert outage.sentence("gemma") == (
        "2 replicas of gemma exist and none answers: each failed 2 requests in a row and is "
        "taken out by the router's breaker; none has answered since 03:04:15 UTC (15 s ago). "
        "The router lets one request through to each again after its 30 s cooldown."
    )


def test_no_outage_while_one_replica_is_in_or_due_its_trial(clock):
    b = Balancer(clock=clock, wall=Wall(clock), failure_threshold=1, cooldown=30)
    b.started("a")
    b.finished("a", ok=False)
    assert b.outage(endpoints_of("a", "b")) is None  # b never failed
    b.started("b")
    b.finished("b", ok=False)
    assert b.outage(endpoints_of("a", "b")) is not None
    clock.now += 31  # past the cooldown: a trial may go through
    assert b.outage(endpoints_of("a", "b")) is None
    assert b.outage([]) is None
