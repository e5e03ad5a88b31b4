"""Usage and cost per team: `llmgw_ctl usage --by team [--cost]`, and the cost split
(node-seconds by tokens served each hour, idle hours to the owning team) on real rows."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
from django.core.management import CommandError
from django.utils import timezone

from audit.models import Event, EventKind
from catalog.models import ApiKey
from catalog.teams.actions import create_team, open_model
from core.env import env_decimal
from fleet.models import Replica
from router.models import Usage
from router.usage.cost import Prices, team_costs, to_cents
from tests.ctl import ctl
from tests.factories import SETUP, make_model, make_node, make_profile, make_replica, make_shard

pytestmark = pytest.mark.django_db

HOUR0 = datetime(2026, 1, 5, 10, tzinfo=UTC)


@pytest.fixture
def teams(db):
    red, blue = create_team("red", actor=SETUP), create_team("blue", actor=SETUP)
    ApiKey.objects.create(name="red-svc", prefix="llmgw-red1", hashed_key="x", team=red)
    ApiKey.objects.create(name="blue-svc", prefix="llmgw-blu1", hashed_key="y", team=blue)
    return red, blue


def spend(hour, prefix, model, prompt, completion, requests=1):
    Usage.objects.create(hour=hour, key_name=prefix, key_prefix=prefix, model=model,
                         requests=requests, prompt_tokens=prompt,
                         completion_tokens=completion)  # fmt: skip


def one_gpu_replica_spent_on_this_hour(prefix: str, started_hours_ago: int) -> None:
    """gemma on one GPU since then, and 14 tokens of the key's in the hour now running."""
    now = timezone.now()
    replica = make_replica(make_profile(make_model("gemma")), state="ready")
    make_shard(replica, node=make_node("gpu01"), gpus=[0])
    ran(replica, (now - timedelta(hours=started_hours_ago), "starting"))
    spend(now.replace(minute=0, second=0, microsecond=0), prefix, "gemma", 7, 7)


def ran(replica, *steps):
    """The replica's transitions, as the audit log records them, at the given times."""
    for at, state in steps:
        event = Event.objects.create(kind=EventKind.REPLICA, subject=str(replica.id),
                                     to_state=state)  # fmt: skip
        Event.objects.filter(pk=event.pk).update(at=at)


def test_usage_by_team_joins_keys_to_teams_by_prefix(teams):
    this_hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    spend(this_hour, "llmgw-red1", "gemma", 30, 10, requests=3)
    spend(this_hour - timedelta(hours=1), "llmgw-red1", "smol", 5, 5)
    spend(this_hour, "llmgw-blu1", "gemma", 4, 4, requests=2)
    spend(this_hour, "llmgw-gone", "gemma", 1, 1)  # a key deleted since
    rows = {r["team"]: r for r in json.loads(ctl("usage", "--by", "team", "--json"))}
    assert rows["red"] == {"team": "red", "requests": 4, "prompt_tokens": 35,
                           "completion_tokens": 15, "tokens": 50}  # fmt: skip
    assert rows["blue"]["tokens"] == 8 and rows["unassigned"]["tokens"] == 2
    table = ctl("usage", "--by", "team")
    assert table.splitlines()[1].split()[:2] == ["red", "4"]  # most tokens first
    with pytest.raises(CommandError, match="--cost goes with --by team"):
        ctl("usage", "--cost")


def test_cents_add_up_to_the_rounded_total():
    third = Fraction(1, 3)
    cents = to_cents({"a": third, "b": third, "c": third})
    assert sorted(cents.values()) == [Decimal("0.33"), Decimal("0.33"), Decimal("0.34")]
    assert sum(cents.values()) == Decimal("1.00")
    assert to_cents({}) == {}


