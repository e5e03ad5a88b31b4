"""Which endpoint takes the next request: least outstanding requests, sessions, breakers.

Pure: no I/O, an injected clock and random source, so every rule is tested directly.

- Least outstanding requests: the replica with the fewest requests in flight; ties are
  broken at random (what power of two choices comes to when the two drawn carry equal
  load), so equal replicas share the load instead of the first in the list taking it
  all. A latency tie-breaker was tried and dropped: one slow first answer (a fresh
  connection) steered every sequential request away from a replica.
- Session affinity (``x-session-id``): rendezvous hashing ranks replicas per session, so
  a session stays put while replicas come and go; a replica already carrying more than
  ``load_factor`` times the mean load is passed over (consistent hashing with bounded
  loads), so one heavy session cannot pin a hot spot.
- Circuit breaker: ``failure_threshold`` consecutive failures (connect errors, 5xx) take
  a replica out for ``cooldown`` seconds; then one trial request is let through, and its
  outcome closes the breaker or opens it again. When every candidate is out, they are
  tried anyway: a model that may be up beats a certain 503. When that fails too, the
  client is told what the breakers know (``outage``): how many replicas exist, that none
  answers, and since when.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from core.humanize import count_of, format_seconds
from router.table.routes import Endpoint


@dataclass
class ReplicaHealth:
    """What the balancer remembers about one replica."""

    inflight: int = 0
    failures: int = 0  # consecutive
    open_until: float = 0.0  # breaker open until this clock time; 0 when closed
    trial_inflight: bool = False  # half-open: one request is testing the replica
    failing_since: float = 0.0  # wall-clock time of the first of the failures in a row


@dataclass(frozen=True)
class Outage:
    """Every replica of a model taken out by its breaker: what a client is told."""

    replicas: int
    failures: int  # in a row, that take a replica out
    since: float  # wall-clock time the last replica began failing: none answered since
    ago: float  # seconds since then
    retry_after: int  # seconds until the first breaker lets a trial through
    cooldown: float

    def sentence(self, model: str) -> str:
        at = datetime.fromtimestamp(self.since, UTC).strftime("%H:%M:%S UTC")
        return (
            f"{count_of(self.replicas, 'replica')} of {model} "
            f"{'exists' if self.replicas == 1 else 'exist'} and none answers: each "
            f"failed {count_of(self.failures, 'request')} in a row and is taken out by the "
            f"router's breaker; none has answered since {at} ({format_seconds(self.ago)} ago). "
            "The router lets one request through to each again after its "
            f"{format_seconds(self.cooldown)} cooldown."
        )


class Balancer:
    """Picks endpoints and keeps their replicas' load and health; one per router process."""

    def __init__(
        self,
        *,
        failure_threshold: int = 3,
        cooldown: float = 5.0,
        load_factor: float = 1.25,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        """``clock`` times the breakers; ``wall`` dates a failure for the people told of it."""
        self.failure_threshold = failure_threshold
        self.cooldown = cooldown
        self.load_factor = load_factor
        self.clock = clock
        self.wall = wall
        self.rng = rng or random.Random()  # noqa: S311 - spreading load, not secrecy
        self.health: dict[str, ReplicaHealth] = {}

    def _health(self, replica: str) -> ReplicaHealth:
        health = self.health.get(replica)
        if health is None:
            health = self.health[replica] = ReplicaHealth()
        return health

    def admits(self, replica: str, now: float | None = None) -> bool:
        """Whether the breaker lets a request through to ``replica`` now."""
        health = self.health.get(replica)
        if health is None or health.open_until == 0.0:
            return True
        if (self.clock() if now is None else now) < health.open_until:
            return False
        return not health.trial_inflight  # half-open: one trial at a time

    def pick(
        self,
        endpoints: Sequence[Endpoint],
        *,
        session: str | None = None,
        exclude: Collection[Endpoint] = (),
    ) -> Endpoint | None:
        """The endpoint for the next request, or None when ``exclude`` leaves none."""
        candidates = [e for e in endpoints if e not in exclude] if exclude else list(endpoints)
        if not candidates:
            return None
        now = self.clock()
        admitted = [e for e in candidates if self.admits(e.replica, now)]
        if admitted:
            candidates = admitted
        if len(candidates) == 1:
            return candidates[0]
        if session:
            return self._by_session(candidates, session)
        return self._least_outstanding(candidates)

    def _load(self, replica: str) -> int:
        health = self.health.get(replica)
        return 0 if health is None else health.inflight

    def _least_outstanding(self, candidates: list[Endpoint]) -> Endpoint:
        lowest = min(self._load(e.replica) for e in candidates)
        tied = [e for e in candidates if self._load(e.replica) == lowest]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)

    def _by_session(self, candidates: list[Endpoint], session: str) -> Endpoint:
        ranked = sorted(candidates, key=lambda e: _rendezvous(session, e.replica), reverse=True)
        total = sum(self._load(e.replica) for e in candidates) + 1
        capacity = math.ceil(self.load_factor * total / len(candidates))
        for endpoint in ranked:
            if self._load(endpoint.replica) + 1 <= capacity:
                return endpoint
        return ranked[0]  # unreachable: some replica is at or below the mean

    def started(self, replica: str) -> bool:
        """Count a request in flight; return whether it is a half-open breaker's trial."""
        health = self._health(replica)
        health.inflight += 1
        if health.open_until and not health.trial_inflight and self.clock() >= health.open_until:
            health.trial_inflight = True
            return True
        return False

    def finished(self, replica: str, *, ok: bool | None, trial: bool = False) -> None:
        """Count a request done; ``ok`` None means the outcome says nothing of the replica.

        ``trial`` is what ``started`` returned for this request.
        """
        health = self._health(replica)
        health.inflight = max(0, health.inflight - 1)
        if trial:
            health.trial_inflight = False
        if ok is None:
            return
        if ok:
            health.failures = 0
            health.open_until = 0.0
            health.failing_since = 0.0
            return
        if health.failures == 0:
            health.failing_since = self.wall()
        health.failures += 1
        if trial or health.failures >= self.failure_threshold:
            health.open_until = self.clock() + self.cooldown

    def inflight(self, replica: str) -> int:
        return self._load(replica)

    def failing(self) -> list[str]:
        """The replicas whose breaker has tripped and no request has answered since (open,
        or half-open between trials): what the control plane reads as "unreachable"."""
        return sorted(r for r, h in self.health.items() if h.failures >= self.failure_threshold)

    def is_open(self, replica: str) -> bool:
        """Whether the replica is taken out right now (for metrics and tests)."""
        health = self.health.get(replica)
        return health is not None and self.clock() < health.open_until

    def outage(self, endpoints: Sequence[Endpoint]) -> Outage | None:
        """The outage when every one of ``endpoints`` is taken out now (none is due a
        trial); None while one may still answer."""
        now = self.clock()
        held = [self.health.get(e.replica) for e in endpoints]
        out = [h for h in held if h is not None and now < h.open_until]
        if not endpoints or len(out) < len(endpoints):
            return None
        since = max(h.failing_since for h in out)
        return Outage(
            replicas=len(endpoints),
            failures=min(h.failures for h in out),
            since=since,
            ago=self.wall() - since,
            retry_after=max(1, math.ceil(min(h.open_until for h in out) - now)),
            cooldown=self.cooldown,
        )

    def forget_except(self, replicas: Collection[str]) -> None:
        """Drop what is remembered of replicas that left the table and carry no requests."""
        for replica in [r for r in self.health if r not in replicas]:
            if self.health[replica].inflight == 0:
                del self.health[replica]


def _rendezvous(session: str, replica: str) -> int:
    digest = hashlib.blake2b(f"{session}\0{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
