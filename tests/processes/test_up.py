"""`llmgw up` on a fresh home: embedded PostgreSQL and Redis, every process, clean stop."""

from __future__ import annotations

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
import pytest

from tests.processes.support import REPO, free_port, wait_for

pytestmark = pytest.mark.process


def _answers(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None


def _processes_under(home) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
            environ = process.info["environ"] or {}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if str(home) in cmdline or environ.get("LLMGW_HOME") == str(home):
            found.append(process)
    return found


@pytest.fixture
def home():
    """Outside pytest's 0700 temp root: the embedded PostgreSQL runs as its own user."""
    path = Path(tempfile.mkdtemp(prefix="llmgw-up-test-"))
    yield path / "home"
    shutil.rmtree(path, ignore_errors=True)


def test_up_starts_everything_on_embedded_services_and_ctrl_c_stops_it_all(tmp_path, home):
    port, router_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(LLMGW_HOME=str(home), LLMGW_PORT=str(port), LLMGW_ROUTER_PORT=str(router_port),
               LLMGW_DEMO="0", PYTHONUNBUFFERED="1")  # fmt: skip
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [sys.executable, "-m", "llmgw_site.cli", "up"], cwd=REPO, env=env, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        login = wait_for(lambda: _answers(f"{base}/accounts/login/"), 120, "the login page")
        assert login.status_code == 200 and b"Sign in" in login.content
        assert httpx.get(f"{base}/", timeout=5).status_code == 302  # pages need login
        schema = httpx.get(f"{base}/api/schema/", timeout=5)
        assert schema.status_code == 200 and b"openapi" in schema.content
        assert httpx.get(f"{base}/api/v1/models/", timeout=5).status_code in (401, 403)
        router_url = f"http://127.0.0.1:{router_port}"
        refused = wait_for(lambda: _answers(f"{router_url}/v1/models"), 60, "the router")
        assert refused.status_code == 401  # /v1 needs an API key
        created = subprocess.run(
            [sys.executable, "manage.py", "llmgw_ctl", "keys", "create", "smoke"], cwd=REPO,
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        key = created.stdout.splitlines()[0]
        models = httpx.get(f"{router_url}/v1/models", headers={"Authorization": f"Bearer {key}"},
                           timeout=5)  # fmt: skip
        assert models.status_code == 200
        assert models.json()["data"] == []
        # The local agent registers, and /metrics shows it.
        metrics = wait_for(
            lambda: (r := _answers(f"{base}/metrics")) and b"llmgw_node_up{" in r.content and r,
            60,
            "the local node in /metrics",
        )
        assert b"llmgw_node_up{" in metrics.content
        # Another terminal with the same home reaches the same database and Redis.
        other = subprocess.run(
            [sys.executable, "manage.py", "llmgw_ctl", "nodes", "--json"], cwd=REPO, env=env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert other.returncode == 0, other.stderr[-2000:]
        assert [node["state"] for node in json.loads(other.stdout)] == ["connected"]
        password_file = home / "admin-password"
        assert password_file.exists() and oct(password_file.stat().st_mode)[-3:] == "600"
        assert (home / "postgres" / "PG_VERSION").exists()
        assert (home / "redis" / "redis.sock").exists()
    finally:
        os.killpg(up.pid, signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    output = (tmp_path / "up.log").read_text(errors="replace")
    assert "llmgw stopped" in output, output[-3000:]
    try:
        wait_for(lambda: not _processes_under(home), 30, "every process of this home to exit")
    except AssertionError:
        left = [(p.pid, p.info["cmdline"]) for p in _processes_under(home)]
        raise AssertionError(f"left running: {left}\n{output[-2000:]}") from None