def test_a_replicas_gpu_hours_split_by_tokens_and_idle_hours_go_to_the_owner(teams):
    gemma = make_model("gemma")
    open_model("gemma", ["red"], actor=SETUP)  # red owns it
    replica = make_replica(make_profile(gemma, name="gpu"), state="stopped")
    make_shard(replica, node=make_node("gpu01"), gpus=[0, 1])
    start = HOUR0 + timedelta(minutes=10)
    ran(replica, (start, "starting"), (start + timedelta(minutes=5), "ready"),
        (start + timedelta(hours=2), "stopping"),
        (start + timedelta(hours=2, seconds=1), "stopped"))  # fmt: skip
    spend(HOUR0, "llmgw-red1", "gemma", 200, 100)  # hour 0: red 3/4, blue 1/4
    spend(HOUR0, "llmgw-blu1", "gemma", 50, 50)  # hours 1 and 2: nobody, so idle
    report = team_costs(HOUR0, HOUR0 + timedelta(hours=6), Prices(gpu_hour=Decimal("1.00")))
    by_team = {t.team: t for t in report.teams}
    # 2 GPUs for 2 h 1 s: 50 min of hour 0 split 3:1, the rest idle, red's.
    assert report.fleet == Decimal("4.00")
    assert by_team["red"].served == Decimal("1.25") and by_team["blue"].served == Decimal("0.42")
    assert by_team["red"].idle == Decimal("2.33") and by_team["blue"].idle == 0
    assert report.adds_up
    assert by_team["red"].tokens == 300 and by_team["blue"].tokens == 100
    assert by_team["blue"].gpu_seconds == 1500  # a quarter of 2 x 50 min
    assert by_team["red"].gpu_seconds + by_team["blue"].gpu_seconds == 2 * (7200 + 1)


def test_cpu_core_seconds_and_a_model_open_to_all_go_unassigned_when_idle(teams):
    replica = make_replica(make_profile(make_model("smol")), state="ready")
    make_shard(replica, node=make_node("cpu01", inventory={"cpu": {"cores": 4}}))
    ran(replica, (HOUR0 - timedelta(hours=1), "starting"))  # still running
    spend(HOUR0 + timedelta(hours=1), "llmgw-blu1", "smol", 10, 0)
    report = team_costs(HOUR0, HOUR0 + timedelta(hours=3),
                        Prices(cpu_core_hour=Decimal("0.10")))  # fmt: skip
    by_team = {t.team: t for t in report.teams}
    assert report.fleet == Decimal("1.20")  # 4 cores x 3 h (the hour before is outside)
    assert by_team["blue"].served == Decimal("0.40") and by_team["blue"].core_seconds == 14400
    assert by_team["unassigned"].idle == Decimal("0.80")
    assert report.adds_up


def test_an_adapters_tokens_count_for_its_base_models_replica(teams):
    tuned = make_model("tuned", adapters=[{"name": "sql", "source": "/a.gguf"}])
    replica = make_replica(make_profile(tuned), state="ready")
    make_shard(replica, node=make_node("gpu02"), gpus=[0])
    ran(replica, (HOUR0, "starting"))
    spend(HOUR0, "llmgw-red1", "tuned:sql", 1, 1)
    report = team_costs(HOUR0, HOUR0 + timedelta(hours=1), Prices(gpu_hour=Decimal("3")))
    assert [(t.team, t.served, t.idle) for t in report.teams] == [
        ("red", Decimal("3.00"), Decimal("0.00"))
    ]


def test_usage_by_team_with_cost_says_the_sum_is_the_fleets(teams, settings):
    settings.COST_PER_GPU_HOUR = Decimal("2.50")
    one_gpu_replica_spent_on_this_hour("llmgw-red1", started_hours_ago=2)
    data = json.loads(ctl("usage", "--by", "team", "--cost", "--since", "1d", "--json"))
    assert data["adds_up"] is True and data["gpu_hour"] == "2.50"
    assert sum(Decimal(t["cost"]) for t in data["teams"]) == Decimal(data["fleet"])
    assert "(equal)" in ctl("usage", "--by", "team", "--cost")


