"""The fleet as placement sees it: built from what agents reported, fabrics' ports included."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet.planning.snapshot import node_snapshots
from placement import FabricSnapshot, PlacementRequest, place
from protocol.inventory import AdapterPort, FabricAdapter, NodeUsage, UsableFabric
from tests.factories import make_node, make_profile, make_replica, make_shard
from tests.fleet.inventories import inventory

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
GiB = 1 << 30
ACROSS_TWO = PlacementRequest(
    replica_key="r1", model="big", profile="tp", engine="vllm", ranks=2, memory=GiB
)


def adapter(name: str, state: str = "ACTIVE") -> FabricAdapter:
    return FabricAdapter(
        name=name, ports=[AdapterPort(number=1, state=state, rate_gbps=200.0)], interfaces=["ib0"]
    )


def node_on_fabric(node_id: str, *adapters: FabricAdapter, **fields):
    """A node that reports fabric ib-a over mlx5_0, with the adapters' ports as given."""
    ib_a = UsableFabric(name="ib-a", adapters=["mlx5_0"], rate_gbps=200.0, socket_ifname="ib0")
    facts = inventory(node_id, fabrics=[ib_a], adapters=list(adapters), **fields)
    return make_node(node_id, inventory=facts.model_dump(mode="json"))


def test_a_node_whose_fabric_adapter_is_reported_down_is_not_used_across_nodes():
    node_on_fabric("node01", adapter("mlx5_0"))
    node_on_fabric("node02", adapter("mlx5_0", state="DOWN"))

    decision = place(ACROSS_TWO, node_snapshots(NOW))

    assert not decision.placed
    assert decision.refusals == {
        "node02": ("no active fabric for a 2-node replica (ib-a: mlx5_0 not active)",)
    }
    assert decision.problem == "needs 2 nodes on one fabric; ib-a has 1 eligible node"


def test_each_rank_is_given_its_own_nodes_side_of_the_fabric():
    node_on_fabric("node01", adapter("mlx5_0"))
    # An agent that reports no adapters (older than adapter discovery) is taken at its word.
    node_on_fabric("node02")

    decision = place(ACROSS_TWO, node_snapshots(NOW))

    assert decision.placed
    ib_a = FabricSnapshot("ib-a", 200.0, ("mlx5_0",), "ib0")
    assert [rank.fabric for rank in decision.ranks] == [ib_a, ib_a]


def usage(gpu_used: int) -> dict:
    return NodeUsage(
        cpu_percent=1.0, load=(0.0, 0.0, 0.0), memory_total=64 * GiB, memory_used=48 * GiB,
        memory_available=16 * GiB, gpu_memory_used={0: gpu_used},
    ).model_dump(mode="json")  # fmt: skip


@pytest.mark.parametrize(
    ("age", "gpu_free", "ram_free"),
    [
        pytest.param(timedelta(seconds=5), 10 * GiB, 16 * GiB, id="fresh-usage-counts"),
        pytest.param(timedelta(minutes=5), 80 * GiB, 64 * GiB, id="stale-usage-trusts-totals"),
    ],
)
def test_free_memory_comes_from_fresh_usage_only(age, gpu_free, ram_free):
    make_node(
        "node01",
        inventory=inventory("node01", gpus=1).model_dump(mode="json"),
        usage=usage(gpu_used=70 * GiB),
        usage_reported_at=NOW - age,
    )

    [snapshot] = node_snapshots(NOW)

    assert [gpu.memory_free for gpu in snapshot.gpus] == [gpu_free]
    assert snapshot.ram_free == ram_free


def test_a_node_that_never_registered_offers_nothing():
    make_node("node01")

    [snapshot] = node_snapshots(NOW)

    assert (snapshot.gpus, snapshot.ram_free, snapshot.disk_free, snapshot.fabrics) == (
        (), 0, 0, ()
    )  # fmt: skip


def test_each_node_counts_the_live_replicas_of_each_profile_it_runs():
    node = make_node("node01")
    profile = make_profile()
    key = f"{profile.model.name}/{profile.name}"
    make_shard(make_replica(profile, state="ready"), node=node, state="ready")
    make_shard(make_replica(profile, state="starting"), node=node, state="starting")
    make_shard(make_replica(profile, state="stopped"), node=node, state="stopped")

    [snapshot] = node_snapshots(NOW)

    assert snapshot.replicas == {key: 2}  # what spread placement spreads
