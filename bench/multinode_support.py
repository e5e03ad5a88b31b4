"""What bench/multinode.py does on the simulated fleet: the catalog of the two replicas,
the checks before a run, the wait for both to answer, what the fleet said when one did
not, and the streamed requests that give time to first token and decode speed.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench import sim
from bench.processes import REPO
from bench.report import percentile
from llmgw_cli.demo import smollm2_path
from llmgw_cli.sim import hosts, network
from llmgw_cli.sim.state import Fleet

MANAGE = str(REPO / "manage.py")
ONE_NODE = "smollm2-1node"
TWO_NODE = "smollm2-2node"
NODES_OF = {ONE_NODE: 1, TWO_NODE: 2}
# Long enough that prompt processing shows in the time to first token, short enough that
# SmolLM2's 2048-token context keeps room for the answer.
PROMPT = (
    "You are a careful assistant. Read the following note and then answer. "
    "The lighthouse keeper wrote that the fog came in at dusk, the lamp was lit at six, "
    "two fishing boats passed to the north before eight, and the wind turned east at "
    "midnight. Question: in a few sentences, describe the keeper's evening in order."
)
REQUEST_TIMEOUT = 120.0  # one streamed answer of 64 tokens takes seconds; past this it hung
AGENT_LOG_LINES = 30


# Before the run


def refusal(others_count: bool = True) -> str | None:
    """Why the bench cannot run here, in one line; None when it can. A test, which waits
    for the machine-wide lock, passes ``others_count=False``: a fleet running now is not."""
    reason = sim.refusal()
    if reason:
        return reason
    others = network.our_namespaces() if others_count else []
    if others:
        # sim up would refuse (or with replace, take another run's fleet down).
        return (
            f"another simulated fleet is running ({', '.join(sorted(others))}); wait for it "
            "to finish, or remove a stale one with `llmgw sim down`"
        )
    from agent_worker.engines.llama_cpp import rpc_server_beside
    from llmgw_cli.local_engine import wheel_llama_server

    binary = wheel_llama_server()
    if binary is None:
        return "no llama-server in this environment (scripts/ensure-llama-server .venv installs it)"
    if rpc_server_beside(binary) is None:
        return (
            f"this llama.cpp build ({binary}) has no rpc-server beside llama-server, so no "
            "replica can span nodes; rebuild it with scripts/ensure-llama-server .venv"
        )
    return None


def catalog(threads: int) -> str:
    """Two models of the same GGUF, one replica each: one on a node, one across two."""
    path = smollm2_path()
    profiles = []
    for name, nodes in NODES_OF.items():
        profiles.append(f"""\
  - name: {name}
    source: {path}
    profiles:
      - name: cpu
        engine: llama.cpp
        replicas: 1
        nodes: {nodes}
        memory: 512MiB
        context: 2048
        args: ["--threads", "{threads}", "--no-warmup"]
""")
    return "models:\n" + "".join(profiles)


def apply_catalog(fleet: Fleet, text: str) -> None:
    """``llmgw_ctl apply`` on cp1, as an operator would once the nodes are up."""
    path = fleet.directory / "multinode-catalog.yaml"
    path.write_text(text)
    cp1 = hosts.CONTROL_PLANES[0]
    result = fleet.run(cp1, [sys.executable, MANAGE, "llmgw_ctl", "apply", "-f", str(path)])
    if result.returncode != 0:
        raise network.SimError(f"llmgw_ctl apply on {cp1} failed:\n{result.stderr[-3000:]}")


# Waiting for both replicas


def ready_models(fleet: Fleet) -> set[str]:
    rows = sim.query(fleet, "SELECT DISTINCT model_name FROM fleet_replica WHERE state = 'ready'")
    return {name for (name,) in rows}


def wait_until_serving(fleet: Fleet, key: str, deadline: float) -> list[str]:
    """Wait for a ready replica of each model that answers through the router; return the
    models that still did not by ``deadline`` (monotonic)."""
    waiting = set(NODES_OF)
    while waiting and time.monotonic() < deadline:
        try:
            ready = ready_models(fleet) & waiting
        except Exception:  # noqa: BLE001 (the database is up; a slow start is not an error)
            ready = set()
        for model in sorted(ready):
            if sim.answers(fleet, key, model, timeout=60):
                waiting.discard(model)
                print(f"{model}: ready and answering", flush=True)
        if waiting:
            time.sleep(1.0)
    return sorted(waiting)


def placement(fleet: Fleet) -> list[str]:
    """Each rank of both models: its node and the engine command running it, so that the
    table is known to compare a split replica with a whole one."""
    rows = sim.query(
        fleet,
        "SELECT r.model_name, s.rank, s.node_id, s.pid FROM fleet_replica r JOIN fleet_shard s"
        " ON s.replica_id = r.id WHERE r.state = 'ready' ORDER BY r.model_name, s.rank",
    )
    return [
        f"{model} rank {rank} on {node}: {engine_command(pid)}" for model, rank, node, pid in rows
    ]


def engine_command(pid: int | None) -> str:
    """The engine's command line, short: binaries and the model by name, no API key."""
    try:
        argv = psutil.Process(pid).cmdline() if pid else []
    except psutil.Error:
        argv = []
    if not argv:
        return f"no process {pid}"
    shown = []
    for index, arg in enumerate(argv):
        if index > 0 and argv[index - 1] == "--api-key":
            shown.append("***")
        else:
            shown.append(Path(arg).name if arg.startswith("/") else arg)
    return " ".join(shown)


# When a replica never came


