"""A replica across nodes stops the rank that connects before the ranks it connects to:
llama.cpp's rank 0 (``llama-server --rpc``) before its rpc-server workers, which it would
otherwise see vanish and abort with a backtrace; vLLM's workers before rank 0."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from audit.actors import AGENT_LINK
from audit.models import Event
from fleet.actions.replicas import stop_replica
from fleet.actions.shard_reports import record_shard_status
from fleet.models import Node, Replica
from fleet.planning.stop_order import HELD_STOP_LIMIT
from fleet.transitions import transition
from protocol import messages
from tests.factories import SETUP, make_replica, make_shard
from tests.fleet.cluster import connect, run
from tests.fleet.queues import clear_queue, queued_commands

pytestmark = pytest.mark.django_db


def stops(node_id: str) -> list[str]:
    return [args[0] for task, args in queued_commands(node_id) if task == "agent.stop_shard"]


def replica_across(node_ids: list[str], engine: str) -> tuple[Replica, list[str]]:
    """A ready replica of ``engine`` with one rank on each node; its shard ids by rank."""
    for node_id in node_ids:
        connect(node_id, engines=(engine,))
        clear_queue(node_id)
    replica = make_replica(engine=engine, state="ready")
    shards = [make_shard(replica, rank=rank, node_id=node_id, port=20000, state="ready")
              for rank, node_id in enumerate(node_ids)]  # fmt: skip
    return replica, [shard.id for shard in shards]


def stop(replica: Replica, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        assert stop_replica(replica, "restart requested", actor=SETUP)


def stopped(node_id: str, shard_id: str, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        message = messages.ShardStatus(shard_id=shard_id, state="stopped", seq=99)
        record_shard_status(node_id, message, actor=AGENT_LINK)


def test_llama_cpp_stops_rank_0_then_its_rpc_workers(node_ids, django_capture_on_commit_callbacks):
    replica, shards = replica_across(node_ids, "llama.cpp")

    stop(replica, django_capture_on_commit_callbacks)

    assert stops(node_ids[0]) == [shards[0]]
    assert stops(node_ids[1]) == stops(node_ids[2]) == []  # held: rank 0 still talks to them
    run(django_capture_on_commit_callbacks)
    assert stops(node_ids[1]) == stops(node_ids[2]) == []  # a pass does not send them early

    stopped(node_ids[0], shards[0], django_capture_on_commit_callbacks)

    assert stops(node_ids[1]) == [shards[1]]
    assert stops(node_ids[2]) == [shards[2]]
    said = Event.objects.filter(subject=str(replica.id), reason__startswith="stopping rank")
    assert [e.reason for e in said] == [
        "stopping rank 1, 2: the ranks that connect to them have stopped"
    ]
    run(django_capture_on_commit_callbacks)
    assert stops(node_ids[1]) == [shards[1]]  # sent once


def test_vllm_stops_its_workers_then_rank_0(node_ids, django_capture_on_commit_callbacks):
    replica, shards = replica_across(node_ids[:2], "vllm")

    stop(replica, django_capture_on_commit_callbacks)

    assert (stops(node_ids[0]), stops(node_ids[1])) == ([], [shards[1]])
    stopped(node_ids[1], shards[1], django_capture_on_commit_callbacks)
    assert stops(node_ids[0]) == [shards[0]]


def test_workers_stop_when_rank_0s_node_is_out_of_reach(
    node_ids, django_capture_on_commit_callbacks
):
    replica, shards = replica_across(node_ids[:2], "llama.cpp")
    transition(Node, node_ids[0], "unreachable", "no heartbeat for 16s", actor=SETUP)

    stop(replica, django_capture_on_commit_callbacks)
    assert stops(node_ids[1]) == []
    run(django_capture_on_commit_callbacks)  # no answer will come from rank 0: not waited for

    assert stops(node_ids[1]) == [shards[1]]
    said = Event.objects.filter(subject=str(replica.id), reason__startswith="stopping rank")
    assert [e.reason for e in said] == [
        "stopping rank 1: rank 0, connecting to them, is on a node out of reach"
    ]
    run(django_capture_on_commit_callbacks)
    assert stops(node_ids[1]) == [shards[1]]


def test_workers_stop_when_rank_0_never_answers_its_stop(
    node_ids, django_capture_on_commit_callbacks
):
    replica, shards = replica_across(node_ids[:2], "llama.cpp")
    stop(replica, django_capture_on_commit_callbacks)
    run(django_capture_on_commit_callbacks)
    assert stops(node_ids[1]) == []

    later = timezone.now() + HELD_STOP_LIMIT + timedelta(seconds=1)
    with time_machine.travel(later, tick=False):
        run(django_capture_on_commit_callbacks, now=later)

    assert stops(node_ids[1]) == [shards[1]]


def test_a_replica_on_one_node_stops_at_once(node_ids, django_capture_on_commit_callbacks):
    replica, shards = replica_across(node_ids[:1], "llama.cpp")
    stop(replica, django_capture_on_commit_callbacks)
    assert stops(node_ids[0]) == [shards[0]]
