"""Register is one verb: the node refreshed and its shards settled together, or nothing."""

from __future__ import annotations

import pytest

from audit.actors import AGENT_LINK
from catalog.actions.entries import apply_catalog
from fleet.actions import reports, shard_reports
from fleet.actions.reports import link_node
from fleet.models import Node, Replica, Shard, ShardState
from protocol import messages
from protocol.engines import EngineInstall
from tests.factories import SETUP
from tests.fleet.cluster import catalog, connect, run
from tests.fleet.inventories import inventory

pytestmark = pytest.mark.django_db


def register(node_id: str, **fields) -> messages.Register:
    return messages.Register(
        inventory=inventory(node_id, gpus=2),
        engines_probed=True,
        engines=[EngineInstall(engine="llama.cpp", version="b6000")],
        **fields,
    )


def test_link_node_refreshes_the_node_and_answers_linked(node_ids):
    answer = link_node(node_ids[0], register(node_ids[0], agent_version="0.2.0"), actor=AGENT_LINK)

    assert answer == {"type": "linked", "node": node_ids[0]}
    node = Node.objects.get(id=node_ids[0])
    assert (node.state, node.agent_version) == ("connected", "0.2.0")
    facts = node.inventory_facts()
    assert facts is not None and len(facts.gpus) == 2


def test_link_node_settles_the_shards_the_node_no_longer_runs(
    node_ids, django_capture_on_commit_callbacks
):
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    shard = Shard.objects.get()
    ready = messages.ShardStatus(shard_id=shard.id, state="ready")
    shard_reports.record_shard_status(node_ids[0], ready, actor=AGENT_LINK)

    link_node(
        node_ids[0], register(node_ids[0]), actor=AGENT_LINK
    )  # its agent restarted without the engine

    assert Shard.objects.get(id=shard.id).state == ShardState.FAILED
    assert Replica.objects.get().state == "failed"


def test_a_register_that_fails_part_way_leaves_nothing_written(node_ids, monkeypatch):
    def broken(node_id, message, *, actor):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(reports, "forget_unreported_shards", broken)

    with pytest.raises(RuntimeError):
        link_node(node_ids[0], register(node_ids[0]), actor=AGENT_LINK)

    assert not Node.objects.filter(id=node_ids[0]).exists()
