"""Cost per team (issue 43, item 5): a day of a small fleet written as the control plane
and routers write it, then priced by ``router.usage.cost``.

    python -m bench.cost [--hours 24] [--seed 1] [--gpu-hour 2.40] [--cpu-core-hour 0.03]

Needs a PostgreSQL named by DATABASE_URL (and a REDIS_URL, unused): the bench creates and
migrates its own database ``llmgw_bench_cost`` beside it and empties its rows first. Two
teams, ``red`` and ``blue``, with two keys each; ``gemma`` open to red alone (red owns
its idle hours), ``qwen`` to blue alone, ``smol`` to both; GPU replicas of gemma and qwen
and a CPU one of smol, started, restarted and stopped at random through the window (each
transition an Event, as ``fleet.transitions`` records it), and usage rows per key, model
and hour with some hours left idle. No engine runs: this bench checks the arithmetic on
many rows, not a router.

It prints, per team, tokens, GPU- and core-seconds, the served and idle cost, and the
check: the teams' costs add up to the fleet's, and the fleet's equals what the bench
computes itself from the stretches it wrote (its baseline), to the cent. It also times
``team_costs``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from bench.database import bench_django
from bench.report import print_rows

TEAMS = {"red": ["llmgw-redsvc", "llmgw-redlab"], "blue": ["llmgw-bluesvc", "llmgw-blulab"]}
# model: (teams open to, GPUs per replica, replicas)
MODELS = {"gemma": (["red"], 2, 2), "qwen": (["blue"], 1, 1), "smol": ([], 0, 1)}
CPU_CORES = 16


def write_fleet(start: datetime, hours: int, rng: random.Random) -> tuple[Fraction, Fraction]:
    """The fleet's rows over [start, start + hours); returns the GPU- and core-seconds the
    replicas held, priced later (the bench's own count, the baseline)."""
    from audit.models import Event, EventKind
    from catalog.models import ApiKey, Model, Profile, Team
    from fleet.models import Node, Replica, Shard
    from router.models import Usage

    end = start + timedelta(hours=hours)
    teams = {name: Team.objects.get_or_create(name=name)[0] for name in TEAMS}
    for team, prefixes in TEAMS.items():
        for prefix in prefixes:
            ApiKey.objects.create(name=prefix, prefix=prefix, hashed_key=prefix, team=teams[team])
    held = {"gpu": Fraction(0), "core": Fraction(0)}
    events, usage = [], []
    for name, (open_to, gpus, count) in MODELS.items():
        model = Model.objects.create(name=name, source=f"/models/{name}.gguf")
        model.teams.set([teams[t] for t in open_to])
        profile = Profile.objects.create(model=model, name="p", engine="llama.cpp")
        for r in range(count):
            node = Node.objects.create(
                id=f"node-{name}-{r}", inventory={"cpu": {"cores": CPU_CORES}}
            )
            replica = Replica.objects.create(
                model_name=name, profile_name="p", profile=profile, state="stopped"
            )
            Shard.objects.create(
                id=Shard.new_id(), replica=replica, node=node, gpus=list(range(gpus))
            )
            # Runs of a few hours with gaps between them, at second precision.
            at = start + timedelta(seconds=rng.randrange(0, 3600))
            while at < end:
                stop = at + timedelta(seconds=rng.randrange(1800, 6 * 3600))
                events += [(replica.id, at, "starting"),
                           (replica.id, at + timedelta(seconds=40), "ready")]  # fmt: skip
                if stop < end:
                    events.append((replica.id, stop, "stopping"))
                    events.append((replica.id, stop + timedelta(seconds=2), "stopped"))
                    stop += timedelta(seconds=2)
                seconds = Fraction(int((min(stop, end) - at).total_seconds()))
                held["gpu" if gpus else "core"] += seconds * (gpus or CPU_CORES)
                at = stop + timedelta(seconds=rng.randrange(60, 2 * 3600))
        users = [p for t in (open_to or TEAMS) for p in TEAMS[t]]
        for hour in range(hours):
            for prefix in users:
                if rng.random() < 0.4:  # a key idle this hour
                    continue
                usage.append(Usage(
                    hour=start + timedelta(hours=hour), key_prefix=prefix, key_name=prefix,
                    model=name, requests=rng.randrange(1, 200),
                    prompt_tokens=rng.randrange(100, 90_000),
                    completion_tokens=rng.randrange(50, 40_000),
                ))  # fmt: skip
    written = Event.objects.bulk_create(
        Event(kind=EventKind.REPLICA, subject=str(rid), to_state=state) for rid, _, state in events
    )
    for event, (_, at, _) in zip(written, events, strict=True):
        event.at = at
    Event.objects.bulk_update(written, ["at"])
    Usage.objects.bulk_create(usage)
    return held["gpu"], held["core"]


def empty() -> None:
    from audit.models import Event
    from catalog.models import ApiKey, Model, Team
    from fleet.models import Node, Replica
    from router.models import Usage

    for model in (Usage, Event, Replica, Node, ApiKey, Model):
        model.objects.all().delete()
    Team.objects.exclude(name="default").delete()


def run(hours: int, seed: int, gpu_hour: Decimal, cpu_core_hour: Decimal) -> bool:
    """Write, price and print; whether every check held."""
    from router.usage.cost import Prices, team_costs

    start = datetime(2026, 1, 5, tzinfo=UTC)
    gpu, core = write_fleet(start, hours, random.Random(seed))
    prices = Prices(gpu_hour, cpu_core_hour)
    began = time.perf_counter()
    report = team_costs(start, start + timedelta(hours=hours), prices)
    took = time.perf_counter() - began
    exact = (gpu * Fraction(gpu_hour) + core * Fraction(cpu_core_hour)) / 3600
    baseline = (Decimal(exact.numerator) / Decimal(exact.denominator)).quantize(
        Decimal("0.01"), rounding=ROUND_HALF_UP
    )
    print_rows(
        ["team", "tokens", "GPU-seconds", "core-seconds", "served", "idle", "cost"],
        [[t.team, f"{t.tokens:,}", f"{t.gpu_seconds:,}", f"{t.core_seconds:,}", str(t.served),
          str(t.idle), str(t.cost)] for t in report.teams],
    )  # fmt: skip
    teams_sum = sum((t.cost for t in report.teams), Decimal(0))
    held_gpu = sum(t.gpu_seconds for t in report.teams)
    print(
        f"\n{hours} h at {gpu_hour}/GPU-hour and {cpu_core_hour}/core-hour: teams "
        f"{teams_sum} = fleet {report.fleet}: {teams_sum == report.fleet}; fleet = the "
        f"bench's own count of the stretches it wrote {baseline}: {report.fleet == baseline}; "
        f"GPU-seconds {held_gpu:,} of {round(gpu):,} (per-team rounding); "
        f"team_costs took {took:.2f} s"
    )
    return report.adds_up and report.fleet == baseline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gpu-hour", type=Decimal, default=Decimal("2.40"))
    parser.add_argument("--cpu-core-hour", type=Decimal, default=Decimal("0.03"))
    args = parser.parse_args(argv)
    with bench_django("llmgw_bench_cost"):
        empty()
        held = run(args.hours, args.seed, args.gpu_hour, args.cpu_core_hour)
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
