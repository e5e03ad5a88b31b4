"""Replicas that follow demand: the wanted count of an autoscaled profile, pass by pass.

Demand is what the routers report: requests in flight to the profile's replicas and
requests waiting for one. Up as soon as the demand per replica passes the target; down
only after it stayed below for ``scale_down_after``, one step at a time, never past the
bounds. At zero, one waiting request is enough to ask for a replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

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
