"""The autoscaler's decision, pass by pass, with the clock moved by the test."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet.autoscale import AutoscalePolicy, next_step

POLICY = AutoscalePolicy(min=0, max=4, target_inflight=4, scale_down_after=300)
T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("wanted", "demand", "expected", "reason"),
    [
        (0, 1, 1, "scaled 0 → 1: 1 request(s) waiting"),
        (1, 9.5, 3, "scaled 1 → 3: 9.5 in flight per replica, target 4"),
        (2, 40, 4, "scaled 2 → 4: 20.0 in flight per replica, target 4"),
        (2, 8, 2, ""),
        (4, 16, 4, ""),
    ],
    ids=["from-zero", "up", "up-to-max", "steady", "at-max"],
)
def test_up_as_soon_as_demand_passes_the_target(wanted, demand, expected, reason):
    step = next_step(POLICY, wanted, demand, None, T0)
    assert (step.wanted, step.reason, step.low_since) == (expected, reason, None)


def test_down_only_after_demand_stayed_low_one_step_at_a_time():
    step = next_step(POLICY, 3, 2, None, T0)
    assert (step.wanted, step.low_since) == (3, T0)
    step = next_step(POLICY, 3, 2, step.low_since, T0 + timedelta(seconds=299))
    assert step.wanted == 3
    step = next_step(POLICY, 3, 2, step.low_since, T0 + timedelta(seconds=300))
    assert step.wanted == 2
    assert step.reason == "scaled 3 → 2: 0.7 in flight per replica, under target 4 for 5m"
    # The next step down waits a whole scale_down_after again.
    again = next_step(POLICY, 2, 0, step.low_since, T0 + timedelta(seconds=301))
    assert again.wanted == 2
    later = next_step(POLICY, 2, 0, again.low_since, T0 + timedelta(seconds=600))
    assert (later.wanted, later.reason) == (1, "scaled 2 → 1: idle for 5m")


def test_a_burst_while_low_resets_the_wait():
    step = next_step(POLICY, 2, 1, None, T0)
    assert step.low_since == T0
    busy = next_step(POLICY, 2, 8, step.low_since, T0 + timedelta(seconds=200))
    assert (busy.wanted, busy.low_since) == (2, None)


def test_never_below_min_or_above_max():
    policy = AutoscalePolicy(min=1, max=2, target_inflight=1, scale_down_after=60)
    assert next_step(policy, 0, 0, None, T0).wanted == 1
    assert next_step(policy, 5, 0, None, T0).reason == "scaled 5 → 2: outside 1..2"
    low = next_step(policy, 1, 0, T0 - timedelta(hours=1), T0)
    assert low.wanted == 1 and low.reason == ""
