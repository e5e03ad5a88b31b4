"""The autoscaler's decision, pass by pass, with the clock moved by the test."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet.reconcile.autoscale import AutoscalePolicy, next_step
from tests.factories import SETUP

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


CATALOG = """
models:
  - name: gemma
    source: /models/gemma.gguf
    profiles:
      - name: cpu
        engine: llama.cpp
        replicas: 3
        autoscale: {min: 0, max: 4, target_inflight: 2, scale_down_after: 1m}
"""


@pytest.mark.django_db
def test_an_autoscaled_profile_starts_at_min_and_apply_leaves_its_count_alone():
    from catalog.actions.entries import apply_catalog
    from catalog.actions.profiles import scale_profile
    from catalog.models import Profile

    apply_catalog(CATALOG, actor=SETUP)
    profile = Profile.objects.get()
    assert profile.replicas == 0
    assert profile.autoscale == {"min": 0, "max": 4, "target_inflight": 2.0,
                                 "scale_down_after": 60}  # fmt: skip
    scale_profile(profile.id, 2, why="scaled 0 → 2: 4 request(s) waiting", actor=SETUP)
    assert (
        apply_catalog(CATALOG, actor=SETUP) == []
    )  # the count is the autoscaler's, not the file's
    changed = apply_catalog(
        CATALOG.replace("scale_down_after: 1m", "scale_down_after: 2m"), actor=SETUP
    )
    assert [c.kind for c in changed] == ["profile"]
    assert Profile.objects.get().replicas == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("autoscale", "message"),
    [
        ("{min: 3, max: 2}", "min 3 is more than max 2; make min at most max"),
        ("{max: 2, target_inflight: 0}", "0 cannot be a target"),
        ("{min: -1, max: 2}", "greater than or equal to 0"),
        ("{min: 0}", "max"),
        ("{max: 2, scale_down_after: soon}", "'soon' is not a duration"),
    ],
    ids=["min-over-max", "zero-target", "negative-min", "no-max", "bad-duration"],
)
def test_a_bad_autoscale_is_refused_naming_the_field(autoscale, message):
    from catalog.actions.entries import apply_catalog
    from catalog.models import Profile
    from catalog.schema import CatalogError

    bad = CATALOG.replace("{min: 0, max: 4, target_inflight: 2, scale_down_after: 1m}", autoscale)
    with pytest.raises(CatalogError) as refused:
        apply_catalog(bad, actor=SETUP)
    problems = " ".join(refused.value.problems)
    assert "autoscale" in problems and message in problems
    assert not Profile.objects.exists()


@pytest.mark.django_db
def test_the_reconciler_scales_by_what_the_routers_report(django_capture_on_commit_callbacks):
    from audit.models import Event
    from catalog.actions.entries import apply_catalog
    from catalog.models import Profile
    from fleet.reconcile.autoscale import autoscale_profiles

    apply_catalog(CATALOG, actor=SETUP)
    report = {"at": T0.timestamp(), "routed": [], "inflight": {},
              "models": {"gemma": {"inflight": 0, "queued": 5}}}  # fmt: skip
    stale = {**report, "at": T0.timestamp() - 60}  # a router that stopped long ago
    with django_capture_on_commit_callbacks(execute=True):
        changed = autoscale_profiles(T0, lambda: [report, stale])
    assert changed == ["gemma/cpu: scaled 0 → 3: 5 request(s) waiting"]
    assert Profile.objects.get().replicas == 3
    assert Event.objects.filter(reason="scaled 0 → 3: 5 request(s) waiting").exists()
    # Redis unreadable: demand is unknown, and nothing changes.
    assert autoscale_profiles(T0, lambda: None) == []
    # Quiet: the wait starts, then one step down once it has lasted.
    quiet = {**report, "models": {}}
    assert autoscale_profiles(T0, lambda: [quiet]) == []
    assert Profile.objects.get().autoscale_low_since == T0
    later = T0 + timedelta(minutes=1)
    assert autoscale_profiles(later, lambda: [{**quiet, "at": later.timestamp()}]) == [
        "gemma/cpu: scaled 3 → 2: idle for 1m"
    ]


@pytest.mark.django_db
def test_the_last_scaling_shows_in_status_and_on_the_model_page(client, reader):
    import json
    from io import StringIO

    from django.core.management import call_command

    from catalog.actions.entries import apply_catalog
    from catalog.actions.profiles import scale_profile
    from catalog.models import Profile

    apply_catalog(CATALOG, actor=SETUP)
    profile = Profile.objects.get()
    scale_profile(profile.id, 1, why="scaled 0 → 1: 1 request(s) waiting", actor=SETUP)
    scale_profile(
        profile.id, 2, why="scaled 1 → 2: 9.5 in flight per replica, target 2", actor=SETUP
    )
    out = StringIO()
    call_command("llmgw_ctl", "status", stdout=out)
    assert "autoscaled gemma/cpu: scaled 1 → 2: 9.5 in flight per replica, target 2" in (
        out.getvalue()
    )
    out = StringIO()
    call_command("llmgw_ctl", "status", "--json", stdout=out)
    [model] = json.loads(out.getvalue())["models"]
    assert model["scaling"] == ["gemma/cpu: scaled 1 → 2: 9.5 in flight per replica, target 2"]
    client.force_login(reader)
    page = client.get("/models/gemma/").content.decode()
    assert "follows demand: 0 to 4 replicas" in page
    assert "last: scaled 1 → 2: 9.5 in flight per replica, target 2" in page


@pytest.mark.django_db
def test_the_api_refuses_a_bad_autoscale_naming_the_field(api_client, operator):
    from tests.factories import make_model

    make_model("gemma")
    api_client.force_authenticate(operator)
    body = {"model": "gemma", "name": "cpu", "engine": "llama.cpp",
            "autoscale": {"min": 3, "max": 2}}  # fmt: skip
    refused = api_client.post("/api/v1/profiles/", body, format="json")
    assert refused.status_code == 400
    assert refused.json()["autoscale"] == ["min 3 is more than max 2; make min at most max"]
    body["autoscale"] = {"min": 0, "max": 2, "scale_down_after": "90s"}
    created = api_client.post("/api/v1/profiles/", body, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["autoscale"]["scale_down_after"] == 90
