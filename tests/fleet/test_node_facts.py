"""What a node row says of itself, typed: its inventory, its fresh usage, its liveness."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet.models import USAGE_FRESH_FOR, Node, NodeState, ReplicaState, ShardState
from protocol.inventory import Inventory, NodeUsage, ShardUsage
from tests.factories import make_node
from tests.fleet.inventories import inventory

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
USAGE = NodeUsage(
    cpu_percent=37.5,
    load=(2.5, 1.25, 0.75),
    memory_total=64 << 30,
    memory_used=24 << 30,
    memory_available=40 << 30,
    gpu_memory_used={0: 70 << 30},
    shards={"s1": ShardUsage(cpu_cores=1.5, rss=1 << 30)},
)


def reported(age: timedelta | None) -> Node:
    """A node whose latest heartbeat (as the batcher stores it) is ``age`` old; None: never."""
    if age is None:
        return Node(id="node01")
    return Node(id="node01", usage=USAGE.model_dump(mode="json"), usage_reported_at=NOW - age)


@pytest.mark.parametrize(
    ("age", "fresh"),
    [
        pytest.param(timedelta(seconds=5), True, id="5s-old-is-current"),
        pytest.param(USAGE_FRESH_FOR, True, id="exactly-the-limit-is-current"),
        pytest.param(USAGE_FRESH_FOR + timedelta(seconds=1), False, id="past-the-limit-is-not"),
        pytest.param(None, False, id="never-reported"),
    ],
)
def test_usage_at_is_the_typed_latest_heartbeat_only_while_fresh(age, fresh):
    node = reported(age)

    assert node.usage_fresh_at(NOW) is fresh
    assert node.usage_at(NOW) == (USAGE if fresh else None)
    assert node.latest_usage() == (None if age is None else USAGE)


def test_usage_keeps_gpu_indices_as_ints_through_json():
    usage = reported(timedelta(seconds=1)).usage_at(NOW)

    assert usage is not None
    assert usage.gpu_memory_used == {0: 70 << 30}
    assert usage.shards["s1"].rss == 1 << 30


def test_a_stored_usage_the_protocol_no_longer_reads_is_no_usage(caplog):
    node = Node(id="node01", usage={"cpu_percent": "lots"}, usage_reported_at=NOW)

    assert node.usage_at(NOW) is None
    assert "node01" in caplog.text


def test_inventory_facts_are_the_protocol_inventory_it_registered():
    registered = inventory("node01", gpus=2, warnings=["no AVX2"])
    node = Node(id="node01", inventory=registered.model_dump(mode="json"))

    facts = node.inventory_facts()

    assert isinstance(facts, Inventory)
    assert facts == registered
    assert node.warnings == ["no AVX2"]


@pytest.mark.parametrize(
    ("firewall", "problem", "warning"),
    [
        ("nftables", "", None),
        ("loopback", "", None),
        ("off", "", "engine ports open to the network: LLMGW_AGENT_FIREWALL=off accepts the risk"),
        ("unavailable", "nft is not installed (apt install nftables)",
         "engine ports open to the network: nft is not installed (apt install nftables)"),
        ("", "", "engine ports open to the network: this agent is too old to wall them; "
         "upgrade it"),
    ],
)  # fmt: skip
def test_a_node_whose_engine_ports_answer_the_network_says_so_first(firewall, problem, warning):
    registered = inventory("node01", firewall=firewall, firewall_problem=problem,
                           warnings=["no AVX2"])  # fmt: skip
    node = Node(id="node01", inventory=registered.model_dump(mode="json"))

    assert node.warnings == ([warning] if warning else []) + ["no AVX2"]


def test_a_node_that_never_registered_has_no_inventory_facts():
    assert Node(id="node01").inventory_facts() is None
    assert Node(id="node01").warnings == []


CONNECTED, UNREACHABLE, LOST = NodeState.CONNECTED, NodeState.UNREACHABLE, NodeState.LOST


@pytest.mark.parametrize(
    ("silence", "liveness"),
    [
        pytest.param(2, CONNECTED, id="heard-2s-ago"),
        pytest.param(15, CONNECTED, id="exactly-15s-still-connected"),
        pytest.param(16, UNREACHABLE, id="16s-unreachable"),
        pytest.param(60, UNREACHABLE, id="exactly-60s-only-unreachable"),
        pytest.param(61, LOST, id="61s-lost"),
        pytest.param(None, CONNECTED, id="never-heard-from-is-not-silent"),
    ],
)
def test_liveness_at_follows_the_silence(silence, liveness):
    heard = None if silence is None else NOW - timedelta(seconds=silence)
    node = Node(id="node01", state=LOST, registered_at=heard, last_heartbeat=heard)

    assert node.liveness_at(NOW) == liveness


@pytest.mark.django_db
def test_the_heartbeat_time_is_stored_as_usage_reported_at():
    make_node("node01", usage=USAGE.model_dump(mode="json"), usage_reported_at=NOW)

    assert Node.objects.get(id="node01").usage_at(NOW) == USAGE


def test_shard_state_groups_cover_every_state_once():
    assert set(ShardState.values) == ShardState.LIVE | ShardState.FINAL
    assert not ShardState.LIVE & ShardState.FINAL
    assert ShardState.LIVE - {ShardState.READY} == ShardState.LOADING


def test_replica_state_groups():
    assert set(ReplicaState.values) - {ReplicaState.STOPPED} == ReplicaState.LIVE
    assert {ReplicaState.STOPPING, ReplicaState.STOPPED} == ReplicaState.ENDING
    assert ReplicaState.COUNTED == ReplicaState.LIVE - ReplicaState.ENDING
