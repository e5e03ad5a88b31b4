"""Rolling restarts: a profile's stale replicas are replaced one at a time, without a gap.

A replica is stale when the fingerprint its engines started with is not its profile's
any more (``args`` or the engine changed). Each reconcile pass moves every rollout on
by what its bounds allow: at most ``replicas + rollout.surge`` live replicas, at least
``replicas - rollout.unavailable`` ready ones. A stale replica leaves by a drain: it
drops out of the routing table at once, keeps running while the routers still carry
requests to it (they say so in Redis, ``router/balance/inflight.py``), and is stopped once they
are done or its profile's ``drain_timeout`` has passed. No pass waits for a drain; each
looks whether it is over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from audit.actors import RECONCILER
from catalog.models import Profile, newest_engine_versions
from fleet.actions.replicas import create_replica, drain_replica, note_rollout, stop_replica
from fleet.models import Replica, ReplicaState
from fleet.reconcile.report import ReconcileReport
from fleet.routing_table import read_inflight_reports

# Routers reload within a second of the notification and report every second; a drain
# shorter than this could miss a router that has not reported since it reloaded.
MIN_DRAIN = timedelta(seconds=2)

Reports = list[dict[str, Any]] | None


@dataclass
class Rollout:
    """One profile's live replicas, sorted by what a rolling restart does with them."""

    profile: Profile
    fingerprint: str
    paused: bool
    up_to_date: list[Replica] = field(default_factory=list)
    stale: list[Replica] = field(default_factory=list)  # not yet draining
    draining: list[Replica] = field(default_factory=list)

    @property
    def rolling(self) -> bool:
        return bool(self.stale or self.draining)

    @property
    def live(self) -> int:
        return len(self.up_to_date) + len(self.stale) + len(self.draining)

    @property
    def serving(self) -> list[Replica]:
        """Ready replicas the routers send requests to (a draining one takes none)."""
        return [r for r in self.up_to_date + self.stale if r.state == ReplicaState.READY]

    def drainable(self) -> int:
        """How many more stale replicas may leave the table without going below the floor."""
        floor = max(0, self.profile.replicas - self.profile.rollout_unavailable)
        return len(self.serving) - floor

    def waiting(self) -> str:
        """Why the rollout cannot move on by itself, in words an operator can act on."""
        if not self.rolling:
            return ""
        if self.paused:
            name = self.profile.model.name
            return f"paused; `llmgw_ctl rollout resume {name}` continues it"
        unplaceable = [r for r in self.up_to_date if r.state == ReplicaState.UNPLACEABLE]
        if unplaceable and self.stale and self.drainable() <= 0:
            why = (unplaceable[0].reasons or ["no reason recorded"])[0]
            return (
                f"waiting: no room to start a new replica of {self.profile} beside the "
                f"{len(self.serving)} running (placement: {why}); raise rollout.unavailable "
                "to replace in place, or free a node"
            )
        return ""


def rollouts(model_name: str | None = None) -> list[Rollout]:
    """Every profile (of one model, if named) with its live replicas sorted for a rollout."""
    profiles = Profile.objects.select_related("model")
    replicas = Replica.objects.filter(
        state__in=ReplicaState.COUNTED, profile__isnull=False, stands_in_since__isnull=True
    )  # a stand-in is retired on its own terms (fleet.reconcile.stand_ins)
    if model_name is not None:
        profiles = profiles.filter(model__name=model_name)
        replicas = replicas.filter(model_name=model_name)
    newest = newest_engine_versions()
    result = {p.id: Rollout(p, p.fingerprint(newest), p.model.rollout_paused) for p in profiles}
    for replica in replicas.order_by("created_at"):
        rollout = result.get(replica.profile_id) if replica.profile_id is not None else None
        if rollout is None:
            continue
        if replica.draining_since is not None:
            rollout.draining.append(replica)
        elif replica.runs_settings(rollout.fingerprint):
            rollout.up_to_date.append(replica)
        else:
            rollout.stale.append(replica)
    return list(result.values())


def roll_stale(now: datetime, report: ReconcileReport, epoch: int | None = None) -> None:
    """Move every profile's rolling restart on by one step its bounds allow."""
    read = reports_once()
    for rollout in rollouts():
        if not rollout.rolling:
            continue
        stopped = _finish_drains(rollout, now, read, report, epoch)
        if not rollout.paused:
            _retire_unstarted(rollout, report, epoch)
            _surge(rollout, report)
            _drain(rollout, now, report)
            waiting = rollout.waiting()
            if waiting:
                note_rollout(rollout.profile, waiting, actor=RECONCILER)
        if stopped and not rollout.rolling:
            note_rollout(
                rollout.profile,
                f"rollout finished: every replica of {rollout.profile} runs its current "
                f"settings (fingerprint {rollout.fingerprint})",
                actor=RECONCILER,
            )


def reports_once() -> Callable[[], Reports]:
    """Read the routers' reports at most once a pass, and only if a drain asks."""
    cache: list[Reports] = []

    def read() -> Reports:
        if not cache:
            cache.append(read_inflight_reports())
        return cache[0]

    return read


