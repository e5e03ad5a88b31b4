"""The reconciler: make the fleet match the catalog, one pass at a time.

Each step is a plain function that does one kind of work and says what it did, so
tests call them directly. Every decision is an event with its reason, and every
command to a node is sent after the transaction that decided it commits.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Max, Q
from django.utils import timezone

from audit.actors import RECONCILER
from audit.models import Event, EventKind
from catalog.models import Profile, newest_engine_versions
from core.collector import collecting_less
from fleet.actions.replicas import (
    create_replica,
    drain_replica,
    fail_replica,
    finish_stop,
    note_replica_kept,
    note_unplaceable,
    start_replica,
    stop_replica,
)
from fleet.actions.shard_reports import refresh_replica_state
from fleet.models import (
    Node,
    NodeState,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
    with_shard_nodes,
)
from fleet.planning.backoff import replacement_backoffs
from fleet.planning.snapshot import node_snapshots, placement_request
from fleet.reconcile.autoscale import autoscale_profiles
from fleet.reconcile.callers import tell_nodes_their_callers
from fleet.reconcile.engines import tell_nodes_their_engines
from fleet.reconcile.report import ReconcileReport
from fleet.reconcile.rollout import drain_verdict, reports_once, roll_stale
from fleet.reconcile.stand_ins import keep_stand_ins
from fleet.routing_table import read_inflight_reports
from placement import place_batch

log = logging.getLogger("llmgw.reconciler")

# The key of the PostgreSQL advisory lock that makes a pass one at a time, cluster-wide.
PASS_LOCK_KEY = 0x6C6C6D67  # "llmg"
# Why an unplaceable replica is refused is worked out again after this (and up to as long
# again, spread by replica), or at the next pass after an operator's action.
REEXPLAIN_AFTER = timedelta(seconds=30)
# The operators' actions that may change where a replica fits: on a node (a drain, a
# pool), on the catalog (an apply), or on placement itself (check again).
REEXPLAINED_BY = (EventKind.NODE, EventKind.CATALOG, EventKind.PLACEMENT)


def reconcile(
    now: datetime | None = None, epoch: int = 0, still_leading: Callable[[], bool] | None = None
) -> ReconcileReport:
    """One pass: retire what must go, fail what timed out, roll stale profiles, create,
    place, finish stops.

    One pass runs at a time in the whole cluster: two passes from stale snapshots would
    place replicas on the same GPUs, and a pass that overruns is skipped, not queued.
    ``still_leading`` is asked before every step: a leader that lost its lease mid-pass
    must not write, or send commands under an epoch that is no longer current.
    """
    now = now or timezone.now()
    report = ReconcileReport()
    # A pass reads every node's reports: the collector would walk them again and again.
    with one_pass_at_a_time() as alone, collecting_less():
        if not alone:
            report.skipped = "another reconcile pass is running"
            return report
        steps: list[Callable[[], None]] = [
            lambda: retire_orphans(report, epoch),
            lambda: retire_from_bad_nodes(report, epoch, now),
            lambda: fail_slow_starts(now, report),
            lambda: retire_failed(now, report, epoch),
            lambda: keep_stand_ins(now, report, epoch),
            lambda: roll_stale(now, report, epoch),
            lambda: report.scaled.extend(autoscale_profiles(now, read_inflight_reports)),
            lambda: scale(report, epoch),
            lambda: place_waiting(now, epoch, report),
            lambda: finish_stops(report),
            lambda: report.told_engines.extend(tell_nodes_their_engines(now)),
            lambda: report.told_callers.extend(tell_nodes_their_callers(now)),
        ]
        for step in steps:
            if still_leading is not None and not still_leading():
                report.skipped = f"no longer the leader at epoch {epoch}"
                log.warning("reconcile pass stopped: %s", report.skipped)
                break
            step()
    if report.did_anything():
        log.info("reconciled: %s", {k: v for k, v in report.summary().items() if v})
    return report


@contextmanager
def one_pass_at_a_time() -> Iterator[bool]:
    """Hold the cluster-wide pass lock while the block runs; yield False if another has it.

    A session-level advisory lock: it spans the pass's transactions, and a reconciler
    that dies releases it with its connection.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [PASS_LOCK_KEY])
        taken = bool(cursor.fetchone()[0])
    try:
        yield taken
    finally:
        if taken:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [PASS_LOCK_KEY])


