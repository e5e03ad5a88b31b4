"""The walls around engines in a simulated fleet: ``bench.hostile_node``'s short form (every
attempt refused, legitimate traffic unharmed), each shard's rules on its node from start to
stop and across an agent restart, and a router that joins reaching engines at the next
pass, then walled out again once it leaves.

Three node hosts: node1 and node2 share fabric ib-a and hold the replica split across
nodes (llama.cpp's RPC); the one-node replica lands anywhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from agent_worker.walls.nftables import walled_ports
from agent_worker.walls.rules import chain_name
from bench import hostile_node, sim
from bench import multinode_support as support
from bench.hostile.engine_user import runs_as_root
from bench.hostile.rows import allowed, table
from bench.hostile.scene import Rank, read_scene
from bench.processes import REPO
from llmgw_cli.sim import hosts, network, probes
from llmgw_cli.sim.fleet import simulated_fleet
from llmgw_cli.sim.hosts import Host
from llmgw_cli.sim.state import Fleet
from tests.processes.support import wait_until

# Not "another fleet is running": the test waits for the machine-wide lock, then removes
# what an earlier one left, as every simulated-fleet test does.
CANNOT_RUN = support.refusal(others_count=False)
pytestmark = [pytest.mark.process, pytest.mark.skipif(bool(CANNOT_RUN), reason=str(CANNOT_RUN))]

MANAGE = str(REPO / "manage.py")


def test_walls_refuse_every_hostile_attempt_follow_shards_and_routers(tmp_path):
    # replace: under the lock, a fleet running now is one a killed test left.
    fleet_up = simulated_fleet(hostile_node.NODES, tmp_path / "sim", demo=False, replace=True)
    with fleet_up as fleet:
        missing = hostile_node.serve_both(fleet, time.monotonic() + 300)
        assert not missing, "\n".join(support.diagnose(fleet, missing))

        outcome = hostile_node.attack(fleet, rounds=1)
        assert allowed(outcome.rows) == [], table(outcome.rows)
        assert outcome.sent > 0 and outcome.failed == [], outcome.failed

        scene = read_scene(fleet, hostile_node.MODELS)
        for rank in scene.ranks:  # rpc-server and llama-server alike: the engine user's
            assert runs_as_root(rank, rank.model).blocked, runs_as_root(rank, rank.model)
        for rank in scene.ranks:  # each shard's ports, in its own node's table
            assert walled(rank.node)[chain_name(rank.shard)] == [rank.port, rank.port + 1]

        worker = scene.rpc_workers[0]
        an_agent_restart_walls_exactly_what_it_adopts(fleet, worker)
        [split] = [r for r in scene.http_ranks if r.world_size > 1]
        a_router_that_joins_reaches_engines_and_one_that_leaves_does_not(fleet, split)
        [alone] = [r for r in scene.ranks if r.world_size == 1]
        a_stopped_shard_leaves_no_rule(fleet, alone)


def walled(node: str) -> dict[str, list[int]]:
    return {chain: sorted(ports) for chain, ports in network.in_host(node, walled_ports).items()}


def an_agent_restart_walls_exactly_what_it_adopts(fleet: Fleet, worker: Rank) -> None:
    """The agent is killed (its rpc-server runs on), a stale wall is left behind, and the
    next agent keeps the adopted shard's wall and removes the stale one."""
    os.kill(fleet.pid(worker.node, "agent"), signal.SIGKILL)
    stale = (
        "add chain inet llmgw shard-stale\n"
        "add element inet llmgw shard_ports { 29998 : jump shard-stale }\n"
    )
    network.in_host(worker.node, lambda: subprocess.run(
        ["nft", "-f", "-"], input=stale, text=True, check=True, capture_output=True))  # fmt: skip
    assert "shard-stale" in walled(worker.node)
    before = registered_at(fleet, worker.node)
    fleet.restart(worker.node, "agent")
    wait_until(lambda: registered_at(fleet, worker.node) != before, 120, "the agent to register")
    wait_until(lambda: walled(worker.node) == {chain_name(worker.shard): [worker.port,
               worker.port + 1]}, 30, "the adopted shard's wall alone")  # fmt: skip
    assert sim.answers(fleet, sim.api_key(fleet), worker.model, timeout=60)


def a_router_that_joins_reaches_engines_and_one_that_leaves_does_not(
    fleet: Fleet, rank0: Rank
) -> None:
    """A second router on node3 (no rank of the split replica there): refused by rank 0's
    node until the pass after its first report, served from then on, and refused again
    once it stops."""
    host = Host("node3", "router", "198.18.1.3")
    log = (fleet.directory / "logs" / "node3-router2.log").open("ab")
    popen = subprocess.Popen(
        fleet.command(host.name, hosts.router_command(host)), env=fleet.env[hosts.ROUTER],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    fleet.record(host.name, "router2", popen.pid, fleet.directory / "logs" / "node3-router2.log")
    url = f"http://{host.address}:{hosts.ROUTER_PORT}"
    wait_until(lambda: probes.listening(host, hosts.ROUTER_PORT), 120, "the second router")
    wait_until(lambda: chat(fleet, url, rank0.model), 60, "an answer through the new router")
    told = sim.query(fleet, "SELECT subject FROM audit_event WHERE reason LIKE %s",
                     (f"engine HTTP ports admit: %{host.address}%",))  # fmt: skip
    assert rank0.node in {subject for (subject,) in told}

    os.killpg(popen.pid, signal.SIGTERM)  # a clean stop: it says it left
    popen.wait(timeout=30)
    log.close()

    def refused() -> bool:
        state = network.in_host(host.name, lambda: port_state(rank0.address, rank0.port))
        return state == "refused"

    wait_until(refused, 30, "the router that left to be walled out")


def a_stopped_shard_leaves_no_rule(fleet: Fleet, rank: Rank) -> None:
    assert chain_name(rank.shard) in walled(rank.node)
    delete = [sys.executable, MANAGE, "llmgw_ctl", "delete", "model", rank.model]
    done = fleet.run(hosts.CONTROL_PLANES[0], delete)
    assert done.returncode == 0, done.stderr[-2000:]
    wait_until(lambda: chain_name(rank.shard) not in walled(rank.node), 60,
               "the stopped shard's wall to go")  # fmt: skip


def registered_at(fleet: Fleet, node: str) -> object:
    return sim.query(fleet, "SELECT registered_at FROM fleet_node WHERE id = %s", (node,))[0][0]


def chat(fleet: Fleet, url: str, model: str) -> bool:
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi."}]}
    key = sim.api_key(fleet)

    def ask() -> bool:
        try:
            answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60,
                                headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    return network.in_host(hosts.SERVICES, ask)


def port_state(address: str, port: int) -> str:
    import socket

    try:
        socket.create_connection((address, port), timeout=2).close()
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return type(exc).__name__
    return "connected"
