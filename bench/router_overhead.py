"""Benchmark the router: the same load sent straight to an engine and through the router.

Run: .venv/bin/python -m bench.router_overhead [--seconds 3] [--concurrency 1,16,64]
                                              [--routers uvicorn+lean,uvicorn+aiohttp,daphne+lean]

A fast fake engine (tests/router/fake_engine.py, no delays, 8 chunks per stream) and a
router in static mode (with an API key, so authentication is measured too) run as their
own processes; the load generator is this process (aiohttp, one connection per worker).
For each concurrency, streaming and not, it prints latency p50/p99 direct and through
the router, the latency the router adds, and throughput through the router as a
fraction of direct. A router variant is an ASGI server and an outbound client: ``lean``
(router/wire/upstream.py, what production runs) or ``aiohttp`` (bench/aiohttp_upstream.py,
kept to measure against); ``uvicorn+lean`` is what `llmgw up` runs. Each measurement
runs --seconds after a short warm-up: about 25 s per variant with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.engines import ENGINE_SECRET, KEY, serve_fake_engine, serve_router
from bench.processes import run_until_signalled, stop
from bench.report import percentile, ratio

WARMUP_SECONDS = 0.3  # connections opened, before each slice is measured
ROUNDS = 3  # each measurement is this many slices, direct and routers taking turns


async def measure(
    url: str, concurrency: int, stream: bool, seconds: float, key: str
) -> tuple[list[float], int]:
    """Latencies (s) of requests begun and finished in the window; answers finished in it."""
    body = b'{"model":"bench","messages":[{"role":"user","content":"hello there"}]' + (
        b',"stream":true}' if stream else b"}"
    )
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    latencies: list[float] = []
    finished = 0
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
                        raise SystemExit(f"{url} answered {response.status}")
                done = time.perf_counter()
                if window_start <= done <= window_end:
                    finished += 1
                    if began >= window_start:
                        latencies.append(done - began)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, finished


async def run(args: argparse.Namespace) -> None:
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
    processes: list = []
    try:
        engine = await serve_fake_engine(workdir / "engine.log", 8, processes)
        endpoint = {"url": engine.url, "secret": ENGINE_SECRET}
        routers = {}
        for variant in args.routers.split(","):
            server, client = variant.split("+")
            router = await serve_router(
                workdir / "static.yaml", [{"name": "bench", "endpoints": [endpoint]}],
                workdir / f"router-{server}-{client}.log", processes, server, client,
            )  # fmt: skip
            routers[variant] = router.url

        print(
            f"{'router':15} {'stream':6} {'conc':>4} | {'direct p50':>10} {'p99':>7} | "
            f"{'router p50':>10} {'p99':>7} | {'added p50':>9} {'p99':>7} | "
            f"{'direct r/s':>10} {'router r/s':>10} {'ratio':>6}"
        )
        targets = {"direct": (f"{engine.url}/v1/chat/completions", ENGINE_SECRET)}
        targets.update({v: (f"{url}/v1/chat/completions", KEY) for v, url in routers.items()})
        for stream in (False, True):
            for concurrency in concurrencies:
                # Slices taken in turn, so a change in the machine's other load during the
                # run weighs on direct and routed alike.
                latencies: dict[str, list[float]] = {name: [] for name in targets}
                answers = dict.fromkeys(targets, 0)
                for _round in range(ROUNDS):
                    for name, (url, key) in targets.items():
                        slice_latencies, slice_answers = await measure(
                            url, concurrency, stream, args.seconds / ROUNDS, key
                        )
                        latencies[name] += slice_latencies
                        answers[name] += slice_answers
                direct = latencies["direct"]
                direct_rps = answers["direct"] / args.seconds
                d50, d99 = percentile(direct, 0.5), percentile(direct, 0.99)
                for variant in routers:
                    routed = latencies[variant]
                    routed_rps = answers[variant] / args.seconds
                    r50, r99 = percentile(routed, 0.5), percentile(routed, 0.99)
                    routed_share = ratio(routed_rps, direct_rps)
                    print(
                        f"{variant:15} {'yes' if stream else 'no':6} {concurrency:>4} | "
                        f"{d50 * 1e3:>8.2f}ms {d99 * 1e3:>5.2f}ms | "
                        f"{r50 * 1e3:>8.2f}ms {r99 * 1e3:>5.2f}ms | "
                        f"{(r50 - d50) * 1e3:>7.2f}ms {(r99 - d99) * 1e3:>5.2f}ms | "
                        f"{direct_rps:>10.0f} {routed_rps:>10.0f} {routed_share:>6}",
                        flush=True,
                    )
        print("ratio = router r/s / direct r/s; added = router latency - direct latency")
    finally:
        stop(*reversed(processes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window per run")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument(
        "--routers", default="uvicorn+lean", help="comma-separated SERVER+CLIENT variants"
    )
    args = parser.parse_args()
    run_until_signalled(run(args))


if __name__ == "__main__":
    main()
