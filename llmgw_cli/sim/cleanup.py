"""Remove everything a simulated fleet made, whether ``sim down`` or a crash left it.

Found by name and by namespace, not only by the state file, so that a harness killed
half way leaves nothing the next ``sim up`` cannot find: every process whose network
namespace is one of ours (engines and PostgreSQL's backends included), every impairment
relay (by its command line: it lives in the root namespace), every namespace and link
named with the prefix, every UTS bind mount under an ``lsim-uts`` directory, every
``/etc/netns/lsim-*``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from core.mounts import read_mounts
from llmgw_cli.sim import impair, network

UTS_DIR = f"{network.PREFIX}-uts"  # under the state directory: one file per host
TERM_GRACE_SECONDS = 8


def processes_in_our_namespaces() -> list[int]:
    """The pids of every process living in a network namespace of the sim."""
    inodes = {network.namespace_inode(ns) for ns in network.our_namespaces()} - {None}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            link = os.readlink(entry / "ns" / "net")  # "net:[4026532283]"
            if int(link.split("[", 1)[1].rstrip("]")) in inodes:
                found.append(int(entry.name))
    return found


def stop_processes(pids: list[int], grace: float = TERM_GRACE_SECONDS) -> None:
    """SIGTERM, then SIGKILL whatever is left after ``grace`` seconds; reap our children."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in _alive(pids):
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # a child of this process is reaped, not left a zombie
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def uts_mounts() -> list[str]:
    """Mount points of the sims' UTS namespaces, in this mount namespace."""
    return [mount.point for mount in read_mounts() if f"/{UTS_DIR}/" in mount.point]


def remove_network() -> None:
    for ns in network.our_namespaces():
        network.run("ip", "netns", "del", ns, check=False)
    for link in network.our_links():
        network.run("ip", "link", "del", link, check=False)
    for point in uts_mounts():
        network.run("umount", "-l", point, check=False)
    if network.ETC_NETNS.is_dir():
        for etc in network.ETC_NETNS.glob(f"{network.PREFIX}-*"):
            for file in etc.iterdir():
                file.unlink()
            etc.rmdir()
        with contextlib.suppress(OSError):
            network.ETC_NETNS.rmdir()  # only when empty: another tool's entries stay


def still_ours(recorded: list[tuple[int, float]]) -> list[int]:
    """The recorded (pid, start time) pairs still running: a pid reused since is not ours."""
    running = []
    for pid, started in recorded:
        with contextlib.suppress(psutil.Error):
            if abs(psutil.Process(pid).create_time() - started) < 1:
                running.append(pid)
    return running


def remove_everything(recorded: list[tuple[int, float]]) -> None:
    """Every process (recorded, in a namespace of ours, or a relay), then the network."""
    ours = set(still_ours(recorded)) | set(processes_in_our_namespaces()) | set(impair.relays())
    stop_processes(sorted(ours))
    # Anything started in between (an engine a dying agent spawned) goes without grace.
    stop_processes(processes_in_our_namespaces(), grace=0)
    remove_network()


def leftovers() -> list[str]:
    """What of a sim still exists, in words; empty when nothing does."""
    found = [f"namespace {ns}" for ns in network.our_namespaces()]
    found += [f"link {link}" for link in network.our_links()]
    found += [f"mount {point}" for point in uts_mounts()]
    found += [f"process {pid}" for pid in processes_in_our_namespaces()]
    found += [f"impairment relay {pid} for {host}" for pid, host in impair.relays().items()]
    return found


@dataclass(frozen=True)
class RunningFleet:
    """A simulated fleet with processes running now, whoever started it and from where."""

    directories: tuple[Path, ...]  # its state directories, by its hosts' UTS mounts
    namespaces: tuple[str, ...]
    processes: int

    def __str__(self) -> str:
        where = ", ".join(str(d) for d in self.directories) or "a state directory unknown"
        hosts = ", ".join(ns.removeprefix(f"{network.PREFIX}-") for ns in self.namespaces)
        count = f"{self.processes} process{'' if self.processes == 1 else 'es'} running"
        return f"the one in {where} (hosts {hosts or 'none'}; {count})"


def running_fleet() -> RunningFleet | None:
    """The simulated fleet running on this machine (the namespaces are the machine's, so
    there is at most one), or None when nothing of one runs: namespaces, links and
    mounts with no process left in them are a crashed run's leftovers, not a fleet."""
    processes = set(processes_in_our_namespaces()) | set(impair.relays())
    if not processes:
        return None
    directories = {Path(point).parent.parent for point in uts_mounts()}
    return RunningFleet(
        tuple(sorted(directories)), tuple(sorted(network.our_namespaces())), len(processes)
    )
