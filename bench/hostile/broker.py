"""The broker, from a node host with that node's own credentials (issue 39 parts 1, 2).

A node holds a broker URL (its bundle's ``agent.yaml``): with it, from the node's host,
read another node's queue and the ``unacked`` hashes, read and take the leader lease,
reset a key's quota counter, publish on the routing channel and push a task on the
reconciler's ``control`` queue. Each must be refused by Redis itself (``NOPERM``).

And nothing secret on the broker: ``watch`` runs Redis ``MONITOR`` (as the control plane,
on the services host) from before the replicas are started until the rows are made, and
the last row looks for every ready replica's secret in what Redis was told, in clear and
in base64 (kombu's message bodies), at each of its three alignments.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
import yaml

from bench.hostile.rows import Row
from bench.sim import query
from core.redis_urls import parse_redis_url
from llmgw_cli.sim import hosts, network
from llmgw_cli.sim.state import Fleet
from protocol.commands import node_queue, unacked_keys
from protocol.rate_limits import counter_keys
from protocol.routing import ROUTING_CHANNEL

LEASE = "llmgw:leader"  # LEADER_LEASE_KEY's default, which the sim keeps


def attempts(fleet: Fleet, scene: Any = None) -> Iterator[Row]:
    node = fleet.nodes[0].name
    other = fleet.nodes[1].name if len(fleet.nodes) > 1 else node
    url = node_broker_url(fleet, node)
    quota = counter_keys("llmgw-sim", time.time()).day
    control_task = json.dumps({"headers": {"task": "catalog.read_model_file"}, "body": ""})
    tries: list[tuple[str, Callable[[redis.Redis], Any]]] = [
        (f"read {other}'s queue", lambda r: r.lrange(node_queue(other), 0, -1)),
        ("read the shared unacked hash", lambda r: r.hgetall("unacked")),
        (f"read {other}'s unacked", lambda r: r.hgetall(unacked_keys(other)["unacked_key"])),
        ("GET the leader lease", lambda r: r.get(LEASE)),
        ("SET the leader lease", lambda r: r.set(LEASE, f"{node}:hostile")),
        ("reset a quota counter", lambda r: r.delete(quota)),
        ("PUBLISH on the routing channel", lambda r: r.publish(ROUTING_CHANNEL, "{}")),
        ("push a control task", lambda r: r.lpush("control", control_task)),
        # One that loops would stall the broker for the whole fleet.
        ("load a Lua script", lambda r: r.script_load("while true do end")),
    ]
    for what, attempt in tries:
        yield Row(f"broker: {what}", node, *network.in_host(node, lambda a=attempt: _try(url, a)))
    if WATCH.running:
        yield secrets_on_the_broker(fleet)


def node_broker_url(fleet: Fleet, node: str) -> str:
    """The broker URL the node's agent uses, from its own agent file."""
    config = Path(fleet.env[node]["LLMGW_AGENT_CONFIG"])
    return str(yaml.safe_load(config.read_text())["broker"])


def _try(url: str, attempt: Callable[[redis.Redis], Any]) -> tuple[bool, str]:
    client = redis.Redis.from_url(parse_redis_url(url, "broker").client_url, socket_timeout=5)
    try:
        answer = attempt(client)
    except redis.exceptions.NoPermissionError as exc:
        return True, f"NOPERM: {str(exc)[:80]}"
    except redis.RedisError as exc:
        return False, f"the attempt could not be made: {type(exc).__name__}: {exc}"[:160]
    finally:
        client.close()
    return False, f"Redis answered {str(answer)[:80]!r}"


# Secrets in what Redis is told


class Watch:
    """``MONITOR`` on the fleet's Redis, as the control plane, on a thread of its own."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.running = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, fleet: Fleet) -> None:
        url = fleet.env[hosts.SERVICES]["REDIS_URL"]
        ready = threading.Event()
        read = lambda: self._read(url, ready)  # noqa: E731
        self._thread = threading.Thread(target=network.in_host, args=(hosts.SERVICES, read),
                                        daemon=True)  # fmt: skip
        self._thread.start()
        ready.wait(10)
        self.running = True

    def _read(self, url: str, ready: threading.Event) -> None:
        client = redis.Redis.from_url(parse_redis_url(url, "REDIS_URL").client_url)
        with client.monitor() as monitor:
            ready.set()
            while not self._stop.is_set():
                try:
                    self.lines.append(str(monitor.next_command().get("command", "")))
                except (redis.RedisError, OSError):
                    return

    def stop(self) -> None:
        self._stop.set()


WATCH = Watch()


def watch(fleet: Fleet) -> None:
    """Start watching what Redis is told; the rows' last looks through it."""
    WATCH.start(fleet)


def secrets_on_the_broker(fleet: Fleet) -> Row:
    secrets = [s for (s,) in query(fleet, "SELECT secret FROM fleet_replica WHERE secret <> ''")]
    WATCH.stop()
    seen = WATCH.lines
    starts = sum(any(f in line for f in _base64_forms("agent.start_shard")) for line in seen)
    found = [s for s in secrets if any(form in line for form in _base64_forms(s) for line in seen)]
    detail = (f"{len(seen)} commands seen by MONITOR, {starts} of them carrying a start; "
              f"{len(found)} of {len(secrets)} replica secrets among them")  # fmt: skip
    blocked = not found and bool(secrets) and bool(seen)
    return Row("broker: a replica secret in what Redis is told", hosts.SERVICES, blocked, detail)


def _base64_forms(secret: str) -> list[str]:
    """``secret`` itself, and what it looks like inside any base64 text, at each of the three
    alignments (the characters its edges share with its neighbours left out)."""
    forms = [secret]
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + secret.encode()).decode().rstrip("=")
        start = (offset * 4 + 2) // 3  # the first character no byte before it shares
        end = len(encoded) - (1 if (offset + len(secret)) % 3 else 0)
        forms.append(encoded[start:end])
    return forms
