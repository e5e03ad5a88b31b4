"""The link's walls and the router's, tried in the simulated fleet (issue 39 parts 4, 5).

From a node host, with that node's own bundle: link with a revoked certificate; open 500
unauthenticated /agent/ sockets to the leading control plane and see the fleet's links
stay up; have the node's own agent code link to a fake control plane that hands out a
command key. From the router host, with the router's own process and database role: find
SECRET_KEY or the fleet key, change the catalog, read the users' password hashes.

Each attempt yields one ``Row``; an attempt that could not be made at all is ``ALLOWED``
with what stopped it, so a broken attempt never reads as a wall that holds.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.hostile.rows import Row, attempt, run_alone
from bench.sim import query
from llmgw_cli.sim import hosts, network
from llmgw_cli.sim.state import Fleet

MANAGE = str(Path(__file__).resolve().parents[2] / "manage.py")
# The sockets of the flood, and how many of them a control plane lets wait at once from
# one address (LLMGW_LINK_PENDING_PER_ADDRESS), and for how long (LLMGW_LINK_PROOF_TIMEOUT).
FLOOD = 500
PENDING_PER_ADDRESS = 100
PROOF_TIMEOUT = 10.0


def attempts(fleet: Fleet, scene: Any = None) -> Iterator[Row]:
    node = _field(scene, "attacker") or _field(scene, "node") or fleet.nodes[0].name
    leader = _field(scene, "leader") or hosts.CONTROL_PLANES[0]
    tls = fleet.env[hosts.SERVICES]["REDIS_URL"].startswith("rediss://")  # the sim's TLS
    url = f"{'wss' if tls else 'ws'}://{fleet.host(leader).address}:{hosts.CONTROL_PORT}/agent/"
    yield attempt("link with a revoked certificate", node,
                   lambda: revoked_certificate(fleet, node, leader, url))  # fmt: skip
    yield attempt(f"open {FLOOD} unauthenticated /agent/ sockets", node,
                   lambda: unproven_flood(fleet, node, url))  # fmt: skip
    yield attempt("take a command key from a fake control plane", node,
                   lambda: fake_control_plane(fleet, node))  # fmt: skip
    yield attempt("read SECRET_KEY or the fleet key in the router process", hosts.ROUTER,
                   lambda: router_keys(fleet))  # fmt: skip
    for what, sql in (
        ("change the catalog as the router's database role",
         "UPDATE catalog_profile SET replicas = replicas"),
        ("read password hashes as the router's database role", "SELECT password FROM auth_user"),
    ):  # fmt: skip
        yield attempt(what, hosts.ROUTER, lambda sql=sql: router_database(fleet, sql))


def _field(scene: Any, name: str) -> Any:
    """A field of the runner's scene, a mapping or an object; None when it has none."""
    if scene is None:
        return None
    if isinstance(scene, dict):
        return scene.get(name)
    return getattr(scene, name, None)


# Link with a revoked certificate


def revoked_certificate(fleet: Fleet, node: str, leader: str, url: str) -> tuple[bool, str]:
    """A certificate onboarded and revoked for the purpose (revoking one of the fleet's own
    nodes would cost the legitimate traffic measured beside), used from a node host."""
    name = f"hostile-{secrets.token_hex(3)}"
    bundle = fleet.directory / "hostile" / name
    plain = ["--insecure"] if url.startswith("ws://") else []
    for argv in (["onboard", name, "--servers", url, "--certificate-only", "--out", str(bundle),
                  *plain],
                 ["ca", "revoke", name]):  # fmt: skip
        done = fleet.run(leader, [sys.executable, MANAGE, "llmgw_ctl", *argv], timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"llmgw_ctl {argv[0]} failed: {done.stderr[-300:]}")
    answer = network.in_host(node, lambda: asyncio.run(_link_once(url, name, bundle)))
    refused = answer.get("type") == "refused" and "revoked" in str(answer.get("reason"))
    return refused, str(answer.get("reason") or answer)[:160]