def _finish_drains(
    rollout: Rollout, now: datetime, read: Callable[[], Reports], report: ReconcileReport,
    epoch: int | None,
) -> int:  # fmt: skip
    stopped = 0
    for replica in list(rollout.draining):
        verdict = drain_verdict(replica, now, rollout.profile.drain_timeout, read)
        if verdict is None:
            continue
        why = f"replaced by a replica with {rollout.profile}'s current settings; {verdict}"
        with transaction.atomic():
            if stop_replica(replica, why, actor=RECONCILER, epoch=epoch):
                report.stopping.append(str(replica.id))
                stopped += 1
        rollout.draining.remove(replica)
    return stopped


def drain_verdict(
    replica: Replica, now: datetime, timeout: int, read: Callable[[], Reports]
) -> str | None:
    """Why a draining replica's drain is over, or None while it must go on.

    Over when every router reported after the drain began, none routes the replica any
    more and none carries a request to it; or when ``timeout`` seconds have passed,
    whatever they say (a router that cannot reach Redis must not hold a rollout forever).
    """
    assert replica.draining_since is not None
    elapsed = now - replica.draining_since
    key = str(replica.id)
    if elapsed >= timedelta(seconds=timeout):
        reports = read()
        if reports is None:
            return f"drain_timeout of {timeout}s passed (the routers' reports could not be read)"
        carried = sum(r["inflight"].get(key, 0) for r in reports)
        left = f" with {carried} request(s) still in flight" if carried else ""
        return f"drain_timeout of {timeout}s passed{left}"
    if elapsed < MIN_DRAIN:
        return None
    reports = read()
    if reports is None:
        return None
    since = replica.draining_since.timestamp()
    for router in reports:
        if router["at"] <= since or key in router["routed"] or router["inflight"].get(key):
            return None
    return f"drained: no router routes it or carries a request to it ({len(reports)} reporting)"


def _retire_unstarted(rollout: Rollout, report: ReconcileReport, epoch: int | None) -> None:
    # Stale replicas not yet placed hold nothing and serve nothing: they go at once.
    for replica in [r for r in rollout.stale if r.state in ReplicaState.UNPLACED]:
        why = f"stale: {rollout.profile} changed before this replica started"
        with transaction.atomic():
            if stop_replica(replica, why, actor=RECONCILER, epoch=epoch):
                report.stopping.append(str(replica.id))
        rollout.stale.remove(replica)


def _surge(rollout: Rollout, report: ReconcileReport) -> None:
    profile = rollout.profile
    most = profile.replicas + profile.rollout_surge
    while rollout.live < most and len(rollout.up_to_date) < profile.replicas:
        why = f"replaces a stale replica of {profile} (rolling restart)"
        replica = create_replica(profile, why, actor=RECONCILER)
        report.created.append(str(replica.id))
        rollout.up_to_date.append(replica)


def _drain(rollout: Rollout, now: datetime, report: ReconcileReport) -> None:
    ready_stale = [r for r in rollout.stale if r.state == ReplicaState.READY]
    for replica in ready_stale[: max(0, rollout.drainable())]:
        because = f"to be replaced by {rollout.profile}'s current settings"
        if drain_replica(replica, now, rollout.profile, because, actor=RECONCILER):
            report.draining.append(str(replica.id))
            rollout.stale.remove(replica)
            rollout.draining.append(replica)


def rollout_status(model_name: str) -> list[dict[str, Any]]:
    """Each profile's rollout of ``model_name`` as ``llmgw_ctl rollout status`` shows it."""
    found = rollouts(model_name)
    reports = read_inflight_reports() if any(r.draining for r in found) else []
    rows = []
    for rollout in found:
        profile = rollout.profile
        replicas = []
        for replica in rollout.up_to_date + rollout.stale + rollout.draining:
            item: dict[str, Any] = {
                "id": str(replica.id),
                "state": replica.state,
                "up_to_date": replica in rollout.up_to_date,
                "draining_since": replica.draining_since,
            }
            if replica.draining_since is not None:
                item["in_flight"] = (
                    None
                    if reports is None
                    else sum(r["inflight"].get(str(replica.id), 0) for r in reports)
                )
            replicas.append(item)
        rows.append(
            {
                "profile": profile.name,
                "wanted": profile.replicas,
                "fingerprint": rollout.fingerprint,
                "up_to_date": len(rollout.up_to_date),
                "up_to_date_ready": sum(
                    1 for r in rollout.up_to_date if r.state == ReplicaState.READY
                ),
                "stale": len(rollout.stale) + len(rollout.draining),
                "draining": len(rollout.draining),
                "paused": rollout.paused,
                "surge": profile.rollout_surge,
                "unavailable": profile.rollout_unavailable,
                "drain_timeout": profile.drain_timeout,
                "waiting": rollout.waiting(),
                "replicas": replicas,
            }
        )
    return rows
