"""What ``state.json`` records of a simulated fleet (its hosts, processes and each host's
environment), and running things on its hosts, so that ``sim down``, ``sim exec`` and a
later ``sim up`` find what an earlier one made.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from core.env import llmgw_home
from core.files import write_atomically
from llmgw_cli.sim import cleanup, network
from llmgw_cli.sim.hosts import Host

REPO = Path(__file__).resolve().parents[2]
STATE_FILE = "state.json"


def state_dir() -> Path:
    return llmgw_home() / "sim"


@dataclass
class Fleet:
    """What ``state.json`` records: the hosts, the processes, each host's environment."""

    directory: Path
    hosts: list[Host]
    processes: list[dict] = field(default_factory=list)  # host, name, pid, started, log
    env: dict[str, dict[str, str]] = field(default_factory=dict)
    router_url: str = ""

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        names = ", ".join(h.name for h in self.hosts)
        raise network.SimError(f"no simulated host {name!r}; the hosts are {names}")

    def uts_file(self, name: str) -> Path:
        return self.directory / cleanup.UTS_DIR / name

    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` as run on host ``name``."""
        return network.host_command(self.host(name).name, self.uts_file(name), argv)

    @property
    def nodes(self) -> list[Host]:
        return [h for h in self.hosts if h.role == "node"]

    def write(self) -> None:
        """Write ``state.json`` whole, for ``sim down``, ``sim exec`` and a later ``sim up``."""
        data = {
            "hosts": [asdict(h) for h in self.hosts],
            "processes": self.processes,
            "env": self.env,
            "router_url": self.router_url,
        }
        write_atomically(self.directory / STATE_FILE, json.dumps(data, indent=2) + "\n")
        (self.directory / STATE_FILE).chmod(0o600)  # the environments carry passwords

    @classmethod
    def load(cls, directory: Path) -> Fleet | None:
        try:
            data = json.loads((directory / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return cls(
            directory,
            [Host(**h) for h in data["hosts"]],
            data.get("processes", []),
            data.get("env", {}),
            data.get("router_url", ""),
        )

    def start(self, host: str, name: str, argv: list[str]) -> subprocess.Popen:
        """Start ``argv`` on ``host`` in a session of its own, logging under logs/."""
        log_path = self.directory / "logs" / f"{host}-{name}.log"
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                self.command(host, argv), env=self.env[host], cwd=REPO, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.record(host, name, popen.pid, log_path, argv)
        return popen

    def restart(self, host: str, name: str) -> subprocess.Popen:
        """Start ``name`` on ``host`` again as it was started last (after a kill)."""
        for process in reversed(self.processes):
            if (process["host"], process["name"]) == (host, name) and process.get("argv"):
                return self.start(host, name, process["argv"])
        raise network.SimError(f"no process {name!r} was started on {host}")

    def record(
        self, host: str, name: str, pid: int, log_path: Path, argv: list[str] | None = None
    ) -> None:
        started = psutil.Process(pid).create_time()
        self.processes.append(
            {"host": host, "name": name, "pid": pid, "started": started, "log": str(log_path),
             "argv": argv or []}
        )  # fmt: skip
        self.write()

    def run(self, host: str, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        """Run ``argv`` to its end on ``host``, in that host's environment."""
        return subprocess.run(
            self.command(host, argv), env=self.env[host], cwd=REPO, capture_output=True,
            text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def pid(self, host: str, name: str) -> int:
        """The pid of the latest ``name`` process started on ``host`` (to kill or stop it)."""
        for process in reversed(self.processes):
            if (process["host"], process["name"]) == (host, name):
                return process["pid"]
        raise network.SimError(f"no process {name!r} was started on {host}")

    def recorded_pids(self) -> list[tuple[int, float]]:
        return [(p["pid"], p["started"]) for p in self.processes]
