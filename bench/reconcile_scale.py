"""Benchmark the whole control loop at scale: 2,000 nodes, 300 models, 1,000 replicas.

Run: DATABASE_URL=postgresql://… REDIS_URL=redis://… .venv/bin/python -m bench.reconcile_scale
     [--nodes 2000] [--models 300] [--replicas 1000] [--small 500] [--runs 3]

It creates (once) and migrates a database ``llmgw_reconcile_bench`` on the DATABASE_URL
server, fills it with a fleet (bench/reconcile_fleet.py: real models, replicas placed by
the real placement and running), and times on the real PostgreSQL and Redis what the
control plane does with it: a steady reconcile pass (and one that works out again why
each unplaceable replica is refused, as passes do 30 to 60 s later), the liveness pass,
the routing snapshot and a router's reload of it, a /metrics scrape, the cluster page,
``llmgw_ctl nodes --json``, and every node registering again after a control plane
restart with the passes that follow. Against its goal (a pass under 2 s; each page,
scrape and load under 1 s) each step shows: ``time``, the median wall time of ``--runs``
runs after a first (the restart's register is run once); ``cpu``, this process's CPU time
in the same runs, steadier than wall time on a shared machine but without the database's
own work; ``first``, the first run, as a process that just started has it; ``queries``,
counted in that first run. Pages and /metrics run with daphne's collector thresholds, as served.

The same steps run first at ``--small`` nodes (models and replicas scaled alike): a query
count that grows with the fleet shows in the last table, and is the usual culprit.
It empties its database at the start of each size and at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

from bench import reconcile_fleet as fleet
from bench.database import bench_django
from bench.processes import REPO
from core.collector import SERVER_THRESHOLDS

BENCH_DATABASE = "llmgw_reconcile_bench"
HARD_LIMIT_SECONDS = 600
PASS_GOAL, PAGE_GOAL = 2.0, 1.0
REGISTER_ALL = "restart: every node's link_node"


@dataclass
class Row:
    step: str
    seconds: float  # the median of the timed runs, else the first run's
    cpu: float  # this process's CPU time in the same run: steadier on a shared machine
    queries: int
    goal: float | None
    runs: int
    first: float  # the first run: a process that just started, nothing read before

    @property
    def verdict(self) -> str:
        if self.goal is None:
            return "-"
        return "ok" if self.seconds <= self.goal else "OVER"


@contextmanager
def served_by_daphne() -> Iterator[None]:
    """The collector as daphne runs it (llmgw_site/asgi.py), for what daphne serves."""
    before = gc.get_threshold()
    gc.set_threshold(*SERVER_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def measure(
    step: str, work: Callable[[], object], goal: float | None, runs: int,
    before: Callable[[], None] | None = None, served: bool = False,
) -> Row:  # fmt: skip
    """Count the queries of one run (which also warms up), then time ``runs`` more.

    Counted with an execute wrapper rather than CaptureQueriesContext, which keeps only
    the last 9,000 and would cap the restart's count. ``served``: daphne serves it.
    """
    from django.db import connection

    queries = 0

    def count(execute, sql, params, many, context):
        nonlocal queries
        queries += 1
        return execute(sql, params, many, context)

    samples: list[tuple[float, float]] = []
    for n in range(1 + (runs if runs > 1 else 0)):
        if before:
            before()
        with contextlib.ExitStack() as stack:
            if n == 0:
                stack.enter_context(connection.execute_wrapper(count))
            if served:
                stack.enter_context(served_by_daphne())
            started, cpu = time.perf_counter(), time.process_time()
            work()
            samples.append((time.perf_counter() - started, time.process_time() - cpu))
    timed = samples[1:] or samples
    seconds = statistics.median(wall for wall, _cpu in timed)
    cpu = statistics.median(cpu for _wall, cpu in timed)
    return Row(step, seconds, cpu, queries, goal, len(timed), samples[0][0])


def steps(runs: int, env: dict[str, str], with_subprocess: bool) -> list[Row]:
    """Every step on the fleet in the database now, in the order the brief lists them."""
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.test import Client
    from django.utils import timezone

    from audit.actors import AGENT_LINK
    from audit.notices import publish_routing_change
    from catalog.permissions import OPERATORS_GROUP
    from fleet import leadership
    from fleet.actions.reports import link_node
    from fleet.link.liveness import check_liveness
    from fleet.models import Node, Replica
    from fleet.reconcile.passes import reconcile
    from fleet.routing_table import routing_snapshot
    from router.table.routes import RoutingTable
    from router.table.saved import TableFile
    from router.table.sources import DatabaseSource

    lease = leadership.acquire_or_renew()

    def heard() -> None:
        # The lease lasts 15 s: renewed before each run, as the beat task renews it (a
        # restart that outlasts it comes back under a new epoch).
        nonlocal lease
        lease = leadership.acquire_or_renew()
        fleet.heard_now(timezone.now())

    def steady_pass() -> None:
        epoch = lease.epoch
        report = reconcile(epoch=epoch, still_leading=lambda: leadership.still_leading(epoch))
        if report.skipped or report.created or report.stopping or report.placed:
            raise SystemExit(f"the steady pass was not steady: {report.summary()}")

    def liveness() -> None:
        report = check_liveness()
        if report.unreachable or report.lost or report.held_back:
            raise SystemExit(f"the liveness pass found silent nodes: {report}")

    def snapshot_and_publish() -> None:
        routing_snapshot()
        publish_routing_change()

    saved = Path(tempfile.mkdtemp(prefix="llmgw-bench-table-"))
    source = DatabaseSource(TableFile(saved / "table.json"))

    def router_reload() -> None:
        table, _keys = source._load()
        RoutingTable.from_snapshot(table)

    operator = User.objects.create_user("bench-operator")
    operator.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    browser = Client()
    browser.force_login(operator)
    bearer = {"Authorization": f"Bearer {settings.METRICS_TOKEN}"}

    def get(path: str) -> Callable[[], None]:
        def fetch() -> None:
            # /metrics asks for its token (Prometheus's), the pages for a session.
            response = browser.get(path, headers=bearer)
            if response.status_code != 200:
                raise SystemExit(f"GET {path} answered {response.status_code}")

        return fetch

    def ctl_nodes() -> None:
        call_command("llmgw_ctl", "nodes", "--json", stdout=StringIO())

    def heard_and_refusals_forgotten() -> None:
        # As 30 to 60 s after the last time: every unplaceable replica's refusal is worked
        # out again (in a running fleet, spread over the passes of that time).
        heard()
        Replica.objects.filter(state="unplaceable").update(reasons_at=None)

    rows = [
        measure("reconcile pass, steady", steady_pass, PASS_GOAL, runs, heard),
        measure(
            "  the same, refusals worked out again",
            steady_pass,
            PASS_GOAL,
            runs,
            heard_and_refusals_forgotten,
        ),
        measure("liveness pass", liveness, PAGE_GOAL, runs, heard),
        measure("routing snapshot + publish", snapshot_and_publish, PAGE_GOAL, runs, heard),
        measure("router reload (load, save, table)", router_reload, PAGE_GOAL, runs, heard),
        measure("GET /metrics", get("/metrics"), PAGE_GOAL, runs, heard, served=True),
        measure("GET / (cluster page)", get("/"), PAGE_GOAL, runs, heard, served=True),
        measure("llmgw_ctl nodes --json", ctl_nodes, PAGE_GOAL, runs, heard),
    ]
    if with_subprocess:
        command = [sys.executable, "manage.py", "llmgw_ctl", "nodes", "--json"]
        started = time.perf_counter()
        subprocess.run(command, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
        took = time.perf_counter() - started
        rows.append(Row("  the same, as a process", took, 0.0, 0, None, 1, took))

    # A control plane restart: it was away 30 s, and every agent links again.
    registers = fleet.registers(lease.epoch)
    away = timezone.now()
    Node.objects.update(last_heartbeat=away, usage_reported_at=away)

    def register_all() -> None:
        for node_id, message in registers:
            link_node(node_id, message, actor=AGENT_LINK)

    rows.append(measure(REGISTER_ALL, register_all, None, 1))
    registers.clear()  # agents' messages are not kept: 2,000 inventories would weigh on the rest
    rows.append(
        measure(
            "restart: the pass after", lambda: reconcile(epoch=lease.epoch), PASS_GOAL, 1, heard
        )
    )
    rows.append(measure("restart: the passes after that", steady_pass, PASS_GOAL, runs, heard))
    leadership.release()
    shutil.rmtree(saved, ignore_errors=True)
    return rows


def print_table(title: str, rows: list[Row]) -> None:
    print(f"\n{title}")
    print(f"{'step':<38} {'time':>9} {'cpu':>9} {'first':>9} {'queries':>8} {'goal':>6}  verdict")
    for row in rows:
        goal = f"{row.goal:.0f} s" if row.goal is not None else "-"
        runs = f" (median of {row.runs})" if row.runs > 1 else ""
        print(
            f"{row.step:<38} {row.seconds * 1e3:>7.0f}ms {row.cpu * 1e3:>7.0f}ms "
            f"{row.first * 1e3:>7.0f}ms {row.queries:>8} {goal:>6}  {row.verdict}{runs}"
        )


def clear_queues(redis_url: str) -> None:
    """Drop the commands the restart put on the simulated nodes' queues."""
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"node-{fleet.NODE_PREFIX}*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])


