"""Waiting for a simulated fleet's parts to come up, and reading what its services hold
(the leader's lease, the nodes' rows), from inside the hosts' namespaces."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from llmgw_cli.sim import hosts, network
from llmgw_cli.sim.hosts import Host
from llmgw_cli.sim.state import Fleet

START_TIMEOUT = 120  # seconds for any one thing to come up, on a busy 2-core machine
LEASE_KEY = "llmgw:leader"


def wait_for(condition: Callable[[], object], what: str, timeout: float = START_TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except Exception:  # not up yet: refused, unreachable, a table not migrated
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise network.SimError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def listening(host: Host, port: int) -> bool:
    def connect() -> bool:
        with socket.socket() as sock:
            sock.settimeout(1)
            return sock.connect_ex((host.address, port)) == 0

    return network.in_host(host.name, connect)


def leader(fleet: Fleet) -> str:
    """The control plane holding the lease, as seen from the services host."""
    import redis

    def read() -> str:
        conn = redis.Redis.from_url(fleet.env[hosts.SERVICES]["REDIS_URL"], socket_timeout=2)
        raw = conn.get(LEASE_KEY)
        holder = raw.decode() if isinstance(raw, bytes) else str(raw or "")
        return holder.rpartition("|")[0]  # "ws://cp1:8000|EPOCH"

    return network.in_host(hosts.SERVICES, read)


def node_rows(fleet: Fleet) -> list[tuple[str, str, str]]:
    """(id, state, address) of every node the database knows, read on the services host."""
    import psycopg

    def read() -> list[tuple[str, str, str]]:
        url = fleet.env[hosts.SERVICES]["DATABASE_URL"]
        with psycopg.connect(url, connect_timeout=2) as conn:
            return conn.execute("SELECT id, state, address FROM fleet_node ORDER BY id").fetchall()

    return network.in_host(hosts.SERVICES, read)


def node_fabrics(fleet: Fleet) -> dict[str, list[str]]:
    """Each node's fabrics as its last register reported them."""
    import psycopg

    def read() -> dict[str, list[str]]:
        url = fleet.env[hosts.SERVICES]["DATABASE_URL"]
        with psycopg.connect(url, connect_timeout=2) as conn:
            rows = conn.execute("SELECT id, inventory FROM fleet_node ORDER BY id").fetchall()
        return {node: [f["name"] for f in (inv or {}).get("fabrics", [])] for node, inv in rows}

    return network.in_host(hosts.SERVICES, read)


def leads(fleet: Fleet, name: str) -> bool:
    return leader(fleet) == f"ws://{name}:{hosts.CONTROL_PORT}"
