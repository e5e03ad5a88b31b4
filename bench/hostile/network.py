"""The node's network: what a host of the fleet reaches on a node's engine ports.

From a node host holding no rank of the replica, from the router host and from the
services host:

- open a llama.cpp worker's ``rpc-server`` and send RPC HELLO (llama.cpp's
  ``ggml-rpc.cpp``: one command byte 14, a little-endian uint64 length, 24 zero bytes of
  connection capabilities; it answers a uint64 length and its protocol version). Only
  rank 0's node may: anyone else who connects can run any tensor operation on it;
- connect to a replica's rendezvous (for llama.cpp across nodes, each worker's rpc port;
  vLLM and SGLang put it on rank 0's port + 1): only the replica's other ranks may;
- ``POST /invocations`` and ``/v1/chat/completions`` straight to a node's engine port. From
  a node or the services host the request must not even connect (vLLM serves
  ``/invocations`` with no key at all). The router host must reach that port, as it
  serves through it: from there the attempt is blocked when the engine refuses a request
  without the replica's secret.

Only a refused connection is blocked: the walls refuse as a closed port does. A connection
that is neither refused nor answered proves nothing: rpc-server serves one client at a
time, and once rank 0 holds it, its listen queue fills and the kernel ignores the next
(what the run before the walls showed). Every attempt runs on its own thread in its
source host's network namespace, all at once.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from bench.hostile.rows import Row
from bench.hostile.scene import Rank, Scene
from llmgw_cli.sim import network

# The sim's bridge answers a SYN in well under a millisecond; a wall that drops it, never.
CONNECT_TIMEOUT = 2.0
ANSWER_TIMEOUT = 5.0
RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
CHAT = {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi."}]}


@dataclass(frozen=True)
class Outcome:
    refused: bool  # the connection was refused: walled, or nothing listens
    detail: str


@dataclass(frozen=True)
class Attempt:
    attempt: str
    source: str
    run: Callable[[], Outcome]
    # From a node or the services host nothing may connect; from the router host the
    # port is open by design, and the engine itself must refuse.
    must_not_connect: bool = True

    def row(self, outcome: Outcome) -> Row:
        if self.must_not_connect:
            blocked = outcome.refused
        else:
            blocked = not outcome.detail.startswith("HTTP 2")
        return Row(self.attempt, self.source, blocked, outcome.detail)


def attempts(fleet, scene: Scene) -> Iterator[Row]:
    planned = list(plan(scene))
    with ThreadPoolExecutor(max_workers=max(1, len(planned))) as pool:
        futures = [pool.submit(network.in_host, a.source, a.run) for a in planned]
        outcomes = [future.result() for future in futures]
    for attempt, outcome in zip(planned, outcomes, strict=True):
        yield attempt.row(outcome)


def plan(scene: Scene) -> Iterator[Attempt]:
    for worker in scene.rpc_workers:
        where = f"{worker.model} rank {worker.rank} rpc-server on {worker.node}"
        for source in sources(scene, worker):
            yield Attempt(f"open {where} and send RPC HELLO", source,
                          lambda w=worker: rpc_hello(w.listens_on, w.port))  # fmt: skip
    for rank, address, port in rendezvous_points(scene):
        where = f"{rank.model}'s rendezvous on {rank.node} ({address}:{port})"
        for source in sources(scene, rank):
            yield Attempt(f"connect to {where}", source,
                          lambda a=address, p=port: tcp_connect(a, p))  # fmt: skip
    for engine in scene.http_ranks:
        for path in ("/invocations", "/v1/chat/completions"):
            where = f"POST {path} straight to {engine.model}'s engine on {engine.node}"
            for source in sources(scene, engine):
                router = source == scene.router
                yield Attempt(
                    f"{where}{' without its key' if router else ''}", source,
                    lambda e=engine, p=path: http_post(e.listens_on, e.port, p),
                    must_not_connect=not router,
                )  # fmt: skip


def sources(scene: Scene, target: Rank) -> list[str]:
    outsider = scene.outsider(target.replica)
    return [s for s in (outsider, scene.router, scene.services) if s is not None]


def rendezvous_points(scene: Scene) -> Iterator[tuple[Rank, str, int]]:
    """Where each replica across nodes meets: llama.cpp's workers listen for rank 0;
    vLLM's and SGLang's rank 0 listens on its port + 1."""
    for rank in scene.multi_node:
        if rank.engine == "llama.cpp" and rank.rank > 0:
            yield rank, rank.listens_on, rank.port
        elif rank.engine != "llama.cpp" and rank.rank == 0:
            yield rank, rank.address, rank.port + 1


NOT_REFUSED = f"not refused, no answer in {CONNECT_TIMEOUT:g}s (its listen queue is full?)"


def connected_socket(address: str, port: int) -> socket.socket | Outcome:
    """A connected socket, or the outcome that stopped it."""
    try:
        return socket.create_connection((address, port), timeout=CONNECT_TIMEOUT)
    except TimeoutError:
        return Outcome(False, NOT_REFUSED)
    except ConnectionRefusedError:
        return Outcome(True, "connection refused")
    except OSError as exc:
        return Outcome(False, f"cannot connect: {exc.strerror or exc}")


def tcp_connect(address: str, port: int) -> Outcome:
    sock = connected_socket(address, port)
    if isinstance(sock, Outcome):
        return sock
    sock.close()
    return Outcome(False, f"connected to {address}:{port}")


def rpc_hello(address: str, port: int) -> Outcome:
    sock = connected_socket(address, port)
    if isinstance(sock, Outcome):
        return sock
    with sock:
        sock.settimeout(ANSWER_TIMEOUT)
        try:
            caps = bytes(RPC_CONN_CAPS_SIZE)
            sock.sendall(bytes([RPC_CMD_HELLO]) + struct.pack("<Q", len(caps)) + caps)
            (size,) = struct.unpack("<Q", receive(sock, 8))
            answer = receive(sock, size)
        except (OSError, struct.error, EOFError) as exc:
            return Outcome(False, f"connected; no HELLO answer ({exc or type(exc).__name__})")
    version = ".".join(str(part) for part in answer[:3])
    return Outcome(False, f"connected; rpc-server answered HELLO: protocol {version}")


def receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("closed")
        data += chunk
    return data


def http_post(address: str, port: int, path: str) -> Outcome:
    host = f"[{address}]" if ":" in address else address
    timeout = httpx.Timeout(ANSWER_TIMEOUT, connect=CONNECT_TIMEOUT)
    try:
        answer = httpx.post(f"http://{host}:{port}{path}", json=CHAT, timeout=timeout)
    except httpx.ConnectTimeout:
        return Outcome(False, NOT_REFUSED)
    except httpx.ConnectError as exc:
        refused = "refused" in str(exc).lower()
        return Outcome(refused, "connection refused" if refused else f"cannot connect: {exc}")
    except httpx.HTTPError as exc:
        return Outcome(False, f"connected; {type(exc).__name__}")
    return Outcome(False, f"HTTP {answer.status_code}: {answer.text[:60]!r}")
