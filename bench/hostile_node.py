"""An attacker on the fleet's own network, one row per attempt, and legitimate traffic beside.

    sudo .venv/bin/python -m bench.hostile_node            # 3 rounds of every attempt
    sudo .venv/bin/python -m bench.hostile_node --short    # make test's: one round

Three node hosts, both control planes, the router and the services host, each in a
network namespace of its own (llmgw_cli/sim). The catalog holds the demo GGUF (SmolLM2)
twice: on one node, and across two (llama.cpp's RPC: rank 1 runs ``rpc-server``). Once both
answer through the router, streaming clients on the services host ask both through the
router while every attack module under ``bench/hostile/`` (each one with
``attempts(fleet, scene)``) tries what only an authorised party may do, from a node host
holding no rank of the replica attacked, from the router host and from the services host.

Prints one row per attempt (``blocked`` or ``ALLOWED``, and what answered), then the
legitimate requests sent and failed. Exits 1 on any ``ALLOWED`` row or any failed
legitimate request, 2 when the machine cannot run it (no namespaces or root, another
simulated fleet running, no rpc-server beside llama-server, no demo model). The fleet is
removed at the end, whatever happened; its directory too, unless ``--dir`` named it.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bench import hostile, sim
from bench import multinode_support as support
from bench.fault_load import Load
from bench.hostile import broker
from bench.hostile.rows import Row, allowed, table
from bench.hostile.scene import Scene, read_scene
from llmgw_cli.sim import hosts, network
from llmgw_cli.sim.fleet import simulated_fleet
from llmgw_cli.sim.state import Fleet

NODES = 3  # two share fabric ib-a for the split replica; the third is an outsider to it
CLIENTS = 2  # streaming clients on the services host, one per model
MODELS = [support.ONE_NODE, support.TWO_NODE]


@dataclass
class Outcome:
    rows: list[Row]
    sent: int
    failed: list[str]  # the failed legitimate requests' errors

    @property
    def green(self) -> bool:
        return not allowed(self.rows) and not self.failed and self.sent > 0


def main() -> int:
    options = parse_options()
    reason = support.refusal()
    if reason:
        print(f"hostile_node: {reason}", file=sys.stderr)
        return 2
    started = time.monotonic()
    directory = options.dir or Path(tempfile.mkdtemp(prefix="llmgw-hostile-"))
    print(f"{NODES} nodes; {options.rounds} round(s) of every attempt; fleet in {directory}",
          flush=True)  # fmt: skip
    with simulated_fleet(NODES, directory, demo=False) as fleet:
        print(f"fleet up after {time.monotonic() - started:.0f}s", flush=True)
        broker.watch(fleet)  # what Redis is told, from before the first start on
        missing = serve_both(fleet, started + options.deadline)
        if missing:
            print(f"never answered: {', '.join(missing)}")
            print("\n".join(support.diagnose(fleet, missing)))
            return 1
        print(f"both answering after {time.monotonic() - started:.0f}s", flush=True)
        outcome = attack(fleet, options.rounds)
        broker.WATCH.stop()
    print_outcome(outcome)
    if options.dir is None:
        shutil.rmtree(directory, ignore_errors=True)
    return 0 if outcome.green else 1


def parse_options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="one round (make test's form)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every attempt")
    parser.add_argument(
        "--deadline", type=float, default=600.0, help="seconds for the replicas to answer"
    )
    parser.add_argument("--dir", type=Path, help="the fleet's state directory (kept)")
    options = parser.parse_args()
    if options.short:
        options.rounds = 1
    if options.rounds < 1:
        parser.error("--rounds must be at least 1")
    return options


def serve_both(fleet: Fleet, deadline: float) -> list[str]:
    """Apply the two models' catalog and wait until both answer through the router;
    return those that did not by ``deadline`` (monotonic)."""
    support.apply_catalog(fleet, support.catalog(threads=1))
    return support.wait_until_serving(fleet, sim.api_key(fleet), deadline)


def attack(fleet: Fleet, rounds: int = 1) -> Outcome:
    """Every attack module's attempts, ``rounds`` times, while streaming clients on the
    services host ask both models through the router."""
    scene = read_scene(fleet, MODELS)
    load = Load(fleet.router_url, sim.api_key(fleet), CLIENTS, enter=partial(network.enter,
                hosts.SERVICES), models=tuple(MODELS))  # fmt: skip
    load.start()
    rows: list[Row] = []
    try:
        time.sleep(1.0)  # the clients' first requests are under way before the first attempt
        for _ in range(rounds):
            rows += list(every_attempt(fleet, scene))
        time.sleep(1.0)
    finally:
        load.stop()
    failed = [r.error for r in load.requests if r.ended and r.error]
    return Outcome(rows, len([r for r in load.requests if r.ended]), failed)


def every_attempt(fleet: Fleet, scene: Scene) -> Iterator[Row]:
    """The rows of every module under bench/hostile/ that has ``attempts``."""
    for info in pkgutil.iter_modules(hostile.__path__):
        module = importlib.import_module(f"{hostile.__name__}.{info.name}")
        attempts = getattr(module, "attempts", None)
        if callable(attempts):
            yield from attempts(fleet, scene)


def print_outcome(outcome: Outcome) -> None:
    print()
    print(table(outcome.rows))
    print()
    breached = allowed(outcome.rows)
    print(f"{len(outcome.rows)} attempts: {len(outcome.rows) - len(breached)} blocked, "
          f"{len(breached)} ALLOWED")  # fmt: skip
    errors = "; ".join(sorted(set(outcome.failed)))
    print(f"legitimate traffic through the router meanwhile: {outcome.sent} requests, "
          f"{len(outcome.failed)} failed" + (f" ({errors})" if errors else ""))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