async def _link_once(url: str, node_id: str, bundle: Path) -> dict:
    from websockets.asyncio.client import connect

    from agent_worker.identity import NodeIdentity

    identity = NodeIdentity(str(bundle / "node.pem"), str(bundle / "node-key.pem"))
    headers = {"X-Llmgw-Node": node_id, "X-Llmgw-Auth": "certificate"}
    async with connect(url, additional_headers=headers, open_timeout=10,
                       ssl=_checked_by(url, bundle / "ca.pem")) as ws:  # fmt: skip
        challenge = json.loads(await asyncio.wait_for(ws.recv(), 10))
        await ws.send(json.dumps(identity.proof(challenge["nonce"], node_id)))
        await ws.send(json.dumps({"type": "register"}))
        return json.loads(await asyncio.wait_for(ws.recv(), 10))


# 500 unauthenticated sockets


def unproven_flood(fleet: Fleet, node: str, url: str) -> tuple[bool, str]:
    connected = _connected_nodes(fleet)
    ca = Path(fleet.env[node]["LLMGW_AGENT_CA"])
    outcome = network.in_host(node, lambda: asyncio.run(_flood(url, node, ca)))
    still = _connected_nodes(fleet)
    lost = sorted(connected - still)
    challenged, refused, closed = outcome["challenged"], outcome["refused"], outcome["closed"]
    blocked = challenged <= PENDING_PER_ADDRESS and closed == challenged and not lost
    detail = (f"{challenged} challenged, {refused} refused at once, {closed} of the challenged "
              f"closed by the control plane, {outcome['held']} still open after "
              f"{PROOF_TIMEOUT + 20:g} s; {len(still & connected)}/{len(connected)} nodes "
              f"stayed connected" + (f" (lost: {', '.join(lost)})" if lost else ""))  # fmt: skip
    return blocked, detail


def _checked_by(url: str, ca: Path) -> ssl.SSLContext | None:
    """For a wss:// URL, TLS checked against llmgw's CA (the one every bundle carries)."""
    return ssl.create_default_context(cafile=str(ca)) if url.startswith("wss://") else None


async def _flood(url: str, node: str, ca: Path) -> dict[str, int]:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidHandshake

    headers = {"X-Llmgw-Node": node, "X-Llmgw-Auth": "certificate"}
    counts = {"challenged": 0, "refused": 0, "closed": 0, "held": 0}
    context = _checked_by(url, ca)

    async def one() -> None:
        try:
            async with connect(url, additional_headers=headers, open_timeout=30,
                               ssl=context) as ws:  # fmt: skip
                first = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if first.get("type") != "challenge":
                    counts["refused"] += 1
                    return
                counts["challenged"] += 1
                # Never answered: the control plane must close it (its reason, then the close).
                try:
                    async with asyncio.timeout(PROOF_TIMEOUT + 20):
                        while True:
                            await ws.recv()
                except ConnectionClosed:
                    counts["closed"] += 1
                except TimeoutError:
                    counts["held"] += 1
        except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake):
            # Over TLS, a socket the control plane drops mid-handshake ends as an invalid
            # HTTP answer: refused all the same.
            counts["refused"] += 1

    await asyncio.gather(*(one() for _ in range(FLOOD)))
    return counts


def _connected_nodes(fleet: Fleet) -> set[str]:
    return {row[0] for row in query(fleet, "SELECT id FROM fleet_node WHERE state = 'connected'")}


# A fake control plane


def fake_control_plane(fleet: Fleet, node: str) -> tuple[bool, str]:
    """The node's own agent link code, with the node's own certificate, dials a control
    plane that answers "linked" with a command key: unproven, then signed by the node's own
    certificate (the best a node-host attacker holds)."""
    env = fleet.env[node]
    files = (env["LLMGW_AGENT_CERT"], env["LLMGW_AGENT_KEY"], env["LLMGW_AGENT_CA"])
    keys = {sign: network.in_host(node, lambda sign=sign: asyncio.run(_fake_link(files, sign)))
            for sign in (False, True)}  # fmt: skip
    taken = {sign: key for sign, key in keys.items() if key}
    if taken:
        return False, f"the agent took the key {sorted(taken.values())} from the fake"
    return True, "the agent took no command key from an unproven or node-signed 'linked'"


