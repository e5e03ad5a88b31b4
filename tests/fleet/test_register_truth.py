"""What the control plane believes after registers and late statuses: the restart cases of
the reference history, against real PostgreSQL and the real Redis broker."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.actors import AGENT_LINK
from audit.models import Event
from catalog.actions.entries import apply_catalog
from catalog.models import Profile
from fleet.actions.reports import register_node
from fleet.actions.shard_reports import (
    adopt_reported_shards,
    forget_unreported_shards,
    record_shard_status,
)
from fleet.models import Replica, Shard
from fleet.pki.keys import replica_secret
from fleet.reconcile.passes import reconcile
from protocol import messages
from protocol.engines import EngineInstall
from protocol.shard import ShardSpec
from tests.factories import SETUP
from tests.fleet.cluster import catalog, connect, run
from tests.fleet.inventories import inventory
from tests.fleet.queues import queued_commands

pytestmark = pytest.mark.django_db


def placed_and_ready(node_id, django_capture_on_commit_callbacks) -> Shard:
    connect(node_id)
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    shard = Shard.objects.get()
    status = messages.ShardStatus(shard_id=shard.id, state="ready", pid=42, seq=3)
    record_shard_status(node_id, status, actor=AGENT_LINK)
    assert Replica.objects.get().state == "ready"
    return shard


def register_with(node_id, *running: messages.ReportedShard) -> messages.Register:
    register = messages.Register(
        inventory=inventory(node_id),
        engines_probed=True,
        engines=[EngineInstall(engine="llama.cpp", version="b6000")],
        shards=list(running),
    )
    register_node(node_id, register, actor=AGENT_LINK)
    adopt_reported_shards(node_id, register, actor=AGENT_LINK)
    forget_unreported_shards(node_id, register, actor=AGENT_LINK)
    return register


def spec_of(shard: Shard, **fields) -> ShardSpec:
    replica = shard.replica
    return ShardSpec(
        shard_id=shard.id, replica_id=str(replica.id), model=replica.model_name,
        source="/models/gemma.gguf", engine="llama.cpp", profile=replica.profile_name,
        fingerprint=replica.fingerprint, port=shard.port, api_key=replica.secret, **fields,
    )  # fmt: skip


# -- 1. an adopted engine is not reaped by a startup clock that never restarted -----------


def test_a_replica_back_in_starting_gets_a_fresh_startup_clock(
    node_ids, django_capture_on_commit_callbacks
):
    shard = placed_and_ready(node_ids[0], django_capture_on_commit_callbacks)
    # Serving for two hours, then its agent restarts and re-checks the adopted engine.
    Replica.objects.update(starting_since=timezone.now() - timedelta(hours=2))
    status = messages.ShardStatus(shard_id=shard.id, state="starting", seq=4)
    record_shard_status(node_ids[0], status, actor=AGENT_LINK)
    replica = Replica.objects.get()
    assert replica.state == "starting"
    assert timezone.now() - replica.starting_since < timedelta(minutes=1)
    report = run(django_capture_on_commit_callbacks)
    assert not report.failed
    assert Replica.objects.get().state == "starting"


def test_a_starting_replica_whose_ranks_all_report_ready_is_never_timed_out(
    node_ids, django_capture_on_commit_callbacks
):
    shard = placed_and_ready(node_ids[0], django_capture_on_commit_callbacks)
    # The replica row lagged behind (say a transition lost to a crash): its ranks are ready.
    Replica.objects.update(state="starting", starting_since=timezone.now() - timedelta(hours=2))
    report = run(django_capture_on_commit_callbacks)
    assert not report.failed
    assert Replica.objects.get().state == "ready"
    assert Shard.objects.get(id=shard.id).state == "ready"


# -- 2. a status older than what the control plane holds is ignored ------------------------


def test_a_queued_status_older_than_the_register_is_ignored(
    node_ids, django_capture_on_commit_callbacks
):
    shard = placed_and_ready(node_ids[0], django_capture_on_commit_callbacks)
    # The agent restarted while unlinked: it registers with the shard ready (seq 9), then
    # sends what it queued during the outage: "starting" from when it adopted (seq 7).
    register_with(
        node_ids[0], messages.ReportedShard(spec=spec_of(shard), state="ready", pid=42, seq=9)
    )
    stale = messages.ShardStatus(shard_id=shard.id, state="starting", seq=7)
    assert record_shard_status(node_ids[0], stale, actor=AGENT_LINK) is False
    assert Shard.objects.get(id=shard.id).state == "ready"
    assert Replica.objects.get().state == "ready"
    assert not Event.objects.filter(kind="replica", from_state="ready").exists()
    # A newer status still applies.
    fresh = messages.ShardStatus(shard_id=shard.id, state="failed", seq=10, reason="crashed")
    assert record_shard_status(node_ids[0], fresh, actor=AGENT_LINK) is True
    assert Replica.objects.get().state == "failed"


def test_a_register_older_than_what_is_held_does_not_undo_it(
    node_ids, django_capture_on_commit_callbacks
):
    shard = placed_and_ready(node_ids[0], django_capture_on_commit_callbacks)
    register_with(node_ids[0], messages.ReportedShard(spec=spec_of(shard), state="starting", seq=2))
    assert Shard.objects.get(id=shard.id).state == "ready"


# -- 3. a stop is always resolved --------------------------------------------------------


def test_a_stopping_replicas_shard_the_node_does_not_report_is_stopped_by_its_register(
    node_ids, django_capture_on_commit_callbacks
):
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    shard = Shard.objects.get()  # pending: its start may never have arrived
    apply_catalog("models: []", prune=True, actor=SETUP)
    run(django_capture_on_commit_callbacks)
    assert Replica.objects.get().state == "stopping"
    # The stop expired unanswered; the next register does not mention the shard.
    register_with(node_ids[0])
    assert Shard.objects.get(id=shard.id).state == "stopped"
    run(django_capture_on_commit_callbacks)
    assert Replica.objects.get().state == "stopped"


# -- 4. a lost node returning with engines of stopped replicas ----------------------------


def test_a_returning_node_reporting_a_stopped_replicas_shard_is_told_to_stop_it(
    node_ids, django_capture_on_commit_callbacks
):
    shard = placed_and_ready(node_ids[0], django_capture_on_commit_callbacks)
    spec = spec_of(shard)
    Replica.objects.update(state="stopped")
    Shard.objects.update(state="stopped")
    from tests.fleet.queues import clear_queue

    clear_queue(node_ids[0])  # its stop command expired while the node was away
    with django_capture_on_commit_callbacks(execute=True):
        register_with(node_ids[0], messages.ReportedShard(spec=spec, state="ready", pid=42, seq=20))
    assert queued_commands(node_ids[0]) == [("agent.stop_shard", [shard.id, 0])]
    assert Replica.objects.get().state == "stopped"
    assert Replica.objects.count() == 1


# -- 5. a node reports only its own shards ------------------------------------------------


def test_a_node_reporting_another_nodes_shard_changes_nothing(
    node_ids, django_capture_on_commit_callbacks
):
    shard = placed_and_ready(node_ids[0], django_capture_on_commit_callbacks)
    connect(node_ids[1])
    with django_capture_on_commit_callbacks(execute=True):
        register_with(
            node_ids[1],
            messages.ReportedShard(spec=spec_of(shard), state="failed", pid=7, seq=99),
        )
    shard.refresh_from_db()
    assert (shard.node_id, shard.state, shard.pid) == (node_ids[0], "ready", 42)
    assert Replica.objects.get().state == "ready"
    assert Event.objects.filter(
        subject=node_ids[1], reason__contains=f"belongs to {node_ids[0]}"
    ).exists()


def test_a_node_cannot_add_a_shard_to_another_nodes_replica(
    node_ids, django_capture_on_commit_callbacks
):
    shard = placed_and_ready(node_ids[0], django_capture_on_commit_callbacks)
    connect(node_ids[1])
    forged = spec_of(shard, rank=1).model_copy(update={"shard_id": uuid.uuid4().hex})
    register_with(node_ids[1], messages.ReportedShard(spec=forged, state="ready", seq=1))
    assert list(Shard.objects.values_list("id", flat=True)) == [shard.id]
    assert Event.objects.filter(subject=node_ids[1], reason__contains="refused").exists()


def test_an_invented_replica_is_never_counted_or_routed(
    node_ids, django_capture_on_commit_callbacks
):
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    profile = Profile.objects.get()
    invented = ShardSpec(
        shard_id=uuid.uuid4().hex, replica_id=str(uuid.uuid4()), model="gemma",
        source="/models/gemma.gguf", engine="llama.cpp", profile="cpu",
        fingerprint=profile.fingerprint(), port=20000, api_key="chosen-by-the-node",
    )  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        register_with(node_ids[0], messages.ReportedShard(spec=invented, state="ready", seq=1))
    rebuilt = Replica.objects.get(id=invented.replica_id)
    assert rebuilt.profile is None and rebuilt.state == "stopping"
    assert ("agent.stop_shard", [invented.shard_id, 0]) in queued_commands(node_ids[0])
    from fleet.routing_table import routing_snapshot

    [gemma] = [m for m in routing_snapshot().models if m.name == "gemma"]
    assert gemma.endpoints == []
    # The profile still gets a replica of its own.
    run(django_capture_on_commit_callbacks)
    assert Replica.objects.filter(profile=profile).count() == 1


def test_a_replica_the_control_plane_created_is_rebuilt_from_its_report(
    node_ids, django_capture_on_commit_callbacks
):
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    profile = Profile.objects.get()
    replica_id = uuid.uuid4()
    ours = ShardSpec(
        shard_id=uuid.uuid4().hex, replica_id=str(replica_id), model="gemma",
        source="/models/gemma.gguf", engine="llama.cpp", profile="cpu",
        fingerprint=profile.fingerprint(), port=20000, api_key=replica_secret(replica_id),
    )  # fmt: skip
    register_with(node_ids[0], messages.ReportedShard(spec=ours, state="ready", seq=1))
    replica = Replica.objects.get()
    assert (replica.id, replica.profile, replica.state) == (replica_id, profile, "ready")
    assert not reconcile().created  # it counts toward the profile


def test_an_unexpected_gpu_user_is_shown_on_the_node_and_recorded_once(node_ids):
    from fleet.models import Node
    from protocol.gpu_users import UnexpectedGpuUser

    stranger = UnexpectedGpuUser(pid=4242, user="alice", name="python", cmdline="python train.py")
    register = messages.Register(
        inventory=inventory(node_ids[0]), engines_probed=True, unexpected_gpu_users=[stranger]
    )
    register_node(node_ids[0], register, actor=AGENT_LINK)
    register_node(node_ids[0], register, actor=AGENT_LINK)  # a reconnect says it again
    [warning] = Node.objects.get(id=node_ids[0]).warnings
    assert "pid 4242 of alice (python train.py)" in warning and "leaves it running" in warning
    assert Event.objects.filter(subject=node_ids[0], reason=warning).count() == 1


# -- 6. after a control plane restart, what runs still takes its GPUs ----------------------


def test_a_rebuilt_replicas_gpus_are_taken_when_placing_the_next(node_ids):
    from fleet.planning.snapshot import node_snapshots, placement_request
    from placement import place

    apply_catalog(catalog(replicas=2, gpus=2), actor=SETUP)
    profile = Profile.objects.get()
    replica_id = uuid.uuid4()
    running = ShardSpec(
        shard_id=uuid.uuid4().hex, replica_id=str(replica_id), model="gemma",
        source="/models/gemma.gguf", engine="llama.cpp", profile="cpu", gpus=[0, 1],
        fingerprint=profile.fingerprint(), port=20000, api_key=replica_secret(replica_id),
    )  # fmt: skip
    register = messages.Register(
        inventory=inventory(node_ids[0], gpus=4),
        engines_probed=True,
        engines=[EngineInstall(engine="llama.cpp", version="b6000")],
        shards=[messages.ReportedShard(spec=running, state="ready", pid=42, seq=1)],
    )
    register_node(node_ids[0], register, actor=AGENT_LINK)
    adopt_reported_shards(node_ids[0], register, actor=AGENT_LINK)

    [snapshot] = [s for s in node_snapshots(timezone.now()) if s.id == node_ids[0]]
    decision = place(placement_request("next", profile), [snapshot])

    assert [gpu.index for gpu in snapshot.gpus] == [2, 3]
    assert decision.placed and decision.ranks[0].gpus == (2, 3)
