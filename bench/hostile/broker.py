"""The broker, from a node host with that node's own credentials (issue 39 parts 1, 2).

A node holds a broker URL (its bundle's ``agent.yaml``): with it, from the node's host,
read another node's queue and the ``unacked`` hashes, read and take the leader lease,
reset a key's quota counter, publish on the routing channel, push a task on the
reconciler's ``control`` queue and load a Lua script: each must be refused by Redis itself
(``NOPERM``); and put a signed command it saw pass back on its queue: its agent must refuse
the replay.

And nothing secret on the broker: ``watch`` runs Redis ``MONITOR`` (as the control plane,
on the services host) from before the replicas are started until the rows are made, and
the last row looks for every ready replica's secret in what Redis was told, in clear and
in base64 (kombu's message bodies), at each of its three alignments.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
import yaml

from bench.hostile.rows import Row
from bench.multinode_support import MANAGE
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
        yield replay_a_command(fleet, node, url)
        yield secrets_on_the_broker(fleet)


def replay_a_command(fleet: Fleet, node: str, url: str) -> Row:
    """A signed command the control plane just sent ``node``, read off the broker as it
    passed (``MONITOR``) and put back on the node's queue with the node's credentials,
    within its deadline: its agent must refuse it as a replay, never obey it twice."""
    what = "broker: replay a captured signed command"
    seen = len(WATCH.raw)
    ask = f"from fleet.commands import read_logs; read_logs({node!r}, lines=1)"
    asked = fleet.run(hosts.CONTROL_PLANES[0], [sys.executable, MANAGE, "shell", "-c", ask])
    if asked.returncode != 0:
        return Row(what, node, False, f"no command to capture: {asked.stderr[-200:]}")
    queue = node_queue(node).encode()
    pushes = [
        args for args in map(monitor_args, WATCH.raw[seen:])
        if len(args) == 3 and args[0].upper() == b"LPUSH" and args[1].startswith(queue)
    ]  # fmt: skip
    if not pushes:
        return Row(what, node, False, "MONITOR saw no command pushed on its queue")
    _lpush, key, message = pushes[-1]
    log = fleet.directory / "logs" / f"{node}-agent.log"
    offset = log.stat().st_size
    pushed = network.in_host(node, lambda: _try(url, lambda r: r.lpush(key, message)))
    if pushed[0]:
        return Row(what, node, True, f"the node may not push on its own queue: {pushed[1]}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with log.open("rb") as lines:
            lines.seek(offset)
            said = [line for line in lines.read().decode(errors="replace").splitlines()
                    if "refusing a command" in line and "replay" in line]  # fmt: skip
        if said:
            return Row(what, node, True, said[-1][said[-1].index("refusing") :][:120])
        time.sleep(0.25)
    return Row(what, node, False, "pushed again and not refused as a replay within 20 s")


def monitor_args(line: str) -> list[bytes]:
    """The arguments of one raw ``MONITOR`` line, as they were sent: Redis quotes each and
    escapes quotes, backslashes and unprintable bytes (``sdscatrepr``)."""
    rest = line.partition("] ")[2]
    escapes = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b"}
    args, at = [], rest.find('"')
    while at >= 0:
        out, at = bytearray(), at + 1
        while at < len(rest) and rest[at] != '"':
            if rest[at] == "\\" and rest[at + 1] == "x":
                out.append(int(rest[at + 2 : at + 4], 16))
                at += 4
            elif rest[at] == "\\":
                out += escapes.get(rest[at + 1], rest[at + 1].encode())
                at += 2
            else:
                out += rest[at].encode()
                at += 1
        args.append(bytes(out))
        at = rest.find('"', at + 1)
    return args


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
        self.lines: list[str] = []  # each command, as redis-py shows it
        self.raw: list[str] = []  # each line as Redis wrote it (monitor_args reads one)
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
                    line = monitor.connection.read_response()
                except (redis.RedisError, OSError):
                    return
                line = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
                self.raw.append(line)
                self.lines.append(b" ".join(monitor_args(line)).decode(errors="replace"))

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
