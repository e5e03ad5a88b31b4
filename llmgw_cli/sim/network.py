"""The simulated fleet's network: one namespace per host on one bridge, nothing else.

Every host gets a network namespace ``lsim-HOST``, a veth pair whose outer end (also
``lsim-HOST``) is enslaved to the bridge ``lsim-br0`` and whose inner end is ``eth0``,
and one address in 198.18.0.0/15, the range set aside for benchmarking (RFC 2544). The
bridge has no address and no port but the hosts' veths, and no host has a default route:
a simulated host can reach the other simulated hosts and its own loopback, nothing more.

Each host also has a UTS namespace of its own, kept by a bind mount on a file under the
sim's state directory, so that ``hostname`` there is the host's name (the node id, and its
certificate's common name). ``host_command`` enters both.

The faults the partition scenarios need are here too: ``cut``/``heal`` a host's link,
``block``/``unblock`` one peer from a host; ``impair.py`` adds delay and loss.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

PREFIX = "lsim"
BRIDGE = f"{PREFIX}-br0"
PREFIX_LENGTH = 15  # 198.18.0.0/15
NETNS_DIR = Path("/run/netns")
# `ip netns exec` bind-mounts the files here over /etc: each host's /etc/hosts names the others.
ETC_NETNS = Path("/etc/netns")
IFNAMSIZ = 15  # the kernel's limit on an interface name, without its NUL
CLONE_NEWNET = 0x40000000
TOOLS = ("ip", "tc", "nsenter", "unshare", "mount", "umount")

T = TypeVar("T")


class SimError(RuntimeError):
    """A step of the simulated fleet that failed, naming the command and its output."""


def unavailable_reason() -> str | None:
    """Why the simulated fleet cannot run here, in one line; None when it can."""
    if not sys.platform.startswith("linux"):
        return f"the simulated fleet needs Linux network namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return "the simulated fleet needs root (it creates network namespaces): run it with sudo"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"the simulated fleet needs {', '.join(missing)} (iproute2, util-linux)"
    from agent_worker.walls.nftables import nft_binary

    if nft_binary() is None:
        return (
            "the simulated fleet needs nft: each node walls its engines' ports "
            "(apt install nftables, or scripts/ensure-nftables)"
        )
    if not Path("/proc/self/ns/net").exists() or not Path("/proc/self/ns/uts").exists():
        return "this kernel has no network or UTS namespaces (/proc/self/ns/net is missing)"
    return None


def namespace(host: str) -> str:
    """The network namespace of ``host``, and the name of its veth on the bridge."""
    name = f"{PREFIX}-{host}"
    if len(name) > IFNAMSIZ:
        raise SimError(f"host name {host!r} is too long: {name!r} exceeds {IFNAMSIZ} characters")
    return name


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise SimError(f"{' '.join(argv)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def create_bridge(bridge: str = BRIDGE) -> None:
    # nf_call_*tables 0: a host firewall's FORWARD policy (Docker's DROP) must not filter
    # frames between simulated hosts; this bridge alone, not the machine's setting.
    run("ip", "link", "add", bridge, "type", "bridge", "nf_call_iptables", "0",
        "nf_call_ip6tables", "0", "nf_call_arptables", "0")  # fmt: skip
    run("ip", "link", "set", bridge, "up")


def create_host(
    host: str, address: str, uts_file: Path, hosts_file: str, bridge: str = BRIDGE
) -> None:
    """The namespaces, link, address and hostname of one host."""
    ns = namespace(host)
    run("ip", "netns", "add", ns)
    run("ip", "link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns)
    run("ip", "link", "set", ns, "master", bridge, "up")
    run("ip", "-n", ns, "addr", "add", f"{address}/{PREFIX_LENGTH}", "dev", "eth0")
    run("ip", "-n", ns, "link", "set", "eth0", "up")
    run("ip", "-n", ns, "link", "set", "lo", "up")
    etc = ETC_NETNS / ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(hosts_file)
    uts_file.parent.mkdir(parents=True, exist_ok=True)
    uts_file.touch()
    run("unshare", f"--uts={uts_file}", "hostname", host)


def host_command(host: str, uts_file: Path, argv: list[str]) -> list[str]:
    """``argv`` as run on ``host``: in its network namespace (and /etc/hosts) and hostname."""
    return ["ip", "netns", "exec", namespace(host), "nsenter", f"--uts={uts_file}", "--", *argv]


def in_host(host: str, call: Callable[[], T]) -> T:
    """Run ``call`` in a thread that has entered ``host``'s network namespace: sockets it
    opens are that host's. Only the thread moves; this process stays where it is."""
    outcome: dict[str, object] = {}

    def enter_and_call() -> None:
        try:
            enter(host)
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=enter_and_call, name=f"in-{host}", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def enter(host: str) -> None:
    """Move the calling thread into ``host``'s network namespace, for good: only a thread
    started for the purpose should call this (``in_host`` does, and so do load clients)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(NETNS_DIR / namespace(host)) as handle:
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            why = os.strerror(ctypes.get_errno())
            raise SimError(f"cannot enter {namespace(host)}: {why}")


# Faults: what the partition scenarios (and a person at a shell) do to a host's link.


def cut(host: str) -> None:
    """Take ``host``'s link down: it reaches no other host, and none reaches it."""
    run("ip", "link", "set", namespace(host), "down")


def heal(host: str) -> None:
    run("ip", "link", "set", namespace(host), "up")


def block(host: str, peer_address: str) -> None:
    """``host`` can no longer exchange packets with ``peer_address``; others are unaffected."""
    run("ip", "-n", namespace(host), "route", "add", "blackhole", f"{peer_address}/32")


def unblock(host: str, peer_address: str) -> None:
    run("ip", "-n", namespace(host), "route", "del", "blackhole", f"{peer_address}/32")


def link_master(link: str) -> str | None:
    """The bridge ``link`` is a port of, if any."""
    try:
        return os.path.basename(os.readlink(f"/sys/class/net/{link}/master"))
    except OSError:
        return None


def link_mtu(link: str) -> str:
    return Path(f"/sys/class/net/{link}/mtu").read_text().strip()


# What exists now, for status and cleanup.


def our_namespaces() -> list[str]:
    listed = run("ip", "netns", "list", check=False).stdout.splitlines()
    names = [line.split()[0] for line in listed if line.strip()]
    return [name for name in names if name.startswith(f"{PREFIX}-")]


def our_links() -> list[str]:
    """Links in this (the root) namespace named with the sim's prefix (``lsim.HOST``: an
    impairment relay's tap)."""
    listed = run("ip", "-o", "link", "show", check=False).stdout.splitlines()
    names = [line.split(":", 2)[1].strip().split("@")[0] for line in listed if ":" in line]
    return [name for name in names if name.startswith((f"{PREFIX}-", f"{PREFIX}."))]


def link_up(host: str) -> bool:
    shown = run("ip", "-o", "link", "show", namespace(host), check=False).stdout
    return ",UP" in shown or "<UP" in shown


def namespace_inode(ns: str) -> int | None:
    try:
        return (NETNS_DIR / ns).stat().st_ino
    except OSError:
        return None
