"""What the control loop reads does not grow with the fleet: a steady reconcile pass, the
routing snapshot, /metrics, the pages' model rows and a register make as many queries at
20 nodes as at 5, and read each node's reports (kilobytes of JSON a node) only where they
are used.

bench/reconcile_scale.py times the same steps at 2,000 nodes; these keep the shape.
"""

from __future__ import annotations

import gc
import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest

from audit.actors import AGENT_LINK
from catalog.models import Engine
from fleet import models
from fleet.actions.reports import link_node
from fleet.metrics import FleetCollector
from fleet.models import Node, ReplicaState, ShardState
from fleet.planning.shard_specs import MeetingPoints, shard_spec
from fleet.planning.snapshot import node_snapshots
from fleet.reconcile import engines as engine_orders
from fleet.reconcile.engines import engines_digest, tell_nodes_their_engines, wanted_engines
from fleet.reconcile.passes import reconcile
from fleet.routing_table import routing_snapshot
from fleet.selectors import model_rows
from protocol import messages
from protocol.engines import EngineInstall
from protocol.inventory import NodeUsage, ShardUsage
from tests.factories import make_model, make_node, make_profile, make_replica, make_shard
from tests.fleet.inventories import inventory
from tests.fleet.queues import broker

pytestmark = pytest.mark.django_db

INSTALLED = [EngineInstall(engine="llama.cpp", version="b6000").model_dump(mode="json")]
# A column only a node's register fills, selected whole: each row's JSON is decoded.
SELECTS_INVENTORY = re.compile(r'"fleet_node"\."inventory"(,| FROM)')


@pytest.fixture
def prefix():
    """Node ids of this test alone, and their queues in the shared Redis removed after."""
    prefix = f"s{uuid.uuid4().hex[:6]}-"
    yield prefix
    client = broker()
    queues = list(client.scan_iter(match=f"node-{prefix}*"))
    if queues:
        client.delete(*queues)


def grow(prefix: str, upto: int) -> None:
    """Nodes ``prefix``0..``upto``-1, each running a ready replica of its own model, heard
    now and told their engines; and one model no node can run (it waits, unplaceable)."""
    Engine.objects.get_or_create(name="llama.cpp", version="b6000")
    digest = engines_digest(wanted_engines())
    now = timezone.now()
    linked = now - timedelta(hours=1)  # told since they linked: not due
    have = Node.objects.filter(id__startswith=prefix).count()
    for n in range(have, upto):
        node_id = f"{prefix}{n}"
        facts = inventory(node_id, gpus=2, address=f"10.0.0.{n + 1}").model_dump(mode="json")
        node = make_node(
            node_id, address=f"10.0.0.{n + 1}", inventory=facts, engines=INSTALLED,
            registered_at=linked, last_heartbeat=now, engines_told=digest, engines_told_at=now,
        )  # fmt: skip
        profile = make_profile(make_model(f"{prefix}model-{n}"), memory=1 << 30)
        replica = make_replica(profile, state=ReplicaState.READY, engine="llama.cpp",
                               engine_version="b6000")  # fmt: skip
        shard = make_shard(replica, node=node, port=20000, state=ShardState.READY)
        node.usage = NodeUsage(
            cpu_percent=10, load=(1, 1, 1), memory_total=64 << 30, memory_used=8 << 30,
            memory_available=56 << 30, shards={shard.id: ShardUsage(cpu_cores=1, rss=1 << 30)},
        ).model_dump(mode="json")  # fmt: skip
        node.usage_reported_at = now
        node.save(update_fields=["usage", "usage_reported_at"])
    if not have:
        waiting = make_profile(make_model(f"{prefix}nowhere"), engine="sglang")
        make_replica(waiting, state=ReplicaState.UNPLACEABLE)


def queries(work, capture) -> list[str]:
    """The SQL of what ``work`` reads and writes, with what it sends on commit sent."""
    with capture(execute=True), CaptureQueriesContext(connection) as captured:
        work()
    return [query["sql"] for query in captured.captured_queries]


def at_5_and_20(prefix, work, capture) -> tuple[list[str], list[str]]:
    grow(prefix, 5)
    queries(work, capture)  # what a first run settles is not the steady state
    five = queries(work, capture)
    grow(prefix, 20)
    queries(work, capture)
    return five, queries(work, capture)


def steady_pass():
    report = reconcile()
    assert not (report.created or report.placed or report.stopping), report.summary()


def test_a_steady_pass_makes_as_many_queries_at_20_nodes_as_at_5(
    prefix, django_capture_on_commit_callbacks
):
    five, twenty = at_5_and_20(prefix, steady_pass, django_capture_on_commit_callbacks)

    assert len(twenty) == len(five), "\n".join(twenty)


def test_a_pass_decodes_the_nodes_reports_once_for_placement(
    prefix, django_capture_on_commit_callbacks
):
    grow(prefix, 5)

    sql = queries(steady_pass, django_capture_on_commit_callbacks)

    assert len([q for q in sql if SELECTS_INVENTORY.search(q)]) == 1


def test_the_routing_snapshot_makes_as_many_queries_at_20_nodes_as_at_5(
    prefix, django_capture_on_commit_callbacks
):
    five, twenty = at_5_and_20(prefix, routing_snapshot, django_capture_on_commit_callbacks)

    assert len(twenty) == len(five)
    assert not [q for q in twenty if SELECTS_INVENTORY.search(q)], "rank 0's node read whole"
    served = {m.name: m for m in routing_snapshot().models}
    assert served[f"{prefix}model-19"].endpoints[0].url == "http://10.0.0.20:20000"