def test_cost_without_prices_says_so(teams):
    assert "no prices set" in ctl("usage", "--by", "team", "--cost")


def test_prices_are_read_exact_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.setenv("LLMGW_COST_PER_GPU_HOUR", "2.10")
    assert env_decimal("LLMGW_COST_PER_GPU_HOUR") == Decimal("2.10")
    monkeypatch.delenv("LLMGW_COST_PER_GPU_HOUR")
    assert env_decimal("LLMGW_COST_PER_GPU_HOUR") == 0
    for bad in ("two", "-1", "NaN"):
        monkeypatch.setenv("LLMGW_COST_PER_GPU_HOUR", bad)
        with pytest.raises(ValueError, match="LLMGW_COST_PER_GPU_HOUR"):
            env_decimal("LLMGW_COST_PER_GPU_HOUR")


def test_the_cost_bench_adds_up_on_its_own_rows(capsys):
    from bench.cost import run

    assert run(6, seed=3, gpu_hour=Decimal("2.40"), cpu_core_hour=Decimal("0.03"))
    assert ": True; fleet = the bench's own count" in capsys.readouterr().out


def test_a_replica_stopped_before_the_window_costs_nothing_in_it(teams):
    replica = make_replica(make_profile(make_model("gemma")), state="stopped")
    make_shard(replica, node=make_node("gpu01"), gpus=[0])
    ran(replica, (HOUR0 - timedelta(hours=3), "starting"), (HOUR0 - timedelta(hours=1), "stopped"))
    Replica.objects.filter(pk=replica.pk).update(state_changed_at=HOUR0 - timedelta(hours=1))
    report = team_costs(HOUR0, HOUR0 + timedelta(hours=2), Prices(gpu_hour=Decimal("1")))
    assert report.fleet == 0 and report.teams == []
    earlier = team_costs(HOUR0 - timedelta(hours=4), HOUR0, Prices(gpu_hour=Decimal("1")))
    assert earlier.fleet == Decimal("2.00") and earlier.teams[0].team == "unassigned"


def test_a_running_replica_whose_events_are_gone_counts_from_its_last_start(teams):
    replica = make_replica(make_profile(make_model("gemma")), state="ready",
                           starting_since=HOUR0 + timedelta(minutes=30))  # fmt: skip
    make_shard(replica, node=make_node("gpu01"), gpus=[0, 1, 2, 3])
    report = team_costs(HOUR0, HOUR0 + timedelta(hours=1), Prices(gpu_hour=Decimal("1")))
    assert report.fleet == Decimal("2.00") and report.adds_up  # 4 GPUs for half an hour


def test_the_usage_page_shows_each_teams_cost_and_that_it_adds_up(client, reader, teams,
                                                                   settings):  # fmt: skip
    settings.COST_PER_GPU_HOUR = Decimal("1.00")
    one_gpu_replica_spent_on_this_hour("llmgw-blu1", started_hours_ago=30)
    client.force_login(reader)
    assert "teams=1#teams" in client.get("/usage/?days=7").content.decode()
    page = client.get("/usage/?days=7&teams=1").content.decode()
    assert 'data-team="blue"' in page and 'data-team="unassigned"' in page
    assert "cost for these days is 30.00" in page and "equal, to the cent" in page


def test_a_stretch_no_event_closed_ends_at_the_rows_last_change(teams):
    replica = make_replica(make_profile(make_model("gemma")), state="stopped")
    make_shard(replica, node=make_node("gpu01"), gpus=[0])
    ran(replica, (HOUR0, "starting"))
    Replica.objects.filter(pk=replica.pk).update(state_changed_at=HOUR0 + timedelta(hours=1))
    report = team_costs(HOUR0, HOUR0 + timedelta(hours=5), Prices(gpu_hour=Decimal("1")))
    assert report.fleet == Decimal("1.00")
