"""The reconciler: make the fleet match the catalog, one pass at a time.

Each step is a plain function that does one kind of work and says what it did, so
tests call them directly. Every decision is an event with its reason, and every
command to a node is sent after the transaction that decided it commits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from audit.events import record_news
from catalog.models import Profile, newest_engine_versions
from fleet import commands
from fleet.actions.replicas import create_replica, stop_replica
from fleet.autoscale import autoscale_profiles
from fleet.backoff import SETTLED as SETTLED  # bench/ reads it from here
from fleet.backoff import replacement_backoff
from fleet.backoff import replacement_delay as replacement_delay  # as do tests
from fleet.models import (
    Node,
    NodeState,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
)  # fmt: skip
from fleet.node_engines import tell_nodes_their_engines
from fleet.reconcile_report import ReconcileReport as ReconcileReport  # tests read it here
from fleet.rollout import drain_verdict, reports_once, roll_stale, start_drain
from fleet.routing_table import read_inflight_reports
from fleet.services import refresh_replica_state
from fleet.shard_specs import allocate_port, meeting_points, shard_spec, version_on_nodes
from fleet.snapshot import node_snapshots, placement_request
from fleet.transitions import transition
from placement import place_batch

log = logging.getLogger("llmgw.reconciler")

# The key of the PostgreSQL advisory lock that makes a pass one at a time, cluster-wide.
PASS_LOCK_KEY = 0x6C6C6D67  # "llmg"


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
    with one_pass_at_a_time() as alone:
        if not alone:
            report.skipped = "another reconcile pass is running"
            return report
        steps: list[Callable[[], None]] = [
            lambda: retire_orphans(report, epoch),
            lambda: retire_from_bad_nodes(report, epoch, now),
            lambda: fail_slow_starts(now, report),
            lambda: retire_failed(now, report, epoch),
            lambda: roll_stale(now, report, epoch),
            lambda: report.scaled.extend(autoscale_profiles(now, read_inflight_reports)),
            lambda: scale(report, epoch),
            lambda: place_waiting(now, epoch, report),
            lambda: finish_stops(report),
            lambda: report.told_engines.extend(tell_nodes_their_engines(now)),
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


def retire_orphans(report: ReconcileReport, epoch: int | None = None) -> None:
    """Stop replicas whose model or profile left the catalog: nothing routes to them."""
    in_catalog = set(Profile.objects.values_list("id", "model__name"))
    for replica in Replica.objects.filter(state__in=ReplicaState.COUNTED):
        if (replica.profile_id, replica.model_name) not in in_catalog:
            stop_replica(
                replica,
                f"{replica.model_name}/{replica.profile_name} left the catalog",
                report,
                epoch,
            )


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
        for node in Node.objects.filter(state=NodeState.LOST) | Node.objects.filter(draining=True)
    }
    if not bad:
        return
    now = now or timezone.now()
    read = reports_once()
    moving: list[tuple[Replica, str]] = []
    counted = Replica.objects.filter(state__in=ReplicaState.COUNTED)
    for replica in counted.select_related("profile__model").prefetch_related("shards__node"):
        node_id = next((s.node_id for s in replica.shards.all() if s.node_id in bad), None)
        if node_id is None:
            continue
        if replica.serves_from_lost_node and replica.profile is not None:
            _retire_once_replaced(replica, node_id, now, read, report, epoch)
        else:
            moving.append((replica, node_id))
    lost = [(r, n) for r, n in moving if bad[n] == "lost" and r.profile is not None]
    decisions = place_batch(
        [placement_request(str(r.id), r.profile, engine_version_of(r)) for r, _n in lost],
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
            record_news("replica", str(replica.id), f"{kept}: {nowhere[replica.id]}")
            continue
        stop_replica(
            replica,
            f"node {node_id} is {bad[node_id]}; placing the replica elsewhere",
            report,
            epoch,
        )


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
            stop_replica(replica, f"{lost}; its replacement is ready; {verdict}", report, epoch)
        return
    ready = Replica.objects.filter(profile=profile, state=ReplicaState.READY)
    others = [r for r in ready.prefetch_related("shards__node") if not r.serves_from_lost_node]
    if len(others) >= profile.replicas:
        start_drain(replica, now, profile, f"off lost node {node_id}, its replacement ready",
                    report)  # fmt: skip
    else:
        record_news("replica", str(replica.id), f"{lost}; serving until its replacement is ready")


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
            refresh_replica_state(replica.id)
            continue
        timeout = replica.profile.startup_timeout if replica.profile else 600
        if replica.starting_since and now - replica.starting_since > timedelta(seconds=timeout):
            reason = f"not ready within the profile's startup timeout of {timeout}s"
            if transition(Replica, replica.id, ReplicaState.FAILED, reason, reasons=[reason]):
                report.failed.append(str(replica.id))


def retire_failed(now: datetime, report: ReconcileReport, epoch: int | None = None) -> None:
    """A failed replica is stopped after its backoff (``fleet.backoff``); scale() then
    creates its replacement."""
    for replica in Replica.objects.filter(state=ReplicaState.FAILED).select_related("profile"):
        if now < replacement_backoff(replica, now).due_at:
            continue
        reason = f"replacing failed replica: {'; '.join(replica.reasons)}"
        stop_replica(replica, reason, report, epoch)


def scale(report: ReconcileReport, epoch: int | None = None) -> None:
    """Create replicas that are wanted; stop the surplus, least useful first.

    During a rolling restart the stale replicas are the surplus, and ``roll_stale``
    retires them after a drain: only up-to-date replicas beyond the wanted count go here,
    never the new ones a rollout is waiting for.
    """
    newest = newest_engine_versions()
    for profile in Profile.objects.select_related("model"):
        counted = Replica.objects.filter(profile=profile, state__in=ReplicaState.COUNTED)
        in_order = counted.order_by("-created_at").prefetch_related("shards__node")
        live = [r for r in in_order if not r.serves_from_lost_node]
        missing = profile.replicas - len(live)
        for _ in range(missing):
            create_replica(profile, f"wanted by {profile}", report)
        if missing < 0:
            fingerprint = profile.fingerprint(newest)
            up_to_date = [
                r for r in live if r.fingerprint == fingerprint and r.draining_since is None
            ]
            if len(up_to_date) < len(live):
                live, missing = up_to_date, profile.replicas - len(up_to_date)
            rank = {ReplicaState.FAILED: 0, ReplicaState.UNPLACEABLE: 1, ReplicaState.PLACING: 2,
                    ReplicaState.STARTING: 3, ReplicaState.READY: 4}  # fmt: skip
            surplus = sorted(live, key=lambda r: rank[r.state])[: max(0, -missing)]
            for replica in surplus:
                reason = f"scaled down: {profile} wants {profile.replicas}"
                stop_replica(replica, reason, report, epoch)


def place_waiting(now: datetime, epoch: int, report: ReconcileReport) -> None:
    """Place every replica waiting for nodes, in one batch against one snapshot."""
    waiting = list(
        Replica.objects.filter(state__in=ReplicaState.UNPLACED, profile__isnull=False)
        .select_related("profile__model")
        .order_by("created_at")
    )
    if not waiting:
        return
    requests = [placement_request(str(r.id), r.profile, engine_version_of(r)) for r in waiting]
    decisions = place_batch(requests, node_snapshots(now))
    for replica, decision in zip(waiting, decisions, strict=True):
        if decision.placed:
            _start(replica, decision, epoch)
            report.placed.append(str(replica.id))
            continue
        reasons = [decision.summary, *decision.reasons]
        if replica.state == ReplicaState.PLACING:
            transition(Replica, replica.id, ReplicaState.UNPLACEABLE, decision.summary,
                       reasons=reasons)  # fmt: skip
            report.unplaceable.append(str(replica.id))
        elif replica.reasons != reasons:
            Replica.objects.filter(id=replica.id).update(reasons=reasons)


def engine_version_of(replica: Replica) -> str:
    """The version a replica was resolved to; one made before versions were recorded
    takes its profile's as it resolves now (if that changed, the replica is stale)."""
    if replica.engine_version or replica.profile is None:
        return replica.engine_version
    return replica.profile.resolved_engine_version()