def _stop(replica: Replica, reason: str, report: ReconcileReport, epoch: int | None) -> None:
    if stop_replica(replica, reason, actor=RECONCILER, epoch=epoch):
        report.stopping.append(str(replica.id))


def retire_orphans(report: ReconcileReport, epoch: int | None = None) -> None:
    """Stop replicas whose model or profile left the catalog: nothing routes to them."""
    in_catalog = set(Profile.objects.values_list("id", "model__name"))
    counted = Replica.objects.filter(state__in=ReplicaState.COUNTED)
    for replica in counted.only("id", "state", "profile_id", "model_name", "profile_name"):
        if (replica.profile_id, replica.model_name) not in in_catalog:
            left = f"{replica.model_name}/{replica.profile_name} left the catalog"
            _stop(replica, left, report, epoch)


def retire_from_bad_nodes(
    report: ReconcileReport, epoch: int | None = None, now: datetime | None = None
) -> None:
    """Move replicas off lost or draining nodes (a lost node's engines are still stopped).

    A lost node's engines are not assumed dead. Its ready replica serves until its
    replacement is ready (``scale`` makes one, as it no longer counts it), then drains
    like a replica a rollout replaces; one not yet ready moves only if another node can
    take it now, since stopping one with nowhere else to go would only turn a silent
    agent into a restarted engine once it is back.
    """
    bad = {
        node.id: ("lost" if node.state == NodeState.LOST else "draining")
        for node in Node.objects.filter(Q(state=NodeState.LOST) | Q(draining=True)).only(
            "id", "state"
        )
    }
    if not bad:
        return
    now = now or timezone.now()
    read = reports_once()
    moving: list[tuple[Replica, str]] = []
    on_bad = Shard.objects.filter(node_id__in=list(bad)).values("replica_id")
    counted = Replica.objects.filter(state__in=ReplicaState.COUNTED, id__in=on_bad)
    for replica in with_shard_nodes(counted.select_related("profile__model")):
        node_id = next((s.node_id for s in replica.shards.all() if s.node_id in bad), None)
        if node_id is None:
            continue
        if replica.serves_from_lost_node and replica.profile is not None:
            _retire_once_replaced(replica, node_id, now, read, report, epoch)
        else:
            moving.append((replica, node_id))
    lost = [(r, n) for r, n in moving if bad[n] == "lost" and r.profile is not None]
    newest = newest_engine_versions()
    decisions = place_batch(
        [placement_request(str(r.id), _profile(r), r.version_to_run(newest)) for r, _n in lost],
        node_snapshots(now),
    ) if lost else []  # fmt: skip
    nowhere = {
        replica.id: decision.summary
        for (replica, _n), decision in zip(lost, decisions, strict=True)
        if not decision.placed
    }
    for replica, node_id in moving:
        if replica.id in nowhere:
            kept = f"node {node_id} is lost; kept, since no other node can take it"
            news = f"{kept}: {nowhere[replica.id]}"
            note_replica_kept(replica.id, news, actor=RECONCILER)
            continue
        elsewhere = f"node {node_id} is {bad[node_id]}; placing the replica elsewhere"
        _stop(replica, elsewhere, report, epoch)


