"""The control loop after restarts, with real daphne, reconciler, agents and engine processes.

The engines are stand-ins (``support.fake_engines``) that the agents are told of and
launch with the adapters' real command lines, so each case takes seconds, not a model load.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from django.db import transaction
from django.utils import timezone
from websockets.sync.client import connect

from audit.models import Event
from catalog.actions.entries import apply_catalog
from catalog.models import Profile
from fleet import commands
from fleet.models import Node, Replica, Shard
from fleet.pki.keys import replica_secret
from fleet.pki.tokens import node_token
from fleet.planning.shard_specs import MeetingPoints, shard_spec
from protocol import messages
from tests.factories import SETUP
from tests.fleet.inventories import inventory
from tests.fleet.queues import clear_queue
from tests.processes.support import (
    Process,
    agent,
    control_plane,
    fake_engines,
    free_port,
    kill_engines_under,
    listening,
    reconciler,
    wait_until,
)

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


class Cluster:
    """One control plane, its reconciler and agents on this machine, restartable at will."""

    def __init__(self, processes: list[Process], tmp_path: Path, **settings: str) -> None:
        self.processes = processes
        self.tmp_path = tmp_path
        self.port = free_port()
        self.env = {
            "LLMGW_LEADER_LEASE_KEY": f"llmgw:test-leader:{uuid.uuid4().hex[:8]}",
            "LLMGW_CONTROL_PLANE_ID": f"ws://127.0.0.1:{self.port}",
            "LLMGW_ENGINE_PORT_BASE": str(free_port()),
            "LLMGW_DEMO": "0",
            **settings,
        }
        self.engines = fake_engines(tmp_path)
        self.nodes: list[str] = []

    def start_control_plane(self) -> Process:
        web = control_plane(self.port, self.tmp_path, **self.env).start()
        self.processes.append(web)
        wait_until(lambda: listening(self.port), 60, "the control plane")
        return web

    def start_reconciler(self) -> Process:
        name = f"reconciler-{uuid.uuid4().hex[:6]}"
        beat = reconciler(name, self.tmp_path, **self.env).start()
        self.processes.append(beat)
        return beat

    def start_agent(self, node_id: str) -> Process:
        home = self.tmp_path / node_id
        server = f"ws://127.0.0.1:{self.port}"
        worker = agent(
            node_id, server, node_token(node_id), home, self.tmp_path, LLMGW_ENGINES=self.engines
        )
        self.processes.append(worker.start())
        if node_id not in self.nodes:
            self.nodes.append(node_id)
        return worker

    def new_node(self) -> tuple[str, Process]:
        node_id = f"rs-{uuid.uuid4().hex[:6]}"
        worker = self.start_agent(node_id)
        return node_id, worker

    def close(self) -> None:
        for node_id in self.nodes:
            clear_queue(node_id)
            kill_engines_under(self.tmp_path / node_id)


@pytest.fixture
def cluster(processes, tmp_path):
    made: list[Cluster] = []

    def make(**settings: str) -> Cluster:
        made.append(Cluster(processes, tmp_path, **settings))
        return made[-1]

    yield make
    for each in made:
        each.close()


def connected(node_id: str) -> bool:
    return Node.objects.filter(id=node_id, state="connected").exists()


def registered_after(node_id: str, moment) -> bool:
    return Node.objects.filter(id=node_id, state="connected", registered_at__gt=moment).exists()


def one_gpu_catalog(name: str, engine: str, source: str, nodes: int = 1) -> str:
    return f"""
models:
  - name: {name}
    source: {source}
    profiles:
      - name: p
        engine: {engine}
        replicas: 1
        nodes: {nodes}
        gpus_per_rank: {1 if nodes > 1 else 0}
        memory: 64MiB
        startup_timeout: 60