def diagnose(fleet: Fleet, models: list[str]) -> list[str]:
    """What the fleet says about ``models``: llmgw_ctl status (the models page's facts),
    their replica and shard rows, and the end of each agent's log."""
    lines = []
    cp1 = hosts.CONTROL_PLANES[0]
    for argv in (["status"], ["replicas"]):
        result = fleet.run(cp1, [sys.executable, MANAGE, "llmgw_ctl", *argv], timeout=120)
        lines += [f"$ llmgw_ctl {' '.join(argv)}", *(result.stdout + result.stderr).splitlines()]
    try:
        lines += replica_rows(fleet, models)
    except Exception as exc:  # noqa: BLE001 (still show the logs below)
        lines.append(f"could not read the replica rows: {exc!r}")
    for node in fleet.nodes:
        log = fleet.directory / "logs" / f"{node.name}-agent.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        tail = text.splitlines()[-AGENT_LOG_LINES:]
        lines += [f"--- {log} (last {len(tail)} lines)", *tail]
    return lines


def replica_rows(fleet: Fleet, models: list[str]) -> list[str]:
    rows = sim.query(
        fleet,
        "SELECT r.model_name, r.id::text, r.state, r.reasons, s.rank, s.node_id, s.state,"
        " s.reason, s.output_tail FROM fleet_replica r LEFT JOIN fleet_shard s"
        " ON s.replica_id = r.id WHERE r.model_name = ANY(%s) ORDER BY r.model_name, r.id, s.rank",
        (models,),
    )
    if not rows:
        return [f"no Replica rows for {', '.join(models)}"]
    lines, shown = ["Replica rows:"], set()
    for model, replica, state, reasons, rank, node, shard_state, reason, tail in rows:
        if replica not in shown:
            shown.add(replica)
            lines.append(f"  {model} replica {replica[:8]} {state} reasons={json.dumps(reasons)}")
        if rank is not None:
            lines.append(f"    rank {rank} on {node}: {shard_state} {reason or ''}".rstrip())
            lines += [f"      | {line}" for line in (tail or [])[-10:]]
    return lines


# The measurement


@dataclass
class Sample:
    ttft: float = 0.0  # seconds from sending to the first token
    decode: float = 0.0  # seconds from the first token to the last
    tokens: int = 0  # completion tokens, from the streamed usage chunk
    error: str = ""

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed: the tokens after the first over the time they took."""
        if self.tokens < 2 or self.decode <= 0:
            return None
        return (self.tokens - 1) / self.decode


@dataclass
class Series:
    model: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        return NODES_OF[self.model]

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if not s.error]


def stream_one(client: httpx.Client, url: str, key: str, model: str, max_tokens: int) -> Sample:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # llama-server's own field: every request processes the whole prompt, as a new
        # conversation would, instead of reusing the previous identical one's cache.
        "cache_prompt": False,
    }
    sample = Sample()
    first = last = None
    sent = time.monotonic()
    headers = {"Authorization": f"Bearer {key}"}
    with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                       headers=headers) as response:  # fmt: skip
        if response.status_code != 200:
            response.read()
            return Sample(error=f"HTTP {response.status_code}: {response.text[:200]}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                return Sample(error=f"stream error: {chunk['error']}")
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices") or []):
                last = time.monotonic()
                first = first or last
            if chunk.get("usage"):
                sample.tokens = int(chunk["usage"].get("completion_tokens") or 0)
    if first is None:
        return Sample(error="no token in the stream")
    if not sample.tokens:
        return Sample(error="no usage chunk in the stream")
    sample.ttft, sample.decode = first - sent, last - first
    return sample


def measure(
    router_url: str,
    key: str,
    requests: int,
    max_tokens: int,
    deadline: float,
    report: Callable[[int, dict[str, Sample]], None],
) -> dict[str, Series]:
    """``requests`` streamed answers per model, one at a time, alternating A B, B A, ... so
    that machine noise falls on both; stops early at ``deadline`` (monotonic). Run it on
    the services host."""
    series = {model: Series(model) for model in NODES_OF}
    order = list(NODES_OF)
    with httpx.Client(timeout=httpx.Timeout(REQUEST_TIMEOUT, connect=10)) as client:
        for round_ in range(requests):
            done: dict[str, Sample] = {}
            for model in order if round_ % 2 == 0 else order[::-1]:
                if time.monotonic() >= deadline:
                    return series
                try:
                    sample = stream_one(client, router_url, key, model, max_tokens)
                except (httpx.HTTPError, ValueError) as exc:
                    sample = Sample(error=f"{type(exc).__name__}: {exc}")
                series[model].samples.append(sample)
                done[model] = sample
            report(round_ + 1, done)
    return series


def percentile_or_none(values: list[float], fraction: float) -> float | None:
    return percentile(values, fraction) if values else None


def row(series: Series) -> dict:
    ok = series.ok
    ttfts = [s.ttft * 1000 for s in ok]
    speeds = [s.tokens_per_s for s in ok if s.tokens_per_s is not None]
    errors = sorted({s.error for s in series.samples if s.error})
    return {
        "model": series.model,
        "nodes": series.nodes,
        "requests": len(ok),
        "failed": len(series.samples) - len(ok),
        "ttft_p50_ms": percentile_or_none(ttfts, 0.5),
        "ttft_p95_ms": percentile_or_none(ttfts, 0.95),
        "tokens_per_s_p50": percentile_or_none(speeds, 0.5),
        "completion_tokens_p50": percentile_or_none([float(s.tokens) for s in ok], 0.5),
        "errors": errors,
        "samples": [
            {"ttft_ms": s.ttft * 1000, "decode_s": s.decode, "tokens": s.tokens, "error": s.error}
            for s in series.samples
        ],
    }
