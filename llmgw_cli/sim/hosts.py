"""What runs where in the simulated fleet: the hosts, their addresses, their commands.

| host      | address       | runs |
| --------- | ------------- | ---- |
| services  | 198.18.0.2    | PostgreSQL (5432) and Redis (6379) |
| cp1, cp2  | 198.18.0.11-12| daphne (8000) and the reconciler; cp1 starts first and leads |
| router    | 198.18.0.20   | the router (8080) |
| node1..N  | 198.18.1.1..N | an agent, onboarded by certificate, and the engines it starts |
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

SERVICES = "services"
CONTROL_PLANES = ("cp1", "cp2")
ROUTER = "router"
CONTROL_PORT = 8000
ROUTER_PORT = 8080
POSTGRES_PORT = 5432
REDIS_PORT = 6379
MAX_NODES = 254


@dataclass(frozen=True)
class Host:
    name: str
    role: str  # services | control-plane | router | node
    address: str


def plan(nodes: int) -> list[Host]:
    """Every host of a fleet with ``nodes`` node hosts, in the order they start."""
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"--nodes {nodes}: the simulated fleet holds 1 to {MAX_NODES} nodes")
    hosts = [Host(SERVICES, "services", "198.18.0.2")]
    hosts += [Host(name, "control-plane", f"198.18.0.{11 + i}") for i, name in
              enumerate(CONTROL_PLANES)]  # fmt: skip
    hosts.append(Host(ROUTER, "router", "198.18.0.20"))
    hosts += [Host(f"node{i}", "node", f"198.18.1.{i}") for i in range(1, nodes + 1)]
    return hosts


def hosts_file(hosts: list[Host]) -> str:
    """/etc/hosts on every simulated host: itself on loopback, the others by name."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost"]
    lines += [f"{host.address}\t{host.name}" for host in hosts]
    return "\n".join(lines) + "\n"


def servers(hosts: list[Host], tls: bool = True) -> str:
    """The agents' control plane addresses, leader first, as `llmgw_ctl onboard` takes them."""
    scheme = "wss" if tls else "ws"
    return ",".join(f"{scheme}://{h.name}:{CONTROL_PORT}" for h in hosts
                    if h.role == "control-plane")  # fmt: skip


def control_plane_commands(
    host: Host, state_dir: Path, tls: Path | None = None
) -> list[tuple[str, list[str]]]:
    """daphne and the reconciler of one control-plane host, as `llmgw up` runs them; daphne
    serves TLS with the certificate in ``tls`` (server.pem, server-key.pem) when given."""
    python = sys.executable
    listen = ["-b", host.address, "-p", str(CONTROL_PORT)]
    if tls is not None:
        key, cert = tls / "server-key.pem", tls / "server.pem"
        endpoint = f"ssl:{CONTROL_PORT}:interface={host.address}:privateKey={key}:certKey={cert}"
        listen = ["-e", endpoint]
    return [
        ("daphne", [python, "-m", "daphne", *listen, "llmgw_site.asgi:application"]),
        ("reconciler", [python, "-m", "celery", "-A", "llmgw_cli", "worker", "-B", "-Q",
                        "control", "--pool", "threads", "--concurrency", "4", "--loglevel",
                        "INFO", "-n", f"control@{host.name}", "--schedule",
                        str(state_dir / host.name / "celerybeat-schedule")]),
    ]  # fmt: skip


def router_command(host: Host) -> list[str]:
    return [sys.executable, "-m", "router.serve", "--host", host.address,
            "--port", str(ROUTER_PORT), "--processes", "1"]  # fmt: skip


def agent_command(mount: tuple[Path, Path] | None = None) -> list[str]:
    """DESIGN.md's agent command line, its queue named by the host's own hostname.

    ``mount`` (what, where) is bind-mounted first, seen by this agent and its engines
    only: ``ip netns exec`` gives every command its own mount namespace, so a mount made
    there is this host's, the way a filer is mounted on some machines and not others.
    """
    script = (
        f"exec {sys.executable} -m celery -A agent_worker worker -Q node-$(hostname) "
        "-n agent@$(hostname) --loglevel INFO"
    )
    if mount is not None:
        what, where = mount
        script = f"mount --bind {shlex.quote(str(what))} {shlex.quote(str(where))} && {script}"
    return ["sh", "-c", script]
