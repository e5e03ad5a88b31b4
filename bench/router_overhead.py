"""Benchmark the router: the same load sent straight to an engine, through nginx, and
through the router, in turns, in one run.

Run: .venv/bin/python -m bench.router_overhead [--seconds 3] [--concurrency 1,16,64]
         [--processes 1,2] [--routers own+lean,uvicorn+lean,uvicorn+aiohttp,daphne+lean]
         [--static] [--no-nginx] [--no-install-nginx]

A fast fake engine (tests/router/fake_engine.py, no delays, 8 chunks per stream) runs as
its own process; the load generator is this process (aiohttp, one connection per worker).
By default the router runs as a fleet runs it, every feature on (bench/router_fleet.py):
its table and key from PostgreSQL (``DATABASE_URL``; the bench migrates a database of its
own beside it, ``llmgw_bench_router``), the key's limits held in Redis (``REDIS_URL``; the
default key's cap alone is leased in blocks; ``--budget N`` gives the keys a day's budget,
each request then admitted and settled by a script), usage journalled and written, routing
by prefix, moves of broken streams, request ids and a log line per request. ``--static``
runs it from a static file instead (no database, no Redis, no usage: nothing but the
checkout). ``--processes`` runs that many router processes on one port
(``LLMGW_ROUTER_PROCESSES``).

nginx (one worker, Debian's ``nginx-light``, installed with apt-get where absent and run
as root; the row is skipped with the reason otherwise: bench/nginx.py) proxies the same
engine: the ceiling a proxy reaches on this machine. For each concurrency, streaming and
not, it prints latency p50/p99 direct and through each proxy, the latency each adds, its
throughput as a fraction of direct, and the router's as a fraction of nginx's. A router
variant is a server and an outbound client: ``own`` (router/wire/server.py), ``uvicorn``
or ``daphne``; ``lean`` (router/wire/upstream.py, what production runs) or ``aiohttp``
(bench/aiohttp_upstream.py, kept to measure against); ``own+lean`` is what `llmgw up`
runs, ``own+task`` the same with its express way off (every request on the task path,
``LLMGW_ROUTER_EXPRESS=false``). With ``--static``, two floors: ``own+bare``
(bench/bare_proxy.py: the router's own server and client, nothing between) and
``raw+bare`` (bench/raw_proxy.py: the least a proxy in Python does). Each measurement
runs --seconds after a short warm-up, in ROUNDS slices taken in turns.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import aiohttp
import psutil

from bench.database import bench_django
from bench.engines import ENGINE_SECRET, KEY, serve_fake_engine, serve_router
from bench.nginx import nginx_binary, serve_nginx
from bench.processes import cpu_seconds, run_until_signalled, stop
from bench.report import percentile, ratio
from bench.router_fleet import make_catalog, serve_fleet_routers

WARMUP_SECONDS = 0.3  # connections opened, before each slice is measured
ROUNDS = 3  # each measurement is this many slices, direct and routers taking turns
STREAMS = {"both": (False, True), "no": (False,), "yes": (True,)}
# The goal (45): the router's throughput at least this share of nginx's.
GOAL_OF_NGINX = 0.80


async def measure(
    url: str, concurrency: int, stream: bool, seconds: float, key: str
) -> tuple[list[float], int, dict[int, int]]:
    """Latencies (s) of requests begun and finished in the window; 200s finished in it;
    any other answers, by status (counted, not measured: a refusal is no answer)."""
    body = b'{"model":"bench","messages":[{"role":"user","content":"hello there"}]' + (
        b',"stream":true}' if stream else b"}"
    )
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    latencies: list[float] = []
    finished = 0
    refused: dict[int, int] = {}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        now = time.perf_counter()
        window_start = now + WARMUP_SECONDS
        window_end = window_start + seconds

        async def worker() -> None:
            nonlocal finished
            while True:
                began = time.perf_counter()
                if began >= window_end:
                    return
                async with session.post(url, data=body, headers=headers) as response:
                    if stream:
                        async for _data in response.content.iter_any():
                            pass
                    else:
                        await response.read()
                if response.status != 200:
                    refused[response.status] = refused.get(response.status, 0) + 1
                    await asyncio.sleep(0.01)  # not a busy loop of refusals
                    continue
                done = time.perf_counter()
                if window_start <= done <= window_end:
                    finished += 1
                    if began >= window_start:
                        latencies.append(done - began)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, finished, refused


class Target(NamedTuple):
    """Where the load goes, with which key, and the processes whose CPU it costs."""

    url: str
    key: str
    pids: list[int]


def family(process) -> list[int]:
    """A process and its children (nginx's worker)."""
    return [process.pid, *(c.pid for c in psutil.Process(process.pid).children(recursive=True))]


def cpu_per_request(seconds: float, answers: int) -> str:
    return f"{seconds / answers * 1e6:.0f}us" if answers else "-"


class Slices:
    """What a target's slices took: wall time, CPU of its processes and of the whole
    machine, answers counted. The CPU runs through each slice's warm-up too, under the
    same load: it is taken as a rate over the slice's wall time, times the window."""

    def __init__(self) -> None:
        self.wall = self.own = self.machine = 0.0

    def add(self, wall: float, own: float, machine: float) -> None:
        self.wall += wall
        self.own += own
        self.machine += machine

    def in_window(self, seconds: float) -> tuple[float, float]:
        """CPU seconds of its processes and of the machine in ``seconds`` of windows."""
        if not self.wall:
            return 0.0, 0.0
        return self.own / self.wall * seconds, self.machine / self.wall * seconds


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy, all cores together."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def room(machine: float, own: float, answers: int) -> float:
    """The most of the router's CPU an answer (s) can cost for it to answer GOAL_OF_NGINX of
    what nginx did, where the load generator, the engine and the proxy share the machine's
    cores: kept as busy as nginx's run kept them (at best), an answer may cost the machine
    1 / GOAL_OF_NGINX of what it cost through nginx, and what is not the proxy's own (the
    load generator's, the engine's, the kernel's) is the same through either."""
    through_nginx = machine / answers
    return through_nginx / GOAL_OF_NGINX - (through_nginx - own / answers)


async def start_targets(
    args: argparse.Namespace, workdir: Path, processes: list, sockets: list,
    env: dict[str, str] | None,
) -> dict[str, Target]:  # fmt: skip
    """The engine, nginx before it and each router variant, started, by name."""
    from asgiref.sync import sync_to_async

    engine = await serve_fake_engine(workdir / "engine.log", 8, processes)
    path = "/v1/chat/completions"
    targets = {"direct": Target(f"{engine.url}{path}", ENGINE_SECRET, family(engine.process))}
    if args.nginx:
        binary, why_not = nginx_binary(install=args.install_nginx)
        if binary is None:
            print(f"nginx row skipped: {why_not}", flush=True)
        else:
            nginx = await serve_nginx(binary, engine.url, ENGINE_SECRET, workdir / "nginx",
                                      processes)  # fmt: skip
            targets["nginx"] = Target(f"{nginx.url}{path}", KEY, family(nginx.process))
    counts = [int(n) for n in args.processes.split(",")]
    names = [
        variant if count == 1 else f"{variant} x{count}"
        for variant in args.routers.split(",") for count in counts
    ]  # fmt: skip
    keys = dict.fromkeys(["before", *names], KEY)
    if env is not None:
        port = int(engine.url.rsplit(":", 1)[1])
        keys = await sync_to_async(make_catalog)(port, list(keys), args.budget)
    if args.before:  # another checkout's router, as a fleet runs it, one process
        router = await serve_fleet_routers(1, env or {}, workdir, processes, sockets, "default",
                                           checkout=Path(args.before))  # fmt: skip
        targets["before"] = Target(f"{router.url}{path}", keys["before"], family(processes[-1]))
    for variant in args.routers.split(","):
        server, client = variant.split("+")
        for count in counts:
            name = variant if count == 1 else f"{variant} x{count}"
            if env is None:
                if count != 1:
                    raise SystemExit("--static measures one router process")
                router = await serve_router(
                    workdir / "static.yaml", [{"name": "bench", "endpoints": [
                        {"url": engine.url, "secret": ENGINE_SECRET}]}],
                    workdir / f"router-{server}-{client}.log", processes, server, client,
                )  # fmt: skip
            else:
                router = await serve_fleet_routers(count, env, workdir, processes, sockets,
                                                   server, client)  # fmt: skip
            pids = [pid for p in processes[-count:] for pid in family(p)]
            targets[name] = Target(f"{router.url}{path}", keys[name], pids)
    return targets


async def run(args: argparse.Namespace, env: dict[str, str] | None = None) -> None:
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
    processes: list = []
    sockets: list = []
    try:
        targets = await start_targets(args, workdir, processes, sockets, env)
        print(
            f"{'path':22} {'stream':6} {'conc':>4} | {'direct p50':>10} {'p99':>7} | "
            f"{'p50':>8} {'p99':>7} | {'added p50':>9} {'p99':>7} | "
            f"{'direct r/s':>10} {'r/s':>7} {'ratio':>6} {'of nginx':>8} | {'CPU/req':>8} "
            f"{'machine':>8} {'busy':>6}"
        )
        for stream in STREAMS[args.stream]:
            for concurrency in concurrencies:
                # Slices taken in turn, so a change in the machine's other load during the
                # run weighs on direct and proxied alike.
                latencies: dict[str, list[float]] = {name: [] for name in targets}
                answers = dict.fromkeys(targets, 0)
                slices = {name: Slices() for name in targets}
                refused: dict[str, dict[int, int]] = {name: {} for name in targets}
                for _round in range(ROUNDS):
                    for name, target in targets.items():
                        began = (time.perf_counter(), cpu_seconds(*target.pids),
                                 machine_busy_seconds())  # fmt: skip
                        slice_latencies, slice_answers, slice_refused = await measure(
                            target.url, concurrency, stream, args.seconds / ROUNDS, target.key
                        )
                        slices[name].add(time.perf_counter() - began[0],
                                         cpu_seconds(*target.pids) - began[1],
                                         machine_busy_seconds() - began[2])  # fmt: skip
                        latencies[name] += slice_latencies
                        answers[name] += slice_answers
                        for status, count in slice_refused.items():
                            refused[name][status] = refused[name].get(status, 0) + count
                print_rows(stream, concurrency, args.seconds, latencies, answers, slices,
                           refused)  # fmt: skip
        print("ratio = r/s / direct r/s; of nginx = the router's ratio / nginx's; "
              "added = latency - direct latency; CPU/req = CPU per answer of the processes "
              "named (direct: the engine's own); machine = the whole machine's CPU per "
              "answer, and how many of its cores were busy; room = the router's CPU an "
              f"answer at which it would reach {GOAL_OF_NGINX:.2f} of nginx here "
              "(``room``)")  # fmt: skip
    finally:
        stop(*reversed(processes))
        for sock in sockets:
            sock.close()


def print_rows(
    stream: bool, concurrency: int, seconds: float, latencies: dict[str, list[float]],
    answers: dict[str, int], slices: dict[str, Slices], refused: dict[str, dict[int, int]],
) -> None:  # fmt: skip
    """A row a target, then (under load) the room nginx's row leaves the router."""
    direct = latencies["direct"]
    direct_rps = answers["direct"] / seconds
    nginx_rps = answers["nginx"] / seconds if "nginx" in answers else None
    d50, d99 = percentile(direct, 0.5), percentile(direct, 0.99)
    cores = psutil.cpu_count() or 1
    for name in latencies:
        proxied = latencies[name]
        rps = answers[name] / seconds
        p50, p99 = percentile(proxied, 0.5), percentile(proxied, 0.99)
        share = rps / direct_rps if direct_rps else None
        nginx_share = nginx_rps / direct_rps if nginx_rps and direct_rps else None
        of_nginx = "" if name in ("direct", "nginx") else ratio(share, nginx_share)
        own, machine = slices[name].in_window(seconds)
        print(
            f"{name:22} {'yes' if stream else 'no':6} {concurrency:>4} | "
            f"{d50 * 1e3:>8.2f}ms {d99 * 1e3:>5.2f}ms | "
            f"{p50 * 1e3:>6.2f}ms {p99 * 1e3:>5.2f}ms | "
            f"{(p50 - d50) * 1e3:>7.2f}ms {(p99 - d99) * 1e3:>5.2f}ms | "
            f"{direct_rps:>10.0f} {rps:>7.0f} {ratio(rps, direct_rps):>6} "
            f"{of_nginx:>8} | {cpu_per_request(own, answers[name]):>8} "
            f"{cpu_per_request(machine, answers[name]):>8} {machine / seconds:>4.1f}/{cores}"
            + "".join(f" {n}x{status}!" for status, n in refused[name].items()),
            flush=True,
        )
    if concurrency == 1 or not answers.get("nginx"):
        return  # one at a time, latency is the measure, not the machine's share
    own, machine = slices["nginx"].in_window(seconds)
    print(f"{'':22} room: {room(machine, own, answers['nginx']) * 1e6:.0f}us of the router's "
          f"CPU an answer for {GOAL_OF_NGINX:.2f} of nginx")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window per run")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--stream", choices=STREAMS, default="both",
                        help="answers streamed, not, or both (in turn)")  # fmt: skip
    parser.add_argument(
        "--routers", default="own+lean", help="comma-separated SERVER+CLIENT variants"
    )
    parser.add_argument("--processes", default="1",
                        help="comma-separated router process counts, each on one port")  # fmt: skip
    parser.add_argument("--static", action="store_true",
                        help="the router on a static file: no database, Redis, usage")  # fmt: skip
    parser.add_argument("--no-nginx", dest="nginx", action="store_false")
    parser.add_argument("--no-install-nginx", dest="install_nginx", action="store_false")
    parser.add_argument("--budget", type=int, default=0,
                        help="tokens a day for the bench's keys: each request counted in "
                        "Redis (0: the default key: its cap alone, leased)")  # fmt: skip
    parser.add_argument("--before", help="a checkout of an older commit (git archive): its "
                        "router measured too, as the row `before`")  # fmt: skip
    parser.add_argument("--database", default="llmgw_bench_router",
                        help="the bench's own database, made beside DATABASE_URL's")  # fmt: skip
    args = parser.parse_args()
    if args.static:
        if args.before:
            raise SystemExit("--before measures a fleet's router: leave out --static")
        run_until_signalled(run(args))
        return
    with bench_django(args.database) as env:
        run_until_signalled(run(args, env))


if __name__ == "__main__":
    main()