def _retire_once_replaced(
    replica: Replica, node_id: str, now: datetime, read: Callable, report: ReconcileReport,
    epoch: int | None,
) -> None:  # fmt: skip
    """Drain a replica serving from a lost node once its profile has its wanted replicas
    ready without it, and stop it when the drain is over; until then it keeps serving."""
    profile = replica.profile
    assert profile is not None
    lost = f"node {node_id} is lost"
    if replica.draining_since is not None:
        verdict = drain_verdict(replica, now, profile.drain_timeout, read)
        if verdict is not None:
            _stop(replica, f"{lost}; its replacement is ready; {verdict}", report, epoch)
        return
    ready = Replica.objects.filter(profile=profile, state=ReplicaState.READY)
    others = [r for r in with_shard_nodes(ready) if not r.serves_from_lost_node]
    if len(others) >= profile.replicas:
        because = f"off lost node {node_id}, its replacement ready"
        if drain_replica(replica, now, profile, because, actor=RECONCILER):
            report.draining.append(str(replica.id))
    else:
        serving = f"{lost}; serving until its replacement is ready"
        note_replica_kept(replica.id, serving, actor=RECONCILER)


def fail_slow_starts(now: datetime, report: ReconcileReport) -> None:
    """A replica not ready within its profile's startup timeout has failed.

    The timer starts each time the replica enters starting and is not reset by download
    progress: an hour-long download must not keep a doomed replica alive indefinitely.
    """
    starting = Replica.objects.filter(state=ReplicaState.STARTING).select_related("profile")
    for replica in starting.prefetch_related("shards"):
        ranks = [shard.state for shard in replica.shards.all()]
        if ranks and all(state == ShardState.READY for state in ranks):
            # Every rank says it is healthy: that is a ready replica, never a slow one.
            refresh_replica_state(replica.id, actor=RECONCILER)
            continue
        timeout = replica.profile.startup_timeout if replica.profile else 600
        if replica.starting_since and now - replica.starting_since > timedelta(seconds=timeout):
            reason = f"not ready within the profile's startup timeout of {timeout}s"
            if fail_replica(replica.id, reason, actor=RECONCILER):
                report.failed.append(str(replica.id))


def retire_failed(now: datetime, report: ReconcileReport, epoch: int | None = None) -> None:
    """A failed replica is stopped after its backoff (``fleet.planning.backoff``); scale() then
    creates its replacement."""
    failed = list(
        Replica.objects.filter(state=ReplicaState.FAILED).select_related("profile__model")
    )
    backoffs = replacement_backoffs(failed, now)
    for replica in failed:
        if now < backoffs[replica.id].due_at:
            continue
        reason = f"replacing failed replica: {'; '.join(replica.reasons)}"
        _stop(replica, reason, report, epoch)


def scale(report: ReconcileReport, epoch: int | None = None) -> None:
    """Create replicas that are wanted; stop the surplus, least useful first.

    During a rolling restart the stale replicas are the surplus, and ``roll_stale``
    retires them after a drain: only up-to-date replicas beyond the wanted count go here,
    never the new ones a rollout is waiting for.
    """
    newest = newest_engine_versions()
    # Every profile's counted replicas in one read, newest first, not a read per profile.
    counted: dict[int, list[Replica]] = defaultdict(list)
    replicas = Replica.objects.filter(
        state__in=ReplicaState.COUNTED, profile__isnull=False, stands_in_since__isnull=True
    )  # a stand-in is beyond the count (fleet.reconcile.stand_ins)
    for replica in with_shard_nodes(replicas.order_by("-created_at")):
        counted[replica.profile_id].append(replica)  # type: ignore[index]
    for profile in Profile.objects.select_related("model"):
        live = [r for r in counted[profile.id] if not r.serves_from_lost_node]
        missing = profile.replicas - len(live)
        for _ in range(missing):
            created = create_replica(profile, f"wanted by {profile}", actor=RECONCILER)
            report.created.append(str(created.id))
        if missing < 0:
            fingerprint = profile.fingerprint(newest)
            up_to_date = [
                r for r in live if r.runs_settings(fingerprint) and r.draining_since is None
            ]
            if len(up_to_date) < len(live):
                live, missing = up_to_date, profile.replicas - len(up_to_date)
            rank: dict[str, int] = {
                ReplicaState.FAILED: 0, ReplicaState.UNPLACEABLE: 1, ReplicaState.PLACING: 2,
                ReplicaState.STARTING: 3, ReplicaState.READY: 4,
            }  # fmt: skip
            surplus = sorted(live, key=lambda r: rank[r.state])[: max(0, -missing)]
            for replica in surplus:
                reason = f"scaled down: {profile} wants {profile.replicas}"
                _stop(replica, reason, report, epoch)


