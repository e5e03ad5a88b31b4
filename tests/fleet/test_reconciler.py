"""The reconciler against real PostgreSQL and the real Redis broker."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from audit.actors import AGENT_LINK
from audit.models import Event
from catalog.actions.entries import apply_catalog
from fleet.actions.reports import register_node
from fleet.actions.shard_reports import (
    adopt_reported_shards,
    forget_unreported_shards,
    record_shard_status,
)
from fleet.models import Node, Replica, Shard
from fleet.pki.keys import replica_secret
from fleet.planning.backoff import replacement_delay
from fleet.routing_table import routing_snapshot
from fleet.transitions import transition
from protocol import messages
from protocol.engines import EngineInstall
from protocol.shard import ShardSpec
from protocol.signing import BadSignature, open_sealed, verify
from tests.factories import SETUP, make_profile, make_replica
from tests.fleet.cluster import catalog, connect, run
from tests.fleet.inventories import inventory
from tests.fleet.queues import broker, node_command_key, queued_commands, queued_signatures

pytestmark = pytest.mark.django_db


def reported_spec(model="gemma", **fields) -> ShardSpec:
    """A shard spec as an agent reports it after a control plane restart."""
    return ShardSpec(
        shard_id=uuid.uuid4().hex,
        replica_id=str(uuid.uuid4()),
        model=model,
        source=f"/models/{model}.gguf",
        engine="llama.cpp",
        profile="cpu",
        port=20000,
        **fields,
    )


def reported(node_id, spec, state="ready", **fields) -> messages.Register:
    return messages.Register(
        inventory=inventory(node_id),
        shards=[messages.ReportedShard(spec=spec, state=state)],
        **fields,
    )


def test_a_model_added_is_placed_and_start_shard_reaches_the_nodes_queue(
    node_ids, django_capture_on_commit_callbacks
):
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    report = run(django_capture_on_commit_callbacks, epoch=7)
    assert len(report.created) == 1 and len(report.placed) == 1
    replica = Replica.objects.get()
    assert replica.state == "starting"
    shard = replica.shards.get()
    assert (shard.node_id, shard.rank, shard.port) == (node_ids[0], 0, 20000)
    [(task, args)] = queued_commands(node_ids[0])
    assert task == "agent.start_shard"
    spec = ShardSpec.model_validate_json(args[0])
    assert (spec.shard_id, spec.model, spec.engine, spec.epoch) == (
        shard.id,
        "gemma",
        "llama.cpp",
        7,
    )
    assert spec.fingerprint == replica.fingerprint
    # Its secret sealed for the node (here linked by token: under its command key).
    assert spec.api_key == "" and replica.secret not in args[0]
    opened = open_sealed(spec.sealed_api_key, shard.id, command_key=node_command_key(node_ids[0]))
    assert opened == replica.secret
    # Signed with the node's own command key: only that node will obey it.
    [signed] = queued_signatures(node_ids[0])
    verify(node_command_key(node_ids[0]), task, args, **signed)
    with pytest.raises(BadSignature):
        verify(node_command_key(node_ids[1]), task, args, **signed)
    # A second pass changes nothing and sends nothing more.
    assert not run(django_capture_on_commit_callbacks).did_anything()
    assert len(queued_commands(node_ids[0])) == 1


def test_unplaceable_replica_says_why_node_by_node(node_ids, django_capture_on_commit_callbacks):
    connect(node_ids[0], engines=())
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    replica = Replica.objects.get()
    assert replica.state == "unplaceable"
    assert replica.reasons[0].startswith("0/1 nodes available")
    assert any(node_ids[0] in reason and "llama.cpp" in reason for reason in replica.reasons)
    # The engine appears: the next pass places it.
    connect(node_ids[0])
    run(django_capture_on_commit_callbacks)
    replica.refresh_from_db()
    assert replica.state == "starting"


def test_an_unplaceable_replica_on_a_large_fleet_keeps_its_reasons_in_brief(
    django_capture_on_commit_callbacks,
):
    prefix = uuid.uuid4().hex[:6]  # unique: their queues live in the shared Redis
    nodes = [f"{prefix}-{i:02d}" for i in range(30)]
    for node_id in nodes:
        connect(node_id, engines=())
    apply_catalog(catalog(), actor=SETUP)
    try:
        run(django_capture_on_commit_callbacks)
    finally:
        broker().delete(*(f"node-{node_id}" for node_id in nodes))
    replica = Replica.objects.get()
    assert replica.state == "unplaceable"
    summary, *examples, rest = replica.reasons
    assert summary.startswith("0/30 nodes available: 30 lack engine llama.cpp")
    assert [line.split(":")[0] for line in examples] == nodes[:3]
    assert rest == "and 27 more nodes refused it, for the reasons counted above"


def test_ready_when_every_rank_reports_ready(node_ids, django_capture_on_commit_callbacks):
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    shard = Shard.objects.get()
    record_shard_status(
        node_ids[0],
        messages.ShardStatus(shard_id=shard.id, state="ready", pid=42),
        actor=AGENT_LINK,
    )
    replica = Replica.objects.get()
    assert replica.state == "ready"
    assert Shard.objects.get().pid == 42


def test_a_lost_nodes_replica_is_placed_elsewhere(node_ids, django_capture_on_commit_callbacks):
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    first = Replica.objects.get()
    connect(node_ids[1])
    transition(Node, node_ids[0], "lost", "no heartbeat for 61s", actor=SETUP)
    run(django_capture_on_commit_callbacks)
    first.refresh_from_db()
    assert first.state == "stopped"  # its node is gone: nothing there to wait for
    replacement = Replica.objects.exclude(id=first.id).get()
    assert replacement.state == "starting"
    assert replacement.shards.get().node_id == node_ids[1]
    # The lost node is still told to stop its engine, in case it comes back.
    assert queued_commands(node_ids[0])[-1] == ("agent.stop_shard", [first.shards.get().id, 0])


def test_a_lost_nodes_ready_replica_serves_until_its_replacement_is_ready(
    node_ids, django_capture_on_commit_callbacks
):
    # A lost node may be cut from the control plane only: its engine still answers the
    # router. Make before break: it stays routable until a replacement is ready elsewhere.
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    first = Replica.objects.get()
    record_shard_status(
        node_ids[0],
        messages.ShardStatus(shard_id=first.shards.get().id, state="ready", pid=7),
        actor=AGENT_LINK,
    )
    connect(node_ids[1])
    transition(Node, node_ids[0], "lost", "no heartbeat for 61s", actor=SETUP)
    run(django_capture_on_commit_callbacks)

    first.refresh_from_db()
    assert first.state == "ready"
    assert [e.replica for e in routing_snapshot().models[0].endpoints] == [str(first.id)]
    replacement = Replica.objects.exclude(id=first.id).get()
    assert replacement.shards.get().node_id == node_ids[1]
    sent = len(queued_commands(node_ids[0]))
    run(django_capture_on_commit_callbacks)
    assert Replica.objects.count() == 2  # one replacement, however many passes
    assert len(queued_commands(node_ids[0])) == sent

    record_shard_status(
        node_ids[1],
        messages.ShardStatus(shard_id=replacement.shards.get().id, state="ready", pid=8),
        actor=AGENT_LINK,
    )
    run(django_capture_on_commit_callbacks)
    first.refresh_from_db()
    # Drained first, like a replica a rollout replaces: what it carries finishes.
    assert first.state == "ready" and first.draining_since is not None
    assert [e.replica for e in routing_snapshot().models[0].endpoints] == [str(replacement.id)]
    assert len(queued_commands(node_ids[0])) == sent

    later = timezone.now() + timedelta(seconds=first.profile.drain_timeout + 1)
    run(django_capture_on_commit_callbacks, now=later)
    first.refresh_from_db()
    assert first.state in ("stopping", "stopped")
    assert first.reasons[0].startswith(f"node {node_ids[0]} is lost; its replacement is ready; ")
    assert queued_commands(node_ids[0])[-1] == ("agent.stop_shard", [first.shards.get().id, 0])


def test_a_lost_nodes_replica_with_nowhere_else_to_go_is_kept(
    node_ids, django_capture_on_commit_callbacks
):
    # Stopping it would only turn a silent agent into a restarted engine once it is back.
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    first = Replica.objects.get()
    shard = first.shards.get()
    transition(Node, node_ids[0], "lost", "no heartbeat for 61s", actor=SETUP)
    sent = len(queued_commands(node_ids[0]))

    run(django_capture_on_commit_callbacks)
    run(django_capture_on_commit_callbacks)

    assert Replica.objects.get() == first and Replica.objects.get().state == "starting"
    assert len(queued_commands(node_ids[0])) == sent  # no stop
    said = Event.objects.filter(
        subject=str(first.id), reason__startswith=f"node {node_ids[0]} is lost"
    )
    assert [e.reason.split(":")[0] for e in said] == [
        f"node {node_ids[0]} is lost; kept, since no other node can take it"
    ]
    assert shard.id in Shard.objects.filter(state__in=["pending", "starting"]).values_list(
        "id", flat=True
    )


def test_a_model_removed_from_the_catalog_is_stopped(node_ids, django_capture_on_commit_callbacks):
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    shard = Shard.objects.get()
    apply_catalog("models: []", prune=True, actor=SETUP)
    run(django_capture_on_commit_callbacks)
    replica = Replica.objects.get()
    assert replica.state == "stopping"
    assert replica.reasons == ["gemma/cpu left the catalog"]
    assert queued_commands(node_ids[0])[-1] == ("agent.stop_shard", [shard.id, 0])
    record_shard_status(
        node_ids[0], messages.ShardStatus(shard_id=shard.id, state="stopped"), actor=AGENT_LINK
    )
    run(django_capture_on_commit_callbacks)
    assert Replica.objects.get().state == "stopped"


def test_scale_down_stops_the_least_useful_first(node_ids, django_capture_on_commit_callbacks):
    connect(node_ids[0], memory_total=64 << 30)
    apply_catalog(catalog(replicas=2), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    ready_shard = Shard.objects.order_by("port").first()
    record_shard_status(
        node_ids[0], messages.ShardStatus(shard_id=ready_shard.id, state="ready"), actor=AGENT_LINK
    )
    apply_catalog(catalog(replicas=1), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    states = dict(Replica.objects.values_list("id", "state"))
    assert states[ready_shard.replica_id] == "ready"
    assert sorted(states.values()) == ["ready", "stopping"]


def test_a_slow_start_fails_after_the_timeout_and_is_replaced(
    node_ids, django_capture_on_commit_callbacks
):
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    shard = Shard.objects.get()
    # Progress rides beside the state and must not reset the startup timer.
    from fleet.actions.shard_reports import record_shard_progress

    record_shard_status(
        node_ids[0], messages.ShardStatus(shard_id=shard.id, state="fetching"), actor=AGENT_LINK
    )
    record_shard_progress(
        node_ids[0], messages.ShardProgress(shard_id=shard.id, bytes=10), actor=AGENT_LINK
    )
    assert Shard.objects.get(id=shard.id).progress["bytes"] == 10
    later = timezone.now() + timedelta(seconds=601)
    report = run(django_capture_on_commit_callbacks, now=later)
    assert report.failed and report.stopping
    failed = Replica.objects.get(id=shard.replica_id)
    assert failed.state == "stopping"
    assert Event.objects.filter(
        subject=str(failed.id), to_state="failed",
        reason="not ready within the profile's startup timeout of 600s",
    ).exists()  # fmt: skip


def test_a_restarted_control_plane_rebuilds_replicas_from_reports_without_a_second_start(
    node_ids, django_capture_on_commit_callbacks
):
    apply_catalog(catalog(), actor=SETUP)
    profile_fingerprint = __import__("catalog.models").models.Profile.objects.get().fingerprint()
    replica_id = str(uuid.uuid4())
    secret = replica_secret(replica_id)  # the control plane created it
    spec = ShardSpec(shard_id=uuid.uuid4().hex, replica_id=replica_id, model="gemma",
                     source="/models/gemma.gguf", engine="llama.cpp", profile="cpu",
                     fingerprint=profile_fingerprint, port=20000, api_key=secret)  # fmt: skip
    register = messages.Register(
        inventory=inventory(node_ids[0]), engines_probed=True,
        engines=[EngineInstall(engine="llama.cpp")],
        shards=[messages.ReportedShard(spec=spec, state="ready", pid=99)],
    )  # fmt: skip
    register_node(node_ids[0], register, actor=AGENT_LINK)
    adopt_reported_shards(node_ids[0], register, actor=AGENT_LINK)
    replica = Replica.objects.get()
    assert (str(replica.id), replica.state, replica.secret) == (replica_id, "ready", secret)
    assert replica.fingerprint == profile_fingerprint
    # Registering again (a reconnect) duplicates nothing.
    adopt_reported_shards(node_ids[0], register, actor=AGENT_LINK)
    run(django_capture_on_commit_callbacks)
    assert Replica.objects.count() == 1 and Shard.objects.count() == 1
    assert queued_commands(node_ids[0]) == []


def test_an_adopted_shard_whose_profile_left_is_stopped(
    node_ids, django_capture_on_commit_callbacks
):
    spec = reported_spec(model="gone")
    register = reported(node_ids[0], spec, engines_probed=True)
    register_node(node_ids[0], register, actor=AGENT_LINK)
    with django_capture_on_commit_callbacks(execute=True):
        adopt_reported_shards(node_ids[0], register, actor=AGENT_LINK)
    run(django_capture_on_commit_callbacks)
    assert Replica.objects.get().state == "stopping"
    assert queued_commands(node_ids[0]) == [("agent.stop_shard", [spec.shard_id, 0])]


def test_an_agent_that_reports_no_fingerprint_reads_as_unknown_and_is_replaced(node_ids):
    apply_catalog(catalog(), actor=SETUP)
    spec = reported_spec()
    spec = spec.model_copy(update={"api_key": replica_secret(spec.replica_id)})
    register = reported(node_ids[0], spec)
    register_node(node_ids[0], register, actor=AGENT_LINK)
    adopt_reported_shards(node_ids[0], register, actor=AGENT_LINK)
    rebuilt = Replica.objects.get()
    assert (rebuilt.profile, rebuilt.state) == (None, "stopping")
    assert "another version" in rebuilt.reasons[0]


def test_drain_moves_replicas_off_the_node(node_ids, django_capture_on_commit_callbacks):
    connect(node_ids[0])
    connect(node_ids[1])
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    first = Replica.objects.get()
    node_id = first.shards.get().node_id
    Node.objects.filter(id=node_id).update(draining=True)
    run(django_capture_on_commit_callbacks)
    replacement = Replica.objects.exclude(id=first.id).get()
    assert replacement.shards.get().node_id != node_id
    assert json.dumps(Replica.objects.get(id=first.id).reasons).find("draining") > 0


def test_a_node_that_registers_without_its_shards_fails_them_but_not_pending_ones(
    node_ids, django_capture_on_commit_callbacks
):
    connect(node_ids[0], memory_total=64 << 30)
    apply_catalog(catalog(replicas=2), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    running, queued = Shard.objects.order_by("port")
    record_shard_status(
        node_ids[0], messages.ShardStatus(shard_id=running.id, state="ready"), actor=AGENT_LINK
    )
    # The agent restarted without its engines (llmgw up stopped them): it reports none.
    empty = messages.Register(inventory=inventory(node_ids[0]), engines_probed=True)
    register_node(node_ids[0], empty, actor=AGENT_LINK)
    assert forget_unreported_shards(node_ids[0], empty, actor=AGENT_LINK) == [running.id]
    running.refresh_from_db()
    assert running.state == "failed" and "registered without it" in running.reason
    assert Replica.objects.get(id=running.replica_id).state == "failed"
    # The other start command may still be in the node's queue: left to its timeout.
    assert Shard.objects.get(id=queued.id).state == "pending"


def _replica_events(replica, *moments):
    """Give ``replica`` events (to_state, seconds ago), as its transitions would have."""
    for to_state, seconds_ago in moments:
        event = Event.objects.create(kind="replica", subject=str(replica.id), to_state=to_state)
        Event.objects.filter(id=event.id).update(at=timezone.now() - timedelta(seconds=seconds_ago))


def test_failures_right_after_start_double_the_replacement_delay():
    profile = make_profile()
    replicas = [make_replica(profile) for _ in range(3)]
    _replica_events(replicas[0], ("failed", 300))  # never ready
    _replica_events(replicas[1], ("ready", 200), ("failed", 190))  # ready 10 s
    _replica_events(replicas[2], ("failed", 100))
    assert replacement_delay(replicas[2], timezone.now()) == timedelta(seconds=20)


def test_an_engine_that_served_a_while_before_dying_is_replaced_without_a_growing_delay():
    profile = make_profile()
    replicas = [make_replica(profile) for _ in range(5)]
    for n, replica in enumerate(replicas):
        # Each served ten minutes (one of them through a restart) before its engine died.
        _replica_events(replica, ("ready", 2400 - n * 60), ("ready", 900), ("failed", 300 - n))
    assert replacement_delay(replicas[-1], timezone.now()) == timedelta(seconds=5)


def test_an_unplaceable_replicas_reasons_are_worked_out_again_after_30_to_60_s(
    node_ids, django_capture_on_commit_callbacks
):
    connect(node_ids[0], engines=())
    apply_catalog(catalog(), actor=SETUP)
    with time_machine.travel(timezone.now(), tick=False) as clock:
        run(django_capture_on_commit_callbacks)
        replica = Replica.objects.get()
        assert replica.reasons[0].startswith("0/1 nodes available")
        connect(node_ids[1], engines=())  # the refusal would now say 0/2
        run(django_capture_on_commit_callbacks)
        replica.refresh_from_db()
        assert replica.reasons[0].startswith("0/1 nodes available")  # kept: worked out lately
        clock.shift(timedelta(seconds=61))
        run(django_capture_on_commit_callbacks)
        replica.refresh_from_db()
        assert replica.state == "unplaceable"
        assert replica.reasons[0].startswith("0/2 nodes available")
        # Placing is never put off: the engine appears, the next pass places it.
        connect(node_ids[0])
        run(django_capture_on_commit_callbacks)
        replica.refresh_from_db()
        assert replica.state == "starting"
