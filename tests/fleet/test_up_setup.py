"""`llmgw up` starting again: the replicas whose engines it stopped on its way out are
stopped replicas, replaced at once, not failed ones waiting out a backoff; an engine it
left running (LLMGW_KEEP_ENGINES=1) keeps its replica."""

from __future__ import annotations

import json

import pytest

from audit.models import Event
from fleet.models import Replica
from llmgw_cli.up_setup import stop_replicas_left_stopped
from tests.factories import make_model, make_node, make_profile, make_replica, make_shard

pytestmark = pytest.mark.django_db


def test_only_replicas_whose_engines_are_gone_are_stopped(node_ids, tmp_path):
    node, elsewhere = make_node(node_ids[0]), make_node(node_ids[1])
    profile = make_profile(make_model())
    gone, kept, other = (make_replica(profile, state="ready") for _ in range(3))
    make_shard(gone, node=node, state="ready")
    running = make_shard(kept, node=node, state="ready")
    make_shard(other, node=elsewhere, state="ready")
    state_dir = tmp_path / "shards"
    state_dir.mkdir()
    (state_dir / f"{running.id}.json").write_text(json.dumps({"processes": []}))

    stopped = stop_replicas_left_stopped(node.id, state_dir)

    assert stopped == [str(gone.id)]
    states = {r.id: r.state for r in Replica.objects.all()}
    assert states == {gone.id: "stopping", kept.id: "ready", other.id: "ready"}
    event = Event.objects.get(subject=str(gone.id), to_state="stopping")
    assert event.reason == "its engine was stopped with the last `llmgw up`"
    assert event.actor_name == ""  # llmgw acting by itself