def place_waiting(now: datetime, epoch: int, report: ReconcileReport) -> None:
    """Place every replica waiting for nodes, in one batch against one snapshot.

    Each pass tries to place every one; why an unplaceable one is refused (every filter on
    every node: at 10,000 nodes, 25 such models took 3 s a pass) is worked out again only
    30 to 60 s later (REEXPLAIN_AFTER), so its reasons lag the fleet by at most that, and
    say when they were worked out (``Replica.reasons_at``). An operator's action on a node,
    the catalog or placement since has it worked out at once (``REEXPLAINED_BY``).
    """
    waiting = list(
        Replica.objects.filter(state__in=ReplicaState.UNPLACED, profile__isnull=False)
        .select_related("profile__model")
        .order_by("created_at")
    )
    if not waiting:
        return
    newest = newest_engine_versions()
    requests = [
        placement_request(str(r.id), _profile(r), r.version_to_run(newest)) for r in waiting
    ]
    acted_at = _operator_acted_since(r.reasons_at for r in waiting)
    lately = {str(r.id) for r in waiting if _explained_lately(r, now, acted_at)}
    decisions = place_batch(requests, node_snapshots(now), unexplained=lately)
    for replica, decision in zip(waiting, decisions, strict=True):
        # Counted as decided, as before: a start that loses a race still counts as placed.
        if decision.placed:
            start_replica(replica, decision, actor=RECONCILER, epoch=epoch)
            report.placed.append(str(replica.id))
            continue
        if replica.state == ReplicaState.PLACING:
            report.unplaceable.append(str(replica.id))
        note_unplaceable(replica, decision, actor=RECONCILER, now=now)


def _operator_acted_since(worked_out: Iterable[datetime | None]) -> datetime | None:
    """When an operator last acted on a node, the catalog or placement, if that was after
    the oldest of these refusals was worked out (one indexed read of the minute since)."""
    known = [at for at in worked_out if at is not None]
    if not known:
        return None
    acted = Event.objects.filter(at__gt=min(known), kind__in=REEXPLAINED_BY).exclude(actor_name="")
    return acted.aggregate(latest=Max("at"))["latest"]


def _explained_lately(replica: Replica, now: datetime, acted_at: datetime | None) -> bool:
    at = replica.reasons_at
    if replica.state != ReplicaState.UNPLACEABLE or at is None:
        return False
    if acted_at is not None and acted_at > at:
        return False  # an operator acted since: what it said may no longer hold
    # Each replica waits up to as long again, by its id, so that many refused together
    # are not all worked out again in the same pass.
    spread = REEXPLAIN_AFTER * (replica.id.int % 100 / 100)
    return now - at < REEXPLAIN_AFTER + spread


def finish_stops(report: ReconcileReport) -> None:
    """A stopping replica is stopped once no shard can still be running where it was."""
    for replica in with_shard_nodes(Replica.objects.filter(state=ReplicaState.STOPPING)):
        pending = [
            shard
            for shard in replica.shards.all()
            if shard.state not in ShardState.FINAL
            and shard.node is not None
            and shard.node.state == NodeState.CONNECTED
        ]
        if pending:
            continue
        if finish_stop(replica.id, actor=RECONCILER):
            report.stopped.append(str(replica.id))


def _profile(replica: Replica) -> Profile:
    """The profile of a replica the query kept only if it has one."""
    assert replica.profile is not None
    return replica.profile
