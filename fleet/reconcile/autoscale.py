"""Replicas that follow demand: the wanted count of an autoscaled profile, pass by pass.

Demand is what the routers report: requests in flight to the profile's replicas and
requests waiting for one. Up as soon as the demand per replica passes the target; down
only after it stayed below for ``scale_down_after``, one step at a time, never past the
bounds. At zero, one waiting request is enough to ask for a replica.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from audit.actors import RECONCILER
from protocol.routing import INFLIGHT_REPORT_TTL
from protocol.units import format_duration


@dataclass(frozen=True)
class AutoscalePolicy:
    """A profile's ``autoscale:``, as validated by the catalog."""

    min: int
    max: int
    target_inflight: float
    scale_down_after: int  # seconds

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AutoscalePolicy:
        return cls(int(data["min"]), int(data["max"]), float(data["target_inflight"]),
                   int(data["scale_down_after"]))  # fmt: skip


@dataclass(frozen=True)
class Step:
    """What one pass decided: the wanted count, why (empty: unchanged), and since when
    demand has been below what the current count needs (None: it is not)."""

    wanted: int
    reason: str
    low_since: datetime | None


def next_step(
    policy: AutoscalePolicy,
    wanted: int,
    demand: float,
    low_since: datetime | None,
    now: datetime,
) -> Step:
    """The wanted count for ``demand`` (requests in flight and waiting, over all routers)."""
    bounded = min(max(wanted, policy.min), policy.max)
    if bounded != wanted:
        return Step(bounded, f"scaled {wanted} → {bounded}: outside {policy.min}..{policy.max}",
                    None)  # fmt: skip
    needed = min(max(math.ceil(demand / policy.target_inflight), policy.min), policy.max)
    per_replica = demand / max(wanted, 1)
    target = _count(policy.target_inflight)
    if needed > wanted:
        if wanted == 0:
            why = f"{_count(demand)} request(s) waiting"
        else:
            why = f"{per_replica:.1f} in flight per replica, target {target}"
        return Step(needed, f"scaled {wanted} → {needed}: {why}", None)
    if needed == wanted:
        return Step(wanted, "", None)
    low_since = low_since or now
    if now - low_since < timedelta(seconds=policy.scale_down_after):
        return Step(wanted, "", low_since)
    idle = format_duration(policy.scale_down_after)
    if demand == 0:
        why = f"idle for {idle}"
    else:
        why = f"{per_replica:.1f} in flight per replica, under target {target} for {idle}"
    # One step down; the next waits out a whole scale_down_after again.
    return Step(wanted - 1, f"scaled {wanted} → {wanted - 1}: {why}", now)


def _count(value: float) -> str:
    return f"{value:g}"


def demand_by_model(reports: list[dict[str, Any]], now: datetime) -> dict[str, float]:
    """Requests in flight and waiting per model, over every router that reported lately."""
    demand: dict[str, float] = {}
    for report in reports:
        if now.timestamp() - report["at"] > INFLIGHT_REPORT_TTL:
            continue  # a router that stopped: what it carried is gone with it
        for model, counts in report.get("models", {}).items():
            demand[model] = demand.get(model, 0) + counts["inflight"] + counts["queued"]
    return demand


def autoscale_profiles(
    now: datetime, read_reports: Callable[[], list[dict[str, Any]] | None]
) -> list[str]:
    """Set each autoscaled profile's wanted count from the routers' reports; return why
    each count changed. Without reports (Redis unreadable) demand is unknown: no change."""
    from catalog.actions.profiles import mark_low_demand_since, scale_profile
    from catalog.models import Profile

    profiles = list(Profile.objects.exclude(autoscale=None).select_related("model"))
    reports = read_reports() if profiles else None  # no Redis scan for fixed counts
    if reports is None:
        return []
    demand = demand_by_model(reports, now)
    changed = []
    for profile in profiles:
        step = next_step(
            AutoscalePolicy.from_dict(profile.autoscale or {}), profile.replicas,
            demand.get(profile.model.name, 0.0), profile.autoscale_low_since, now,
        )  # fmt: skip
        if step.wanted != profile.replicas:
            scale_profile(profile.id, step.wanted, why=step.reason, actor=RECONCILER)
            changed.append(f"{profile}: {step.reason}")
        if step.low_since != profile.autoscale_low_since:
            mark_low_demand_since(profile.id, step.low_since, actor=RECONCILER)
    return changed
