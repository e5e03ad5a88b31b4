"""Rolling restarts of stale profiles, pass by pass, against real PostgreSQL and Redis.

Each test drives the reconciler's passes directly with an injected clock, plays the
agents' part by reporting shards ready or stopped, and plays the routers' part by
writing their in-flight reports into Redis as a router process would.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from io import StringIO

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from audit.actors import AGENT_LINK
from audit.models import Event
from catalog.actions.entries import apply_catalog
from catalog.actions.profiles import pause_rollout, resume_rollout
from catalog.models import Model, Profile
from fleet.actions.reports import register_node
from fleet.actions.shard_reports import record_shard_status
from fleet.models import Replica, Shard
from fleet.reconcile.passes import reconcile
from fleet.reconcile.rollout import rollout_status
from fleet.routing_table import routing_snapshot
from protocol import messages
from protocol.engines import EngineInstall
from protocol.routing import INFLIGHT_KEY_PREFIX, RoutingSnapshot
from router.balance.balancer import Balancer
from router.balance.inflight import inflight_report
from router.table.routes import RoutingTable
from tests.factories import SETUP
from tests.fleet.inventories import inventory
from tests.fleet.queues import broker, queued_commands

pytestmark = pytest.mark.django_db

LIVE = ("placing", "unplaceable", "starting", "ready", "failed")


def catalog(replicas=2, args=("--threads", "1"), **profile_fields) -> str:
    profile = {"name": "cpu", "engine": "llama.cpp", "replicas": replicas, "gpus_per_rank": 1,
               "args": list(args), **profile_fields}  # fmt: skip
    return yaml.safe_dump(
        {"models": [{"name": "gemma", "source": "/models/gemma.gguf", "profiles": [profile]}]}
    )


def connect(node_id: str, gpus: int) -> None:
    register = messages.Register(
        inventory=inventory(node_id, gpus=gpus),
        engines_probed=True,
        engines=[EngineInstall(engine="llama.cpp", version="b6000")],
    )
    register_node(node_id, register, actor=AGENT_LINK)


@pytest.fixture
def routers():
    """Write in-flight reports as router processes do; every key is removed afterwards."""
    written: list[str] = []

    def report(at: datetime, routed=(), inflight=None, router_id: str | None = None) -> None:
        key = INFLIGHT_KEY_PREFIX + (router_id or f"test-{uuid.uuid4().hex[:8]}")
        body = {"at": at.timestamp(), "routed": [str(r) for r in routed],
                "inflight": {str(k): v for k, v in (inflight or {}).items()}}  # fmt: skip
        broker().set(key, json.dumps(body), ex=60)
        written.append(key)

    yield report
    if written:
        broker().delete(*written)


class Fleet:
    """The reconciler's passes with a clock the test moves, and the agents' reports."""

    def __init__(self, capture, node_id: str) -> None:
        self.capture = capture
        self.node_id = node_id
        self.now = timezone.now()

    def run(self, seconds: float = 0):
        self.now += timedelta(seconds=seconds)
        with self.capture(execute=True):
            return reconcile(now=self.now)

    def report(self, replica: Replica, state: str) -> None:
        with self.capture(execute=True):
            for shard in Shard.objects.filter(replica=replica).exclude(node=None):
                record_shard_status(
                    shard.node_id,
                    messages.ShardStatus(shard_id=shard.id, state=state),
                    actor=AGENT_LINK,
                )

    def start_all(self) -> None:
        """Every starting replica's engines answer; every stopping replica's engines exit."""
        for replica in Replica.objects.filter(state="starting"):
            self.report(replica, "ready")
        for replica in Replica.objects.filter(state="stopping"):
            self.report(replica, "stopped")


@pytest.fixture
def fleet(node_ids, django_capture_on_commit_callbacks):
    # A router process of an earlier test may have left its report for a few seconds.
    leftover = broker().keys(INFLIGHT_KEY_PREFIX + "*")
    if leftover:
        broker().delete(*leftover)

    def make(gpus: int) -> Fleet:
        connect(node_ids[0], gpus)
        return Fleet(django_capture_on_commit_callbacks, node_ids[0])

    return make


def fingerprint() -> str:
    return Profile.objects.get().fingerprint()


def fresh(state: str | None = None) -> list[Replica]:
    replicas = Replica.objects.filter(fingerprint=fingerprint(), state__in=LIVE)
    return list(replicas.filter(state=state) if state else replicas)


def stale(*states: str) -> list[Replica]:
    replicas = Replica.objects.exclude(fingerprint=fingerprint())
    return list(replicas.filter(state__in=states or LIVE))


def serving() -> set[str]:
    """The replicas routers would send requests to, from the table they load."""
    [model] = routing_snapshot().models
    return {endpoint.replica for endpoint in model.endpoints}


def serving_old_replicas(fleet, gpus=3, replicas=2, **rollout) -> Fleet:
    f = fleet(gpus)
    apply_catalog(catalog(replicas=replicas, **rollout), actor=SETUP)
    f.run()
    f.start_all()
    assert len(serving()) == replicas
    apply_catalog(catalog(replicas=replicas, args=("--threads", "2"), **rollout), actor=SETUP)
    return f


def test_a_new_replica_is_ready_before_an_old_one_leaves_the_table(fleet):
    f = serving_old_replicas(fleet)
    old = {str(r.id) for r in stale()}
    report = f.run()
    [new] = fresh()
    assert report.created == [str(new.id)] and new.state == "starting"
    # scale() does not take the surge replica for a surplus, nor touch the old ones.
    f.run()
    assert fresh() == [new] and len(stale("ready")) == 2 and serving() == old
    assert not [c for c in queued_commands(f.node_id) if c[0] == "agent.stop_shard"]

    f.report(new, "ready")
    report = f.run()
    [draining] = [r for r in stale() if r.draining_since]
    assert report.draining == [str(draining.id)] and draining.state == "ready"
    # Out of the table at once, still running until its requests are done.
    assert serving() == (old - {str(draining.id)}) | {str(new.id)}
    assert not Replica.objects.filter(state="stopping").exists()


def test_the_rollout_completes_one_at_a_time_never_below_the_wanted_ready(fleet):
    f = serving_old_replicas(fleet)
    fewest_serving, most_live = 2, 2
    for _ in range(20):
        f.run(seconds=3)
        f.start_all()
        fewest_serving = min(fewest_serving, len(serving()))
        most_live = max(most_live, Replica.objects.filter(state__in=LIVE).count())
        if len(fresh("ready")) == 2 and not stale():
            break
    assert len(fresh("ready")) == 2 and not stale()
    assert fewest_serving == 2 and most_live == 3  # surge 1, unavailable 0
    assert Event.objects.filter(subject="gemma/cpu", reason__startswith="rollout finished").exists()


@pytest.mark.parametrize(
    ("replicas", "gpus", "surge", "unavailable"),
    [(3, 4, 1, 0), (3, 3, 0, 1), (3, 5, 2, 0), (3, 4, 1, 2), (1, 1, 1, 1)],
    ids=["surge-1", "in-place-1", "surge-2", "surge-1-unavailable-2", "single-in-place"],
)
def test_rollout_bounds_hold_for_every_setting(fleet, replicas, gpus, surge, unavailable):
    f = serving_old_replicas(
        fleet, gpus=gpus, replicas=replicas, rollout={"surge": surge, "unavailable": unavailable}
    )
    fewest_serving, most_live = replicas, replicas
    for _ in range(30):
        f.run(seconds=3)
        f.start_all()
        fewest_serving = min(fewest_serving, len(serving()))
        most_live = max(most_live, Replica.objects.filter(state__in=LIVE).count())
        if len(fresh("ready")) == replicas and not stale():
            break
    assert len(fresh("ready")) == replicas and not stale()
    assert fewest_serving >= replicas - unavailable
    assert most_live <= replicas + surge


def _draining_old_replica(fleet) -> tuple[Fleet, Replica, datetime]:
    f = serving_old_replicas(fleet, gpus=2, replicas=1)
    f.run()
    f.start_all()
    f.run()
    [old] = stale()
    assert old.draining_since is not None
    return f, old, old.draining_since


def test_a_drain_waits_for_requests_the_routers_still_carry(fleet, routers):
    f, old, since = _draining_old_replica(fleet)
    routers(since + timedelta(seconds=1), router_id="a", inflight={old.id: 2})
    f.run(seconds=3)
    assert Replica.objects.get(id=old.id).state == "ready"
    # Its requests are done, but this router is still on a table that routes the replica.
    routers(since + timedelta(seconds=3), router_id="a", routed=[old.id])
    f.run(seconds=1)
    assert Replica.objects.get(id=old.id).state == "ready"
    # A report from before the drain began says nothing about the table since.
    routers(since - timedelta(seconds=1), router_id="a")
    f.run(seconds=1)
    assert Replica.objects.get(id=old.id).state == "ready"
    routers(since + timedelta(seconds=4), router_id="a")
    routers(since + timedelta(seconds=4), router_id="b", inflight={uuid.uuid4(): 3})
    f.run(seconds=1)
    old.refresh_from_db()
    assert old.state == "stopping"
    assert "drained" in old.reasons[0]


def test_a_drain_lasts_long_enough_for_every_router_to_have_reported(fleet):
    f, old, _since = _draining_old_replica(fleet)
    # No router has reported yet: one that reloaded a moment ago writes within a second.
    f.run(seconds=1)
    assert Replica.objects.get(id=old.id).state == "ready"
    f.run(seconds=1.5)
    assert Replica.objects.get(id=old.id).state == "stopping"


def test_a_drain_ends_at_the_drain_timeout_with_requests_still_in_flight(fleet, routers):
    f, old, since = _draining_old_replica(fleet)
    routers(since + timedelta(seconds=29), inflight={old.id: 1})
    f.run(seconds=29)
    assert Replica.objects.get(id=old.id).state == "ready"
    f.run(seconds=2)
    old.refresh_from_db()
    assert old.state == "stopping"
    assert "drain_timeout of 30s" in old.reasons[0] and "1 request" in old.reasons[0]


def test_without_redis_a_drain_waits_the_whole_drain_timeout(fleet):
    f, old, _since = _draining_old_replica(fleet)
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):  # nothing listens there
        f.run(seconds=10)
        assert Replica.objects.get(id=old.id).state == "ready"
        f.run(seconds=21)
        assert Replica.objects.get(id=old.id).state == "stopping"


def test_a_paused_rollout_stays_put_until_resumed(fleet, operator):
    f = fleet(2)
    apply_catalog(catalog(replicas=1), actor=SETUP)
    f.run()
    f.start_all()
    assert pause_rollout("gemma", actor=operator)
    assert not pause_rollout("gemma", actor=SETUP)  # already paused
    apply_catalog(catalog(replicas=1, args=("--threads", "2")), actor=SETUP)
    assert Model.objects.get(name="gemma").rollout_paused  # apply does not unpause
    for _ in range(3):
        f.run(seconds=3)
    assert not fresh() and len(stale("ready")) == 1
    [status] = rollout_status("gemma")
    assert status["paused"] and status["stale"] == 1
    event = Event.objects.get(subject="gemma", reason="rollout paused")
    assert event.actor == operator and event.description == "rollout paused by olga"

    assert resume_rollout("gemma", actor=operator)
    f.run()
    assert len(fresh()) == 1


def test_no_room_for_a_surge_waits_and_says_why_once(fleet):
    f = serving_old_replicas(fleet, gpus=1, replicas=1)
    for _ in range(4):
        f.run(seconds=3)
        f.start_all()
    [old] = stale()
    assert old.state == "ready" and old.draining_since is None  # the only replica serves on
    [waiting] = Event.objects.filter(subject="gemma/cpu", reason__startswith="waiting:")
    assert waiting.reason.startswith(
        "waiting: no room to start a new replica of gemma/cpu beside the 1 running "
        "(placement: 0/1 nodes available"
    )
    assert waiting.reason.endswith("raise rollout.unavailable to replace in place, or free a node")
    [status] = rollout_status("gemma")
    assert status["waiting"] == waiting.reason


def test_unavailable_one_replaces_the_only_replica_in_place(fleet):
    f = serving_old_replicas(fleet, gpus=1, replicas=1, rollout={"unavailable": 1})
    f.run()
    [old] = stale()
    assert old.draining_since is not None and serving() == set()
    for _ in range(6):
        f.run(seconds=3)
        f.start_all()
    assert not stale() and len(fresh("ready")) == 1


def test_rollout_ctl_status_pause_resume_and_unknown_model(fleet):
    f = serving_old_replicas(fleet)
    f.run()
    f.start_all()
    f.run()

    def ctl(*args: str) -> str:
        out = StringIO()
        call_command("llmgw_ctl", "rollout", *args, stdout=out)
        return out.getvalue()

    lines = ctl("status", "gemma").splitlines()
    assert lines[0].split()[:6] == ["PROFILE", "WANTED", "UP-TO-DATE", "STALE", "DRAINING",
                                    "PAUSED"]  # fmt: skip
    assert lines[1].split()[:6] == ["cpu", "2", "1", "2", "1", "no"]
    [row] = json.loads(ctl("status", "gemma", "--json"))
    assert (row["profile"], row["wanted"], row["up_to_date_ready"]) == ("cpu", 2, 1)
    assert (row["stale"], row["draining"], row["paused"]) == (2, 1, False)
    assert ctl("pause", "gemma").strip() == "rollout of gemma paused"
    assert ctl("pause", "gemma").strip() == "rollout of gemma was already paused"
    assert json.loads(ctl("status", "gemma", "--json"))[0]["paused"] is True
    assert ctl("resume", "gemma").strip() == "rollout of gemma resumed"
    with pytest.raises(CommandError, match=r"no model 'ghost' \(models: gemma\)"):
        ctl("status", "ghost")


def test_a_router_reports_what_it_routes_and_carries():
    table = RoutingTable.from_snapshot(RoutingSnapshot.model_validate(
        {"models": [{"name": "gemma", "endpoints": [
            {"replica": "r1", "url": "http://10.0.0.1:20000", "secret": ""},
            {"replica": "r2", "url": "http://10.0.0.1:20001", "secret": ""},
        ]}]}
    ))  # fmt: skip
    balancer = Balancer()
    balancer.started("r1")
    balancer.started("r1")
    balancer.started("gone")  # left the table, still streaming
    balancer.started("r2")
    balancer.finished("r2", ok=True)
    report = inflight_report(table, balancer, now=1234.5, queued={"gemma": 3})
    assert report == {
        "at": 1234.5, "routed": ["r1", "r2"], "inflight": {"r1": 2, "gone": 1}, "failing": [],
        "models": {"gemma": {"inflight": 2, "queued": 3}},
    }  # fmt: skip
