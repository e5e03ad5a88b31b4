"""Running `llmgw up` itself in a test: its own home, its own ports, nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import psutil

from tests.processes.support import REPO, free_port, wait_until


def answers(url: str, **kwargs) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2, **kwargs)
    except httpx.HTTPError:
        return None


def processes_under(home: Path) -> list[psutil.Process]:
    """Every process started for ``home``: by its command line or its LLMGW_HOME."""
    found = []
    for process in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
            environ = process.info["environ"] or {}
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if str(home) in cmdline or environ.get("LLMGW_HOME") == str(home):
            found.append(process)
    return found


def fresh_home() -> tuple[Path, Path]:
    """(home, its parent to remove): outside pytest's 0700 temp root, because the
    embedded PostgreSQL runs as its own user."""
    parent = Path(tempfile.mkdtemp(prefix="llmgw-up-test-"))
    return parent / "home", parent


class Up:
    """`llmgw up` in a process group of its own, on embedded PostgreSQL and Redis."""

    def __init__(self, home: Path, log_path: Path, **extra: str) -> None:
        self.home = home
        self.log_path = log_path
        self.port, self.router_port = free_port(), free_port()
        # As a user runs it: its own services and metrics token (made in its home), and the
        # default engines (R103), which the tests leave off.
        env = {k: v for k, v in os.environ.items()
               if k not in ("DATABASE_URL", "REDIS_URL", "LLMGW_METRICS_TOKEN")}  # fmt: skip
        env.update(LLMGW_HOME=str(home), LLMGW_PORT=str(self.port), LLMGW_DEFAULT_ENGINES="1",
                   LLMGW_ROUTER_PORT=str(self.router_port), PYTHONUNBUFFERED="1",
                   LLMGW_ENGINE_PORT_BASE=str(free_port()))  # fmt: skip
        env.update(extra)
        self.env = env
        self.popen: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def start(self) -> Up:
        log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "llmgw_cli.cli", "up"], cwd=REPO, env=self.env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        return self

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def children(self) -> dict[str, int | None]:
        """Each child's pid, as `llmgw up` last wrote them."""
        try:
            return json.loads((self.home / "up.json").read_text())["children"]
        except (OSError, ValueError, KeyError):
            return {}

    def manage(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """A second terminal's ``manage.py`` on the same home (and so the same servers)."""
        return subprocess.run(
            [sys.executable, "manage.py", *args], cwd=REPO, env=self.env, capture_output=True,
            text=True, timeout=timeout,
        )  # fmt: skip

    def stop(self) -> None:
        """Ctrl-C, then check that everything of the home is gone."""
        assert self.popen is not None
        with_kill = False
        os.killpg(self.popen.pid, signal.SIGINT)
        try:
            self.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
            with_kill = True
        output = self.output()
        assert not with_kill, f"llmgw up did not stop on Ctrl-C:\n{output[-3000:]}"
        assert "llmgw stopped" in output, output[-3000:]
        try:
            wait_until(lambda: not processes_under(self.home), 30, "the home's processes to exit")
        except AssertionError:
            left = [(p.pid, p.info["cmdline"]) for p in processes_under(self.home)]
            raise AssertionError(f"left running: {left}\n{output[-2000:]}") from None

    def kill_everything(self) -> None:
        """Whatever a failed test left of this home."""
        for process in processes_under(self.home):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                process.kill()


def remove_home(parent: Path) -> None:
    shutil.rmtree(parent, ignore_errors=True)