"""


def serving_one_replica(c: Cluster, tmp_path: Path) -> tuple[Process, str, Process, Replica, Shard]:
    """A control plane, its reconciler and one agent serving one placed llama.cpp replica."""
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    web = c.start_control_plane()
    c.start_reconciler()
    node_id, worker = c.new_node()
    wait_until(lambda: connected(node_id), 60, "the agent")
    apply_catalog(one_gpu_catalog("tiny", "llama.cpp", str(model)), actor=SETUP)
    wait_until(lambda: Replica.objects.filter(model_name="tiny", state="ready").exists(), 60,
             "the replica to be ready")  # fmt: skip
    replica = Replica.objects.get(model_name="tiny")
    return web, node_id, worker, replica, replica.shards.get()


def place_two_rank_replica(nodes: list[str]) -> Replica:
    """A 2-rank vLLM replica as the reconciler would create it, started on two agents.

    Placement needs real GPUs and a fabric for this; the replica and its shards are made
    here instead, and the agents get real signed start commands for them.
    """
    free = [free_port(), free_port(), free_port()]
    with transaction.atomic():
        apply_catalog(one_gpu_catalog("stub-2", "vllm", "test/stub-model", nodes=2), actor=SETUP)
        profile = Profile.objects.get(model__name="stub-2")
        replica_id = uuid.uuid4()
        replica = Replica.objects.create(
            id=replica_id, model_name="stub-2", profile_name="p", profile=profile,
            fingerprint=profile.fingerprint(), secret=replica_secret(replica_id),
            state="starting", starting_since=timezone.now(),
        )  # fmt: skip
        shards = [
            Shard.objects.create(
                id=Shard.new_id(),
                replica=replica,
                rank=rank,
                node_id=node_id,
                gpus=[0],
                port=free[rank],
            )  # fmt: skip
            for rank, node_id in enumerate(nodes)
        ]
        meeting = MeetingPoints(f"127.0.0.1:{free[2]}", (f"127.0.0.1:{free[1]}",))
        for shard in shards:
            node = Node.objects.get(id=shard.node_id)
            spec = shard_spec(replica, shard, node, 2, meeting, None, 0)
            transaction.on_commit(lambda n=node.id, s=spec: commands.send_start_shard(n, s))
    return replica


def test_control_plane_restarted_as_both_agents_of_a_two_rank_replica_adopt_it(cluster):
    """The history's "finish adopting": no replica failed, no engine restarted, and the
    replica never left ready (both ranks answer at adoption: rank 0 its health check, the
    worker by having lived past its settling time)."""
    c = cluster()
    web = c.start_control_plane()
    c.start_reconciler()
    (node_a, agent_a), (node_b, agent_b) = c.new_node(), c.new_node()
    wait_until(lambda: connected(node_a) and connected(node_b), 60, "both agents")
    replica = place_two_rank_replica([node_a, node_b])
    wait_until(lambda: Replica.objects.get(id=replica.id).state == "ready", 60,
             "the two-rank replica to be ready (the worker settles 10 s)")  # fmt: skip
    engines = {shard.id: shard.pid for shard in Shard.objects.filter(replica=replica)}
    assert all(engines.values())
    # It has served for two hours when both agents restart and re-check their engines.
    Replica.objects.filter(id=replica.id).update(starting_since=timezone.now() - timedelta(hours=2))
    since = timezone.now()
    agent_a.kill()
    agent_b.kill()
    c.start_agent(node_a)
    c.start_agent(node_b)
    wait_until(lambda: registered_after(node_a, since) and registered_after(node_b, since), 60,
             "both new agents to register")  # fmt: skip
    # The control plane restarts while the new agents' reports are landing.
    again = timezone.now()
    web.kill()
    web = c.start_control_plane()
    wait_until(lambda: registered_after(node_a, again) and registered_after(node_b, again), 60,
             "both agents to register with the new control plane")  # fmt: skip
    assert Replica.objects.get(id=replica.id).state == "ready"
    left = Event.objects.filter(at__gt=since, from_state="ready")
    assert not left.filter(subject__in=[str(replica.id), *engines]).exists(), list(
        left.values_list("subject", "reason")
    )
    assert {s.id: s.pid for s in Shard.objects.filter(replica=replica)} == engines
    assert all(psutil.pid_exists(pid) for pid in engines.values())
    assert Shard.objects.filter(replica=replica).count() == 2
    assert Replica.objects.filter(model_name="stub-2").count() == 1  # nothing replaced


def test_agent_restarted_during_an_outage_does_not_take_a_ready_replica_back(cluster, tmp_path):
    """Statuses queued while unlinked are older than the register that follows them."""
    c = cluster()
    web, node_id, worker, replica, shard = serving_one_replica(c, tmp_path)
    # The agent runs with the node token, the broker, the database: its engine sees none.
    engine_env = psutil.Process(shard.pid).environ()
    leaked = [name for name in engine_env if name.startswith(("LLMGW_", "CELERY", "DJANGO"))
              and not name.startswith("LLMGW_LABEL_")]  # fmt: skip
    leaked += [name for name in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY") if name in engine_env]
    assert not leaked and engine_env["PATH"] == worker.env["PATH"]

    # The outage: the control plane goes down, and the agent restarts while it is down.
    web.kill()
    worker.kill()
    ready_line = f"shard {shard.id} ready"
    before = worker.output().count(ready_line)  # agents of one node share a log file
    worker = c.start_agent(node_id)
    wait_until(lambda: worker.output().count(ready_line) > before, 60,
             "the new agent to adopt the engine and find it healthy, unlinked")  # fmt: skip
    since = timezone.now()
    c.start_control_plane()
    wait_until(lambda: registered_after(node_id, since), 60, "the agent to register again")
    # The statuses it queued go out right after the register: let them all land.
    heard = Node.objects.get(id=node_id).last_heartbeat
    wait_until(lambda: Node.objects.get(id=node_id).last_heartbeat > heard, 30, "a heartbeat")
    assert Replica.objects.get(id=replica.id).state == "ready"
    went_back = Event.objects.filter(at__gt=since, from_state="ready")
    assert not went_back.filter(subject__in=[str(replica.id), shard.id]).exists(), list(
        went_back.values_list("subject", "reason")
    )
    assert Shard.objects.get(id=shard.id).pid == shard.pid


def test_a_lost_node_returning_with_shards_of_stopped_replicas_stops_them(cluster, tmp_path):
    c = cluster(LLMGW_NODE_UNREACHABLE_AFTER="2", LLMGW_NODE_LOST_AFTER="4")
    _web, node_id, worker, replica, shard = serving_one_replica(c, tmp_path)
    assert psutil.pid_exists(shard.pid)
    other, _other_agent = c.new_node()  # somewhere for the replica to go
    wait_until(lambda: connected(other), 60, "the second agent")

    worker.kill()  # the node goes silent; its engine keeps running
    wait_until(lambda: Node.objects.get(id=node_id).state == "lost", 60, "the node to be lost")
    wait_until(lambda: Replica.objects.get(id=replica.id).state == "stopped", 60,
             "its replica to be moved off it")  # fmt: skip
    wait_until(lambda: Shard.objects.filter(node_id=other, replica__model_name="tiny").exists(),
             60, "its replacement to be placed on the other node")  # fmt: skip
    clear_queue(node_id)  # the node stays away until its stop command has expired
    c.start_agent(node_id)
    wait_until(lambda: not psutil.pid_exists(shard.pid), 60,
             "the returning node's orphan engine to be stopped")  # fmt: skip
    assert Replica.objects.get(id=replica.id).state == "stopped"
    assert Shard.objects.get(id=shard.id).state == "stopped"


def test_a_node_reporting_another_nodes_shard_is_refused_and_changes_nothing(cluster):
    c = cluster()
    c.start_control_plane()
    c.start_reconciler()
    node_a, _agent = c.new_node()
    wait_until(lambda: connected(node_a), 60, "the agent")
    replica = place_two_rank_replica([node_a, node_a])
    wait_until(lambda: Shard.objects.filter(replica=replica, rank=0, state="ready").exists(), 60,
             "rank 0 to be ready")  # fmt: skip
    rank0 = Shard.objects.get(replica=replica, rank=0)

    intruder = f"rs-{uuid.uuid4().hex[:6]}"
    spec = shard_spec(
        replica, rank0, Node.objects.get(id=node_a), 2, MeetingPoints("127.0.0.1:1"), None, 0
    )
    register = messages.Register(
        inventory=inventory(intruder, address="127.0.0.1"), engines_probed=True,
        shards=[messages.ReportedShard(spec=spec, state="failed", pid=1, seq=10**12)],
    )  # fmt: skip
    headers = {"Authorization": f"Bearer {node_token(intruder)}", "X-Llmgw-Node": intruder}
    with connect(f"ws://127.0.0.1:{c.port}/agent/", additional_headers=headers) as ws:
        ws.send(register.model_dump_json())
        assert json.loads(ws.recv(timeout=10))["type"] == "linked"
    refusal = wait_until(
        lambda: Event.objects.filter(subject=intruder, reason__startswith="refused").first(),
        10, "the refusal to be recorded",
    )  # fmt: skip
    assert f"belongs to {node_a}" in refusal.reason
    after = Shard.objects.get(id=rank0.id)
    assert (after.node_id, after.state, after.pid) == (node_a, "ready", rank0.pid)
    assert Replica.objects.get(id=replica.id).state != "failed"