def _start(replica: Replica, decision, epoch: int) -> None:
    assert replica.profile is not None
    with transaction.atomic():
        if replica.state == ReplicaState.UNPLACEABLE and not transition(
            Replica, replica.id, ReplicaState.PLACING, "resources became available"
        ):
            return
        nodes = {node.id: node for node in Node.objects.filter(
            id__in=[rank.node for rank in decision.ranks])}  # fmt: skip
        engine = replica.profile.engine
        # Settled here at the latest, by the control plane: the spec names it, so the
        # node runs exactly this one and never the first it finds.
        version = engine_version_of(replica) or version_on_nodes(engine, nodes.values())
        runs = f"{engine} {version}" if version else f"{engine} (its node reports no version)"
        if not transition(
            Replica, replica.id, ReplicaState.STARTING,
            f"placed on {', '.join(rank.node for rank in decision.ranks)}, running {runs}",
            reasons=[], starting_since=timezone.now(), engine=engine, engine_version=version,
        ):  # fmt: skip
            return
        replica.engine, replica.engine_version = engine, version
        shards = []
        for rank in decision.ranks:
            shards.append(
                Shard.objects.create(
                    id=Shard.new_id(),
                    replica=replica,
                    rank=rank.rank,
                    node=nodes[rank.node],
                    gpus=list(rank.gpus),
                    port=allocate_port(rank.node),
                )
            )
        meeting = meeting_points(shards, nodes)
        for shard, rank in zip(shards, decision.ranks, strict=True):
            spec = shard_spec(replica, shard, nodes[rank.node], len(shards), meeting,
                              rank.fabric, epoch)  # fmt: skip
            transaction.on_commit(lambda n=shard.node_id, s=spec: commands.send_start_shard(n, s))


def finish_stops(report: ReconcileReport) -> None:
    """A stopping replica is stopped once no shard can still be running where it was."""
    for replica in Replica.objects.filter(state=ReplicaState.STOPPING).prefetch_related(
        "shards__node"
    ):
        pending = [
            shard
            for shard in replica.shards.all()
            if shard.state not in ShardState.FINAL
            and shard.node is not None
            and shard.node.state == NodeState.CONNECTED
        ]
        if pending:
            continue
        if transition(Replica, replica.id, ReplicaState.STOPPED, "every shard has stopped"):
            report.stopped.append(str(replica.id))