async def _fake_link(files: tuple[str, str, str], sign_as_node: bool) -> str:
    from websockets.asyncio.server import serve

    from agent_worker.identity import NodeIdentity
    from agent_worker.link import AgentLink, LinkCallbacks

    identity = NodeIdentity(*files)
    node_key = Path(files[1]).read_bytes()
    answered = asyncio.Event()

    async def handler(ws) -> None:
        await ws.send(json.dumps({"type": "challenge", "nonce": "0" * 32}))
        await ws.recv()  # the proof
        await ws.recv()  # the register
        answer: dict = {"type": "linked", "command_key": "the attacker's key"}
        if sign_as_node:
            answer["proof"] = _node_signature(identity.cert_pem, node_key, ws)
        await ws.send(json.dumps(answer))
        answered.set()
        await asyncio.sleep(1)

    class Canned:
        def model_dump_json(self) -> str:
            return json.dumps({"type": "register"})

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        callbacks = LinkCallbacks(register=Canned, heartbeat=Canned)
        link = AgentLink([f"ws://127.0.0.1:{port}"], "hostile", "", callbacks,
                         heartbeat_interval=60, identity=identity)  # fmt: skip
        task = asyncio.create_task(link.run())
        await asyncio.wait_for(answered.wait(), 30)
        await asyncio.sleep(0.5)  # the agent has read the answer, and taken its key or not
        link.stop()
        await asyncio.wait_for(task, 10)
        return link.command_key


def _node_signature(cert_pem: bytes, key_pem: bytes, ws) -> dict[str, str]:
    import base64

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from protocol.signing import linked_payload

    nonce = ws.request.headers.get("X-Llmgw-Link-Nonce", "")
    node_id = ws.request.headers.get("X-Llmgw-Node", "")
    key = serialization.load_pem_private_key(key_pem, None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    payload = linked_payload(nonce, node_id, "the attacker's key", 0)
    signature = key.sign(payload, ec.ECDSA(hashes.SHA256()))
    return {"certificate": cert_pem.decode(), "signature": base64.b64encode(signature).decode()}


# The router's keys and database role


def router_keys(fleet: Fleet) -> tuple[bool, str]:
    """What the router process holds: its environment and its home. (The sim's hosts share
    one filesystem, so the control planes' home is on the router host's disk too: that is
    the sim's, not the router's; on a real host the router runs as a user of its own.)"""
    pid = fleet.pid(hosts.ROUTER, "router")
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    found = [entry.split(b"=", 1)[0].decode() for entry in environ
             if entry.split(b"=", 1)[0] in (b"SECRET_KEY", b"LLMGW_FLEET_KEY")
             and entry.split(b"=", 1)[1]]  # fmt: skip
    home = Path(fleet.env[hosts.ROUTER]["LLMGW_HOME"])
    found += [str(home / name) for name in ("secret_key", "fleet_key") if (home / name).exists()]
    if found:
        return False, f"the router holds {', '.join(found)}"
    return True, f"neither in the router's environment (pid {pid}) nor under its home {home}"


def router_database(fleet: Fleet, sql: str) -> tuple[bool, str]:
    import psycopg

    url = fleet.env[hosts.ROUTER]["DATABASE_URL"]

    def run() -> tuple[bool, str]:
        with psycopg.connect(url, connect_timeout=5) as conn:
            try:
                conn.execute(sql)
            except psycopg.errors.InsufficientPrivilege as exc:
                return True, str(exc).splitlines()[0]
            conn.rollback()  # an attempt that got through changes nothing all the same
            return False, f"{sql!r} ran as the router's role"

    return network.in_host(hosts.ROUTER, run)


if __name__ == "__main__":  # this module alone, against a running `llmgw sim up`
    run_alone(attempts)