def run(args: argparse.Namespace, env: dict[str, str]) -> None:
    from django.utils import timezone

    sizes = []
    if args.small and args.small < args.nodes:
        sizes.append(args.small)
    sizes.append(args.nodes)
    tables: dict[int, list[Row]] = {}
    for nodes in sizes:
        scale = nodes / args.nodes
        models, wanted = max(10, round(args.models * scale)), max(10, round(args.replicas * scale))
        started = time.perf_counter()
        built = fleet.build(nodes, models, wanted, timezone.now())
        print(
            f"\n{built.nodes} nodes, {built.models} models, {built.wanted} replicas wanted: "
            f"{built.ready} ready, {built.starting} starting, {built.unplaceable} unplaceable, "
            f"{built.shards} shards; built in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        tables[nodes] = steps(args.runs, env, with_subprocess=nodes == args.nodes)
        clear_queues(env["REDIS_URL"])
        print_table(f"{nodes} nodes", tables[nodes])
    if len(sizes) > 1:
        small = {row.step: row for row in tables[sizes[0]]}
        print(f"\nqueries by fleet size ({sizes[0]} -> {sizes[1]} nodes)")
        for b in tables[sizes[1]]:
            a = small.get(b.step)
            if a is None:
                continue
            if b.step == REGISTER_ALL:  # one register per node: its own count is what matters
                each = f"  (per node: {a.queries / sizes[0]:.1f} -> {b.queries / sizes[1]:.1f})"
                print(f"{b.step:<38} {a.queries:>7} {b.queries:>7}{each}")
                continue
            grows = "  <- grows with the fleet" if b.queries > a.queries + 2 else ""
            print(f"{b.step:<38} {a.queries:>7} {b.queries:>7}{grows}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--models", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--small", type=int, default=500, help="the smaller fleet (0: none)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per step (median)")
    args = parser.parse_args()

    with bench_django(BENCH_DATABASE) as env:
        began = time.perf_counter()
        signal.alarm(HARD_LIMIT_SECONDS)  # bounded: a pass that hangs ends the bench
        try:
            run(args, env)
        finally:
            fleet.clear()
            clear_queues(env["REDIS_URL"])
        print(f"\nthe bench took {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
