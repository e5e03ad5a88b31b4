"""`llmgw up` on a fresh home: embedded PostgreSQL and Redis, every process, clean stop."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

from llmgw_cli.local_engine import wheel_llama_server
from protocol.engines import DEFAULT_LLAMA_CPP
from tests.processes.support import wait_until
from tests.processes.up_support import Up, answers, fresh_home, remove_home

pytestmark = pytest.mark.process


@pytest.fixture
def home():
    path, parent = fresh_home()
    yield path
    remove_home(parent)


def test_up_starts_everything_on_embedded_services_and_ctrl_c_stops_it_all(tmp_path, home):
    # Two control-plane processes on one socket, as a fleet outgrowing one core runs it.
    up = Up(home, tmp_path / "up.log", LLMGW_DEMO="0", LLMGW_CONTROL_PLANE_PROCESSES="2").start()
    try:
        base = up.base
        login = wait_until(lambda: answers(f"{base}/accounts/login/"), 120, "the login page")
        assert login.status_code == 200 and b"Sign in" in login.content
        assert httpx.get(f"{base}/", timeout=5).status_code == 302  # pages need login
        schema = httpx.get(f"{base}/api/schema/", timeout=5)
        assert schema.status_code == 200 and b"openapi" in schema.content
        assert httpx.get(f"{base}/api/v1/models/", timeout=5).status_code in (401, 403)
        router_url = up.router_url
        refused = wait_until(lambda: answers(f"{router_url}/v1/models"), 60, "the router")
        assert refused.status_code == 401  # /v1 needs an API key
        key = up.manage("llmgw_ctl", "keys", "create", "smoke").stdout.splitlines()[0]
        models = httpx.get(f"{router_url}/v1/models", headers={"Authorization": f"Bearer {key}"},
                           timeout=5)  # fmt: skip
        assert models.status_code == 200
        assert models.json()["data"] == []
        # The pages' playground asks this router from the control plane's origin.
        preflight = httpx.options(
            f"{router_url}/v1/chat/completions", timeout=5,
            headers={"Origin": base, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"},
        )  # fmt: skip
        assert preflight.headers.get("access-control-allow-origin") == base, preflight.headers
        # /metrics, the control plane's and the router's, needs the token `up` made in its
        # home (review finding 20: never open by default); with it the local agent shows.
        assert httpx.get(f"{base}/metrics", timeout=5).status_code == 401
        assert httpx.get(f"{router_url}/metrics", timeout=5).status_code == 401
        token = (home / "metrics-token").read_text().strip()
        assert oct((home / "metrics-token").stat().st_mode & 0o777) == "0o600"
        bearer = {"Authorization": f"Bearer {token}"}
        metrics = wait_until(
            lambda: (r := answers(f"{base}/metrics", headers=bearer)) and b"llmgw_node_up{"
            in r.content and r, 60, "the local node in /metrics",
        )  # fmt: skip
        assert b"llmgw_node_up{" in metrics.content
        routed = httpx.get(f"{router_url}/metrics", headers=bearer, timeout=5)
        assert routed.status_code == 200 and b"llmgw_router_" in routed.content
        # Another terminal with the same home reaches the same database and Redis. With no
        # catalog at all, the node installs llmgw's default llama.cpp on link (rule R103).
        node = wait_until(lambda: _node_with_default_engine(up), 180, "the default llama.cpp")
        assert node["state"] == "connected"
        engines = {engine["version"]: engine for engine in node["engines"]}
        default = engines.pop(DEFAULT_LLAMA_CPP.version)
        assert (default["engine"], default["managed"], default["origin"]) == (
            "llama.cpp", True, "default",
        )  # fmt: skip
        # The llama-server `make engines` built, when there is one, is named by `llmgw up`.
        assert [(e["detail"], e["origin"]) for e in engines.values()] == (
            [("named in the agent file", "found on the node")] if wheel_llama_server() else []
        )
        # It linked by its own local certificate: no token, no set-up.
        assert (home / "agent-tls" / "node.pem").exists()
        assert oct((home / "agent-tls" / "node-key.pem").stat().st_mode)[-3:] == "600"
        assert "LLMGW_AGENT_TOKEN" not in up.env
        password_file = home / "admin-password"
        assert password_file.exists() and oct(password_file.stat().st_mode)[-3:] == "600"
        assert (home / "postgres" / "PG_VERSION").exists()
        assert (home / "redis" / "redis.sock").exists()
        # Every child's output is in its own log file, and echoed by `llmgw up`.
        assert set(up.children()) == {"postgres", "redis", "control-plane", "control-plane-2",
                                      "router", "reconciler", "agent"}  # fmt: skip
        assert "agent@" in (home / "logs" / "agent.log").read_text()
        assert "agent | " in up.output()
        # One control-plane process killed: the other answers on the same port meanwhile
        # (its restart on the held socket: test_up_restarts).
        os.kill(up.children()["control-plane"], signal.SIGKILL)
        for _ in range(20):
            assert httpx.get(f"{base}/accounts/login/", timeout=5).status_code == 200
    finally:
        up.stop()


def _node_with_default_engine(up: Up) -> dict | None:
    listed = up.manage("llmgw_ctl", "nodes", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    [node] = json.loads(listed.stdout)
    versions = {e["version"]: e["status"] for e in node["engines"] or []}
    return node if versions.get(DEFAULT_LLAMA_CPP.version) == "installed" else None
