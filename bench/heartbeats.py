"""Benchmark the agent link: how many nodes control plane processes hold at 5 s heartbeats.

Run: DATABASE_URL=postgresql://… REDIS_URL=redis://… .venv/bin/python -m bench.heartbeats
         [--agents 3000] [--processes 1] [--seconds 6] [--p99-limit-ms 1000]

It creates (once) and migrates a database ``llmgw_bench`` on the DATABASE_URL server, so
fake nodes never land in a real one, and starts two servers, each --processes daphne
processes sharing one listening socket (as `llmgw up` runs LLMGW_CONTROL_PLANE_PROCESSES):

- llmgw: the real control plane (``llmgw_site.asgi:application``), consumer, batcher and all;
- floor: the same daphne and settings with a Channels consumer that only answers probes:
  what getting a message through daphne and Channels costs at all. llmgw / floor says how
  close the real consumer is to that floor.

This process opens --agents websockets to each with the agent's own client options, links
them (a real register on llmgw), and sends ~0.9 KB heartbeats:

- paced: every agent sends one heartbeat per interval, randomly phased. The first step is
  the real 5 s; each next step offers 1.5x more by shortening the interval on the same
  sockets, until one fails. A socket at 1 s costs what five at 5 s do in messages, not in
  per-socket memory, GC or rows per batched flush (the flush is measured separately).
- saturation: up to 1000 agents send as fast as they are answered, in closed rounds of 5
  heartbeats and one acknowledgement probe. Several frames per socket read: an upper bound
  the paced steps, one frame per read as real agents send, do not reach.

What is measured:

- handled/s: heartbeats have no answer, so each paced step ends with a barrier: every agent
  sends an acknowledgement probe (a heartbeat with one unknown field, which llmgw parses,
  refuses, logs and answers with {"type":"error"}) and waits for it. One socket's messages
  are handled in order, so when all are back every heartbeat was handled. handled/s = sent
  / (window + drain), drain being the barrier's time less what it takes on an idle server.
- latency: 10 prober sockets (authenticated, never registered) each send a valid heartbeat
  every 100 ms, open loop; llmgw parses it and answers "send register first" (the
  heartbeat's path, less the in-memory record). The round trip is the wait in the server's
  loop plus this client's own delay, shown as "cli lag" so a slow client is not blamed on
  the server. This client runs with its garbage collector off for the same reason.
- the batched writer: afterwards, how many agents' rows hold a heartbeat from the run, and
  write_heartbeats timed alone at the row count the measured capacity would put in a flush.

A paced step passes when p99 is within --p99-limit-ms and drain within 1 s (or the limit, if
longer): a heartbeat waits at most that long and no backlog is left to grow. The default,
1 s, is a fifth of the heartbeat interval and far inside the 15 s after which a node is
unreachable. Nodes held
= best passing handled/s × 5. Loopback only; the phases are cut off at 150 s plus 20 ms per
agent (linking them), the whole run takes about 2 minutes at 3,000 agents, and every process
it starts is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.database import bench_django
from bench.heartbeat_fleet import (
    PER_ROUND,
    PROBERS,
    SATURATING_AGENTS,
    Bench,
    Link,
    Result,
    heartbeat_text,
    open_links,
)
from bench.heartbeat_floor import PROBER_PREFIX
from bench.heartbeat_servers import (
    BENCH_DATABASE,
    NODE_PREFIX,
    clear_bench_rows,
    fresh_rows,
    links_per_process,
    raise_open_files,
    start_daphnes,
    wait_serving,
)
from bench.processes import stop
from bench.report import ratio

# For the servers' phases, plus linking time per agent; the flush measurement after takes ~15 s.
HARD_LIMIT_SECONDS = 150
HARD_LIMIT_PER_AGENT = 0.02
LADDER_FACTOR = 1.5
LADDER_SECONDS = 80  # after llmgw's agents linked; the floor and the flush need the rest
MAX_FLUSH_ROWS = 30_000  # bounds the flush measurement's time and table size


def print_header() -> None:
    print(
        f"{'server':6} {'phase':16} {'offered/s':>9} {'handled/s':>9} {'msgs/s':>7} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'drain ms':>8} {'srv cpu':>7} "
        f"{'us/msg':>6} {'cli cpu':>7} {'cli lag p99':>11}",
        flush=True,
    )


def print_result(result: Result, limit: float) -> None:
    offered = f"{result.offered:9.0f}" if result.offered else f"{'max':>9}"
    in_window = result.probes if result.offered is None else 0  # not the barrier's
    messages = (result.sent + in_window) / result.elapsed
    verdict = "" if result.offered is None else ("  ok" if result.passes(limit) else "  FAIL")
    print(
        f"{result.server:6} {result.phase:16} {offered} {result.handled:9.0f} {messages:7.0f} "
        f"{result.p(0.5) * 1e3:7.1f} {result.p(0.99) * 1e3:7.1f} "
        f"{result.p(1.0) * 1e3:7.1f} {result.drain * 1e3:8.0f} "
        f"{result.server_cpu * 100:6.0f}% {result.cpu_per_message * 1e6:6.0f} "
        f"{result.client_cpu * 100:6.0f}% "
        f"{result.p(0.99, result.lag) * 1e3:9.1f}ms{verdict}",
        flush=True,
    )


async def run(args: argparse.Namespace, env: dict[str, str], tokens: dict[str, str]) -> dict:
    limit = args.p99_limit_ms / 1e3
    logs = Path(tempfile.mkdtemp(prefix="llmgw-bench-heartbeats-"))
    node_ids = [f"{NODE_PREFIX}{i:05d}" for i in range(args.agents)]
    prober_ids = [f"{PROBER_PREFIX}{i:02d}" for i in range(PROBERS)]
    processes: dict[str, list[subprocess.Popen]] = {}
    links: list[Link] = []
    # This client's own full collections over thousands of links would read as server latency.
    gc.disable()
    try:
        ports, log_paths = {}, {}
        apps = {"llmgw": "llmgw_site.asgi:application",
                "floor": "bench.heartbeat_floor:floor_application"}  # fmt: skip
        for name, app in apps.items():
            ports[name], processes[name], log_paths[name] = start_daphnes(
                app, args.processes, env, logs, name
            )
        for name in apps:
            await wait_serving(processes[name], log_paths[name])

        print(
            f"{args.processes} daphne process(es) per server on one socket; "
            f"{args.agents} agents + {PROBERS} probers per server, {args.seconds:.0f} s "
            f"windows; saturation: {min(args.agents, SATURATING_AGENTS)} agents in rounds "
            f"of {PER_ROUND} heartbeats + 1 probe; heartbeat {len(heartbeat_text(0))} B; "
            f"server logs in {logs}"
        )
        print_header()
        results: dict = {}
        for name in ("llmgw", "floor"):
            began = time.perf_counter()
            agents = await open_links(ports[name], node_ids, tokens, register=name == "llmgw")
            probers = await open_links(ports[name], prober_ids, tokens, register=False)
            links += agents + probers
            linked_in = time.perf_counter() - began
            spread = links_per_process(processes[name], ports[name])
            gc.collect()
            bench = Bench(name, [p.pid for p in processes[name]], agents, probers)
            await bench.calibrate()
            wall_start = time.time()
            runs = [await bench.paced(args.agents / 5, args.seconds, "paced 5 s")]
            print_result(runs[-1], limit)
            runs.append(await bench.saturate(args.seconds))
            print_result(runs[-1], limit)
            if name == "llmgw":
                # Steps of 1.5x from the real 5 s cadence up to saturation, stopping at the
                # first that fails, or early enough to leave the floor its turn.
                rate, top = args.agents / 5 * LADDER_FACTOR, runs[-1].handled * 1.2
                ladder_until = time.perf_counter() + LADDER_SECONDS
                while rate <= top and time.perf_counter() < ladder_until:
                    interval = args.agents / rate
                    runs.append(await bench.paced(rate, args.seconds, f"paced {interval:.2f} s"))
                    print_result(runs[-1], limit)
                    if not runs[-1].passes(limit):
                        break
                    rate *= LADDER_FACTOR
                await asyncio.sleep(2.5)  # the batcher flushes every 2 s
                fresh = await asyncio.to_thread(fresh_rows, env["DATABASE_URL"], wall_start)
                print(
                    f"llmgw  linked {args.agents} agents (register each) in {linked_in:.1f} s; "
                    f"links per process {spread}; batched writer: {fresh}/{args.agents} "
                    "nodes hold a heartbeat from this run"
                )
            else:
                print(
                    f"floor  connected {args.agents} agents in {linked_in:.1f} s; "
                    f"links per process {spread}"
                )
            results[name] = runs
            for link in agents + probers:
                link.abort()
        return results
    finally:
        for link in links:
            link.abort()
        for group in processes.values():
            stop(*group)
        gc.enable()


def measure_flush(rows: int) -> tuple[float, float]:
    """Time fleet.link.heartbeats.write_heartbeats for ``rows`` nodes: (wall, this thread's CPU).

    The batcher runs it on Channels' sync thread inside daphne, where its Python work holds
    the GIL the event loop needs; here it runs alone, so the CPU part is what it takes away.
    """
    from django.utils import timezone

    from fleet.link.heartbeats import write_heartbeats
    from fleet.models import Node

    ids = [f"{NODE_PREFIX}{i:05d}" for i in range(rows)]
    missing = set(ids) - set(Node.objects.filter(id__in=ids).values_list("id", flat=True))
    Node.objects.bulk_create([Node(id=node_id) for node_id in sorted(missing)], batch_size=5000)
    usage = json.loads(heartbeat_text(0))["usage"]
    samples = []
    for _ in range(4):
        batch = {node_id: (timezone.now(), usage) for node_id in ids}
        wall, cpu = time.perf_counter(), time.thread_time()
        write_heartbeats(batch)
        samples.append((time.perf_counter() - wall, time.thread_time() - cpu))
    return sorted(samples[1:])[1]  # the median after a warm-up


def summarize(args: argparse.Namespace, results: dict) -> None:
    from fleet.link.heartbeats import FLUSH_INTERVAL

    limit = args.p99_limit_ms / 1e3
    real, floor = results["llmgw"], results["floor"]
    real_sat = next(r for r in real if r.offered is None)
    floor_sat = next(r for r in floor if r.offered is None)
    print()
    print(
        "p50/p99/max: prober round trips (a valid heartbeat on an unregistered link, answered "
        "'send register first'); handled/s: heartbeats sent / (window + drain), drain: time "
        "until every agent's barrier probe was answered, less that on an idle server; msgs/s "
        "adds the probes; srv cpu: the daphne processes together, 100% = one core; us/msg: "
        "their CPU per message received; cli lag: how late this client sent"
    )
    print(
        f"saturation heartbeats/s: llmgw {real_sat.handled:.0f}, floor "
        f"{floor_sat.handled:.0f}; llmgw / floor = {ratio(real_sat.handled, floor_sat.handled)}; "
        f"per server CPU-second (steadier when other work shares the machine): llmgw / floor "
        f"= {ratio(floor_sat.cpu_per_message, real_sat.cpu_per_message)}"
    )
    print(
        f"p99 at 5 s heartbeats ({args.agents} agents): llmgw "
        f"{real[0].p(0.99) * 1e3:.1f} ms, floor {floor[0].p(0.99) * 1e3:.1f} ms"
    )
    passing = [r for r in real if r.offered is not None and r.passes(limit)]
    if not passing:
        print(f"no paced step kept p99 <= {args.p99_limit_ms:.0f} ms and drain <= 1 s")
        return
    best = max(passing, key=lambda r: r.handled)
    nodes = int(best.handled * 5)
    print(
        f"nodes {args.processes} control plane process(es) hold at 5 s heartbeats: {nodes:,} "
        f"(sustained {best.handled:.0f} heartbeats/s at p99 {best.p(0.99) * 1e3:.0f} ms "
        f"<= {args.p99_limit_ms:.0f} ms, step '{best.phase}', {args.agents} sockets)"
    )
    # The ladder reuses --agents sockets, so each 2 s flush held at most that many rows;
    # that many real nodes would put more in every flush. Measure the flush at that size.
    measured_rows = min(args.agents, int(best.handled * FLUSH_INTERVAL))
    at_capacity = min(MAX_FLUSH_ROWS, int(nodes / 5 * FLUSH_INTERVAL))
    small_wall, small_cpu = measure_flush(measured_rows)
    wall, cpu = measure_flush(at_capacity)
    share = max(0.0, cpu - small_cpu) / FLUSH_INTERVAL
    print(
        f"batched flush (write_heartbeats, measured alone): {measured_rows} rows "
        f"{small_wall * 1e3:.0f} ms wall / {small_cpu * 1e3:.0f} ms CPU (as in the steps "
        f"above); {at_capacity} rows, as {nodes:,} nodes would fill one, "
        f"{wall * 1e3:.0f} ms wall / {cpu * 1e3:.0f} ms CPU"
    )
    print(
        f"projected with that flush's extra CPU taken from the event loop's core "
        f"({share:.0%}): about {int(nodes * (1 - share)):,} nodes at 5 s heartbeats "
        f"(a first-order estimate, not a measurement)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=3000, help="websockets per server")
    parser.add_argument("--seconds", type=float, default=6.0, help="window per phase")
    parser.add_argument(
        "--processes", type=int, default=1,
        help="daphne processes per server, sharing one listening socket as `llmgw up` runs "
        "them with LLMGW_CONTROL_PLANE_PROCESSES",
    )  # fmt: skip
    parser.add_argument(
        "--p99-limit-ms", type=float, default=1000.0, help="acceptable p99 (see the top)"
    )
    args = parser.parse_args()

    raise_open_files(args.agents + PROBERS + 256)
    extra = {
        "LOG_LEVEL": os.environ.get("LOG_LEVEL", "INFO"),
        "PYTHONUNBUFFERED": "1",
        # Simulated agents link with tokens: the migration path, as old agents do.
        "LLMGW_NODE_AUTH": "token",
    }
    # This process uses the servers' settings too: tokens signed with their SECRET_KEY
    # through the control plane's own code, and the flush measured on the same database.
    with bench_django(BENCH_DATABASE, **extra) as env:
        clear_bench_rows(env["DATABASE_URL"])  # an earlier run's, if it was stopped
        try:
            measure(args, env)
        finally:
            clear_bench_rows(env["DATABASE_URL"])


def measure(args: argparse.Namespace, env: dict[str, str]) -> None:
    from fleet.pki.tokens import node_token

    ids = [f"{NODE_PREFIX}{i:05d}" for i in range(args.agents)]
    ids += [f"{PROBER_PREFIX}{i:02d}" for i in range(PROBERS)]
    tokens = {node_id: node_token(node_id) for node_id in ids}

    hard_limit = HARD_LIMIT_SECONDS + HARD_LIMIT_PER_AGENT * args.agents

    async def bounded() -> dict:
        return await asyncio.wait_for(run(args, env, tokens), timeout=hard_limit)

    try:
        summarize(args, asyncio.run(bounded()))
    except TimeoutError:
        raise SystemExit(f"the bench ran past {hard_limit:.0f} s and was stopped") from None


if __name__ == "__main__":
    main()
