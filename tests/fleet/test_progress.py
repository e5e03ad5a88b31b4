"""Download progress rides beside a shard's state: taken only while the shard fetches,
cleared by every transition, whichever path makes it (a status, a register, the reconciler)."""

from __future__ import annotations

import pytest

from audit.actors import AGENT_LINK
from fleet.actions.reports import register_node
from fleet.actions.shard_reports import (
    adopt_reported_shards,
    record_shard_progress,
    record_shard_status,
)
from fleet.models import Node, ShardState
from fleet.transitions import transition
from protocol import messages
from protocol.engines import EngineInstall
from protocol.shard import ShardSpec
from tests.factories import SETUP, make_replica, make_shard, make_user
from tests.fleet.inventories import inventory

pytestmark = pytest.mark.django_db

WHOLE = {"bytes": 15_200_000_000, "total": 15_200_000_000, "rate": 50_000_000}


def linked(node_id: str = "node01") -> Node:
    register = messages.Register(
        inventory=inventory(node_id),
        engines_probed=True,
        engines=[EngineInstall(engine="llama.cpp", version="b6000")],
    )
    return register_node(node_id, register, actor=AGENT_LINK)


def shard_in(state: str, progress: dict | None = None, node_id: str = "node01"):
    node = Node.objects.get(id=node_id)
    return make_shard(make_replica(), node=node, state=state, port=20000, progress=progress)


def progress_of(shard) -> dict | None:
    shard.refresh_from_db()
    return shard.progress


def progress(shard, done: int = 10, total: int | None = 100) -> messages.ShardProgress:
    return messages.ShardProgress(shard_id=shard.id, bytes=done, total=total, rate=None)


def test_progress_is_taken_while_the_shard_fetches():
    linked()
    shard = shard_in(ShardState.FETCHING)

    record_shard_progress("node01", progress(shard, 10, 100), actor=AGENT_LINK)

    assert progress_of(shard) == {"bytes": 10, "total": 100, "rate": None}


@pytest.mark.parametrize(
    "state",
    [ShardState.PENDING, ShardState.STARTING, ShardState.READY, ShardState.FAILED],
)
def test_progress_is_dropped_unless_the_shard_fetches(state):
    # A late progress message (sent before the link dropped, read after the shard moved
    # on) would otherwise show "15.2 of 15.2 GiB" beside a loading engine until it is ready.
    linked()
    shard = shard_in(state)

    record_shard_progress("node01", progress(shard), actor=AGENT_LINK)

    assert progress_of(shard) is None


@pytest.mark.parametrize(
    "target", [ShardState.STARTING, ShardState.FAILED, ShardState.STOPPED], ids=str
)
def test_every_transition_clears_progress(target):
    linked()
    shard = shard_in(ShardState.FETCHING, WHOLE)

    assert transition(type(shard), shard.id, target, "moved on", actor=SETUP) == ShardState.FETCHING

    assert progress_of(shard) is None


def test_a_refused_transition_keeps_progress():
    linked()
    shard = shard_in(ShardState.FETCHING, WHOLE)

    assert transition(type(shard), shard.id, ShardState.READY, "not an edge", actor=SETUP) is None

    assert progress_of(shard) == WHOLE


def test_a_status_clears_progress():
    linked()
    shard = shard_in(ShardState.FETCHING, WHOLE)

    record_shard_status(
        "node01", messages.ShardStatus(shard_id=shard.id, state="starting"), actor=AGENT_LINK
    )

    assert progress_of(shard) is None


def test_a_register_after_a_link_drop_clears_the_finished_downloads_progress():
    # The download ended while the link was down; the status saying "starting" was lost
    # with it, and the register that follows reports the shard loading its engine.
    linked()
    shard = shard_in(ShardState.FETCHING, WHOLE)
    replica = shard.replica
    spec = ShardSpec(
        shard_id=shard.id, replica_id=str(replica.id), model=replica.model_name,
        source="https://models.example/gemma.gguf", engine="llama.cpp",
        profile=replica.profile_name, fingerprint=replica.fingerprint, port=20000,
        api_key=replica.secret,
    )  # fmt: skip
    register = messages.Register(
        inventory=inventory("node01"),
        engines_probed=True,
        shards=[messages.ReportedShard(spec=spec, state="starting", pid=42, seq=5)],
    )

    adopt_reported_shards("node01", register, actor=AGENT_LINK)

    shard.refresh_from_db()
    assert (shard.state, shard.progress) == (ShardState.STARTING, None)


def test_a_download_of_unknown_length_shows_what_came_so_far_on_every_page(client):
    # The server sent no length: what came so far is all there is to say.
    linked()
    shard = shard_in(ShardState.FETCHING)
    unknown = messages.ShardProgress(shard_id=shard.id, bytes=1_288_490_189, total=None)
    record_shard_progress("node01", unknown, actor=AGENT_LINK)
    client.force_login(make_user("rita"))

    for page in ("/weights/gemma/", "/models/gemma/", "/nodes/node01/"):
        html = client.get(page).content.decode()
        assert "1.2 GiB so far" in html, page