def test_metrics_make_as_many_queries_at_20_nodes_as_at_5(
    prefix, django_capture_on_commit_callbacks
):
    def scrape():
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FleetCollector())
        return generate_latest(registry).decode()

    five, twenty = at_5_and_20(prefix, scrape, django_capture_on_commit_callbacks)

    assert len(twenty) == len(five)
    shard_reads = [q for q in twenty if 'FROM "fleet_shard"' in q]
    assert all("WHERE" in q for q in shard_reads), "every shard ever placed is read"
    assert not [q for q in twenty if SELECTS_INVENTORY.search(q)], "inventories decoded"
    text = scrape()
    assert f'llmgw_shard_cpu_cores{{model="{prefix}model-19"' in text
    assert f'llmgw_gpu_nvlink_peers{{gpu="1",node="{prefix}19"}} 0.0' in text


def test_the_model_rows_make_as_many_queries_at_20_nodes_as_at_5(
    prefix, django_capture_on_commit_callbacks
):
    five, twenty = at_5_and_20(prefix, model_rows, django_capture_on_commit_callbacks)

    assert len(twenty) == len(five)
    assert not [q for q in twenty if SELECTS_INVENTORY.search(q)], "shards' nodes read whole"


@pytest.mark.parametrize(
    "stored",
    [{"cpu": {"cores": "many"}, "gpus": "none"}, {"gpus": [{"index": "0"}, 7, {"index": 1}]}],
    ids=["wrong types", "odd gpus"],
)
def test_a_scrape_survives_an_inventory_that_no_longer_reads(prefix, stored):
    grow(prefix, 1)
    Node.objects.filter(id=f"{prefix}0").update(inventory=stored)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())

    text = generate_latest(registry).decode()

    assert f'llmgw_node_up{{node="{prefix}0"}} 1.0' in text
    assert f'llmgw_node_cpus{{node="{prefix}0"}}' not in text


def test_nodes_due_their_engines_are_marked_in_one_write(
    prefix, django_capture_on_commit_callbacks
):
    def tell_all_again():
        ours = Node.objects.filter(id__startswith=prefix)
        ours.update(engines_told="")  # the catalog's engines changed: every node is due
        told = tell_nodes_their_engines(timezone.now())
        assert sorted(told) == sorted(ours.values_list("id", flat=True))

    five, twenty = at_5_and_20(prefix, tell_all_again, django_capture_on_commit_callbacks)

    assert len(twenty) == len(five)


def test_a_pass_tells_a_bounded_number_of_nodes_draining_ones_first(
    prefix, monkeypatch, django_capture_on_commit_callbacks
):
    grow(prefix, 5)
    Node.objects.filter(id__startswith=prefix).update(engines_told="")
    Node.objects.filter(id=f"{prefix}4").update(draining=True)
    monkeypatch.setattr(engine_orders, "TOLD_PER_PASS", 2)

    told = [tell_nodes_their_engines(timezone.now()) for _ in range(4)]

    assert told[0][0] == f"{prefix}4"
    assert [len(t) for t in told] == [2, 2, 1, 0]
    assert sorted(sum(told, [])) == sorted(f"{prefix}{n}" for n in range(5))


def register_again(node_id: str) -> None:
    """``node_id`` links again, reporting the shards it runs as they are."""
    node = Node.objects.get(id=node_id)
    running = [
        messages.ReportedShard(
            spec=shard_spec(shard.replica, shard, node, 1, MeetingPoints(), None, 0),
            state=ShardState(shard.state),
        )
        for shard in node.shards.select_related("replica__profile__model")
    ]
    message = messages.Register(
        inventory=inventory(node.id, gpus=2, address=node.address),
        engines_probed=True,
        engines=[EngineInstall(engine="llama.cpp", version="b6000")],
        shards=running,
    )
    link_node(node.id, message, actor=AGENT_LINK)


def test_a_register_makes_as_many_queries_in_a_fleet_of_20_as_of_5(
    prefix, django_capture_on_commit_callbacks
):
    def work():
        register_again(f"{prefix}0")

    five, twenty = at_5_and_20(prefix, work, django_capture_on_commit_callbacks)

    assert len(twenty) == len(five)


def test_an_unchanged_shard_costs_its_register_three_queries(
    prefix, django_capture_on_commit_callbacks
):
    grow(prefix, 1)
    make_node(f"{prefix}bare", address="10.0.1.1")
    capture = django_capture_on_commit_callbacks
    register_again(f"{prefix}bare")  # its first says what it has: events, not the steady cost

    bare = queries(lambda: register_again(f"{prefix}bare"), capture)
    one = queries(lambda: register_again(f"{prefix}0"), capture)

    # Its lock with its replica, the replica and its ranks' states: no transition tried
    # for a replica already ready, no savepoint, no node read back.
    assert len(one) - len(bare) == 3, "\n".join(one)


def test_a_nodes_reports_are_read_back_once_for_each_value_they_hold(prefix, monkeypatch):
    grow(prefix, 3)
    read = []
    real = models._stored

    def counted(model, stored, node_id):
        read.append(model.__name__)
        return real(model, stored, node_id)

    monkeypatch.setattr(models, "_stored", counted)

    node_snapshots(timezone.now())  # its snapshot and its fabrics both ask for the inventory

    assert read.count("Inventory") == 3
    node = Node.objects.get(id=f"{prefix}0")
    first = node.inventory_facts()
    assert node.inventory_facts() is first
    node.inventory = inventory(node.id, gpus=4).model_dump(mode="json")
    facts = node.inventory_facts()
    assert facts is not None and len(facts.gpus) == 4


def test_a_pass_leaves_the_collector_as_it_found_it(prefix, django_capture_on_commit_callbacks):
    before = gc.get_threshold()
    grow(prefix, 2)

    queries(steady_pass, django_capture_on_commit_callbacks)

    assert gc.get_threshold() == before
