"""A llama.cpp replica split across two nodes next to one on a single node, same model,
same run: time to first token and decode speed through the router, and their ratio.

    sudo .venv/bin/python -m bench.multinode                   # 20 requests each, 64 tokens
    sudo .venv/bin/python -m bench.multinode --requests 40 --threads 2 --json multinode.json

Two node hosts on fabric ib-a, both control planes, the router and the services host,
each in a network namespace of its own (llmgw_cli/sim). The catalog holds the demo GGUF
(SmolLM2) twice: ``smollm2-1node`` (nodes: 1) and ``smollm2-2node`` (nodes: 2, rank 1
runs llama.cpp's rpc-server, rank 0 llama-server --rpc), with the same threads. Once both
answer, the services host sends streamed chat completions, one at a time, alternating
between the two so that machine noise falls on both: a fixed prompt processed whole each
time (``cache_prompt: false``), temperature 0, ``--max-tokens`` at most. Time to first
token is from sending to the first content chunk; decode tokens/s is the completion
tokens after the first (from the streamed usage chunk) over the time from the first
token to the last.

Prints where each rank runs and its engine command (the split replica's rank 0 with
``--rpc``, its rank 1 as rpc-server), a line per round, then one row per model (requests
answered, TTFT p50/p95 ms, tokens/s p50) and "2-node / 1-node: tokens/s xA, TTFT xB"
(ratios of the p50s). Bounded by ``--requests`` and by ``--deadline`` seconds for the
whole run, fleet start included (no request starts after it). Exits 2 when the machine
cannot run it (no namespaces or root, another simulated fleet running, no rpc-server
beside llama-server, no demo model), 1 when a replica never answered (printing what the
fleet said of it and keeping its directory) or nothing was measured. The fleet is
removed at the end, whatever happened; its directory (logs, agent state) too, unless
``--dir`` named it or the run failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from bench import multinode_support as support
from bench import sim
from bench.report import print_rows, ratio
from llmgw_cli.sim import hosts, network
from llmgw_cli.sim.fleet import Tuning, simulated_fleet

NODES = 2
FABRIC = "ib-a"


def main() -> int:
    options = parse_options()
    reason = support.refusal()
    if reason:
        print(f"multinode: {reason}", file=sys.stderr)
        return 2
    started = time.monotonic()
    deadline = started + options.deadline
    directory = options.dir or Path(tempfile.mkdtemp(prefix="llmgw-multinode-"))
    print(
        f"{NODES} nodes on {FABRIC}; --threads {options.threads}, {options.requests} requests "
        f"per model, max_tokens {options.max_tokens}, deadline {options.deadline:.0f}s; "
        f"fleet in {directory}",
        flush=True,
    )
    tuning = Tuning(fabrics=tuple(FABRIC for _ in range(NODES)))
    with simulated_fleet(NODES, directory, demo=False, tuning=tuning) as fleet:
        print(f"fleet up after {time.monotonic() - started:.0f}s", flush=True)
        support.apply_catalog(fleet, support.catalog(options.threads))
        key = sim.api_key(fleet)
        missing = support.wait_until_serving(fleet, key, deadline)
        if missing:
            print(f"\nnever answered within the deadline: {', '.join(missing)}", flush=True)
            print("\n".join(support.diagnose(fleet, missing)))
            print(f"\nthe fleet's directory (logs, agent state): {directory}")
            return 1
        print(f"both answering after {time.monotonic() - started:.0f}s", flush=True)
        print("\n".join(support.placement(fleet)), flush=True)
        run = partial(support.measure, fleet.router_url, key, options.requests,
                      options.max_tokens, deadline, report_round)  # fmt: skip
        series = network.in_host(hosts.SERVICES, run)
    rows = [support.row(s) for s in series.values()]
    print_table(rows)
    if options.json:
        options.json.write_text(json.dumps(rows, indent=2) + "\n")
    if options.dir is None:
        shutil.rmtree(directory, ignore_errors=True)
    return 0 if all(r["requests"] for r in rows) else 1


def parse_options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20, help="streamed requests per model")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each request")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads, both models")
    parser.add_argument(
        "--deadline", type=float, default=600.0, help="seconds for the whole run, fleet start in"
    )
    parser.add_argument("--dir", type=Path, help="the fleet's state directory (kept)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    options = parser.parse_args()
    if options.requests < 1 or options.max_tokens < 2 or options.threads < 1:
        parser.error("--requests and --threads must be at least 1, --max-tokens at least 2")
    return options


def report_round(done: int, samples: dict[str, support.Sample]) -> None:
    cells = []
    for model, sample in samples.items():
        if sample.error:
            cells.append(f"{model} failed: {sample.error}")
        else:
            speed = sample.tokens_per_s
            cells.append(f"{model} TTFT {sample.ttft * 1000:.0f} ms, "
                         f"{'-' if speed is None else f'{speed:.1f}'} tok/s")  # fmt: skip
    print(f"round {done}: " + "; ".join(cells), flush=True)


def number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(rows: list[dict]) -> None:
    header = ("model", "nodes", "requests", "TTFT p50 ms", "TTFT p95 ms", "tokens/s p50")
    print()
    print_rows(
        header,
        (
            (row["model"], str(row["nodes"]),
             str(row["requests"]) + (f" ({row['failed']} failed)" if row["failed"] else ""),
             number(row["ttft_p50_ms"]), number(row["ttft_p95_ms"]),
             number(row["tokens_per_s_p50"], 1))
            for row in rows
        ),
    )  # fmt: skip
    print()
    by_nodes = {row["nodes"]: row for row in rows}
    one, two = by_nodes[1], by_nodes[2]
    speed = ratio(two["tokens_per_s_p50"], one["tokens_per_s_p50"])
    ttft = ratio(two["ttft_p50_ms"], one["ttft_p50_ms"])
    print(f"2-node / 1-node: tokens/s x{speed}, TTFT x{ttft}")
    for row in rows:
        for error in row["errors"]:
            print(f"{row['model']}: failed: {error}")


if __name__ == "__main__":
    sys.exit(main())
