"""Throwaway network namespaces for tests of the node's walls: real nftables, real packets,
and nothing of the machine's own rules touched.

``Namespaces`` makes a node namespace and a client namespace joined by a veth pair, with
addresses of the node and several client addresses; ``inside`` runs a call on a thread
that entered one (a process it starts, ``nft`` included, is in that namespace too).
Everything is removed by ``close``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
NODE_ADDRESS = "10.199.0.1"
CLIENTS = ("10.199.0.2", "10.199.0.3", "10.199.0.4")


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None or not Path("/usr/sbin/nft").exists():
        return "needs iproute2 and nftables (scripts/test-packages installs them)"
    return None


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)


class Namespaces:
    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.node, self.client = f"wt-n-{tag}", f"wt-c-{tag}"
        _ip("netns", "add", self.node)
        _ip("netns", "add", self.client)
        _ip("link", "add", f"wtn{tag}", "netns", self.node, "type", "veth", "peer", "name",
            f"wtc{tag}", "netns", self.client)  # fmt: skip
        _ip("-n", self.node, "addr", "add", f"{NODE_ADDRESS}/24", "dev", f"wtn{tag}")
        for address in CLIENTS:
            _ip("-n", self.client, "addr", "add", f"{address}/24", "dev", f"wtc{tag}")
        for ns, link in ((self.node, f"wtn{tag}"), (self.client, f"wtc{tag}")):
            _ip("-n", ns, "link", "set", link, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def inside(self, namespace: str, call: Callable[[], T]) -> T:
        outcome: dict[str, object] = {}

        def run() -> None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                with open(f"/run/netns/{namespace}") as handle:
                    if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns")
                outcome["value"] = call()
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join()
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return outcome["value"]  # type: ignore[return-value]

    def listen(self, port: int) -> socket.socket:
        """A TCP listener on the node's address (and, being the node's, on loopback too)."""

        def bind() -> socket.socket:
            server = socket.socket()
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("0.0.0.0", port))  # noqa: S104 (inside a throwaway namespace)
            server.listen(16)
            return server

        return self.inside(self.node, bind)

    def connect_from(self, source: str, port: int) -> str:
        """ "connected", "refused" or "silent": what a client at ``source`` gets."""

        def attempt() -> str:
            with socket.socket() as client:
                client.settimeout(2.0)
                client.bind((source, 0))
                try:
                    client.connect((NODE_ADDRESS, port))
                except ConnectionRefusedError:
                    return "refused"
                except TimeoutError:
                    return "silent"
                return "connected"

        return self.inside(self.client, attempt)

    def nft_list(self) -> str:
        done = subprocess.run(["ip", "netns", "exec", self.node, "nft", "list", "ruleset"],
                              capture_output=True, text=True, check=False)  # fmt: skip
        return done.stdout

    def close(self) -> None:
        for ns in (self.node, self.client):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
