"""Delay and loss on a simulated host's link: netem, or a relay where the kernel has none.

``impair`` uses netem where the kernel has it. Where it does not (no sch_netem, no
modprobe), it takes the host's outer veth ``lsim-HOST`` off the bridge and puts a tap
device ``lsim.HOST`` on the bridge in its place; this module's process relays every frame
between the two, dropping each with the given probability and holding it for the given
delay, in both directions, as netem on both ends of the link would::

    ns lsim-HOST |                        root namespace
    eth0 ==veth==|== lsim-HOST --AF_PACKET-- relay --tap-- lsim.HOST == bridge

The tap offers the kernel no offloads, so what the bridge hands it is already segmented
and checksummed; on the host's side the relay turns off eth0's checksum and segmentation
offloads (and GRO on ``lsim-HOST``) so that every frame it reads fits the MTU and carries
its checksum, and turns them back on when it stops.

The relay runs as ``python -m llmgw_cli.sim.impair HOST …`` in a session of its own, in
the root namespace: cleanup finds it by that command line, not by namespace. The tap is
the relay's own (not persistent), so a relay that dies takes it along and leaves the host
cut off, never silently unimpaired, until ``unimpair`` (or cleanup) deals with the link.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmgw_cli.sim import network
from llmgw_cli.sim.network import SimError

MODULE = "llmgw_cli.sim.impair"  # in every relay's command line: how cleanup finds them
REPO = Path(__file__).resolve().parents[2]
TUN_DEVICE = Path("/dev/net/tun")
READY = "ready"
START_TIMEOUT = 15
STOP_TIMEOUT = 5
QUEUE_LIMIT = 1000  # frames held per direction, netem's default limit
FRAME_BUFFER = 65536
LIVENESS_INTERVAL = 1.0  # seconds between checks that lsim-HOST is still the same link

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
SIOCETHTOOL = 0x8946
# Legacy ethtool get/set pairs (struct ethtool_value), in the order they are turned off;
# turned back on in reverse, because TSO needs scatter-gather and checksumming first.
OFFLOADS = {"gso": (0x23, 0x24), "tso": (0x1E, 0x1F), "sg": (0x18, 0x19), "tx": (0x16, 0x17)}
GRO = (0x2B, 0x2C)

DELAY = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s)")
LOSS = re.compile(r"(\d+(?:\.\d+)?)%")
SECONDS_PER_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
SUPPORTED = "`delay Nms` and `loss P%`, either or both (e.g. 'delay 50ms loss 1%')"


@dataclass(frozen=True)
class Impairment:
    """What each direction of a link suffers: a fixed delay and a chance of losing a frame."""

    delay: float  # seconds
    loss: float  # 0 to 1


def parse(spec: str) -> Impairment:
    """``delay 50ms loss 1%`` (netem's words) as an Impairment; anything else is refused,
    so that a scenario means the same with netem and with the relay."""
    words = spec.split()
    words += [""] * (len(words) % 2)  # a keyword without its value is refused below
    found: dict[str, float] = {}
    for keyword, value in zip(words[::2], words[1::2], strict=True):
        delay, loss = DELAY.fullmatch(value), LOSS.fullmatch(value)
        if keyword in found:
            raise SimError(f"impairment {spec!r} names {keyword} twice; it takes {SUPPORTED}")
        if keyword == "delay" and delay:
            found["delay"] = float(delay[1]) * SECONDS_PER_UNIT[delay[2]]
        elif keyword == "loss" and loss and float(loss[1]) <= 100:
            found["loss"] = float(loss[1]) / 100
        else:
            raise SimError(f"impairment {spec!r} is not understood: it takes {SUPPORTED}")
    if not found:
        raise SimError(f"impairment {spec!r} says nothing: it takes {SUPPORTED}")
    return Impairment(found.get("delay", 0.0), found.get("loss", 0.0))


def impair(host: str, netem: str, bridge: str = network.BRIDGE) -> None:
    """Delay and loss on both directions of ``host``'s link, e.g. ``delay 50ms loss 1%``:
    with netem where the kernel has it, else with this module's relay."""
    ns = network.namespace(host)
    impairment = parse(netem)  # the same words are refused with netem and without
    unimpair(host, bridge)  # a second impair replaces the first, as netem's replace does
    try:
        network.run("tc", "qdisc", "replace", "dev", ns, "root", "netem", *netem.split())
    except network.SimError as exc:
        if "kind is unknown" not in str(exc):
            raise
    else:
        network.run("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root",
                    "netem", *netem.split())  # fmt: skip
        return
    if why := unavailable_reason():
        raise network.SimError(
            f"this kernel has no netem qdisc (sch_netem) and the relay cannot run ({why}): "
            "load one with `modprobe sch_netem` or `modprobe tun`; "
            "cutting links (cut, block) works without either"
        )
    start(host, impairment)
    tap = tap_name(host)
    try:
        # The tap takes the veth's place on the bridge: every frame now passes the relay.
        network.run("ip", "link", "set", ns, "nomaster")
        network.run("ip", "link", "set", tap, "mtu", network.link_mtu(ns), "master", bridge, "up")
    except network.SimError:
        unimpair(host, bridge)
        raise


def unimpair(host: str, bridge: str = network.BRIDGE) -> None:
    """Undo ``impair``: the link is as ``create_host`` made it."""
    ns = network.namespace(host)
    network.run("tc", "qdisc", "del", "dev", ns, "root", check=False)
    network.run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
    stop(host)  # its tap leaves the bridge with it
    if network.link_master(ns) is None and Path(f"/sys/class/net/{ns}").exists():
        network.run("ip", "link", "set", ns, "master", bridge)


def has_netem(host: str) -> bool:
    """Whether ``host``'s link carries a netem qdisc (``impair`` where the kernel has it)."""
    shown = network.run("tc", "qdisc", "show", "dev", network.namespace(host), check=False)
    return "netem" in shown.stdout


def tap_name(host: str) -> str:
    """The tap that stands on the bridge for ``host`` while it is impaired."""
    return f"{network.PREFIX}.{host}"


def unavailable_reason() -> str | None:
    if not TUN_DEVICE.exists():
        return f"{TUN_DEVICE} is missing (the tun module)"
    return None


# The side that starts and stops relays (impair, unimpair, cleanup).


def start(host: str, impairment: Impairment) -> int:
    """Start the relay for ``host`` and wait until its tap and socket are open; its pid."""
    argv = [sys.executable, "-m", MODULE, host, "--delay", repr(impairment.delay),
            "--loss", repr(impairment.loss)]  # fmt: skip
    # stdout carries the one line saying ready or why not. Nothing else of the caller's is
    # kept open: `llmgw sim impair` must end, and whoever reads its output sees the end.
    relay = subprocess.Popen(
        argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    assert relay.stdout is not None
    readable, _, _ = select.select([relay.stdout], [], [], START_TIMEOUT)
    line = relay.stdout.readline().strip() if readable else ""
    relay.stdout.close()
    if line != READY:
        relay.kill()
        code = relay.wait()
        why = line or (f"it exited with status {code}" if readable else
                       f"no answer within {START_TIMEOUT}s")  # fmt: skip
        raise SimError(f"the impairment relay for {host} did not start: {why}")
    return relay.pid


def relays() -> dict[int, str]:
    """Every running relay, by pid, with the host it impairs."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"-m" in argv and bytes(MODULE, "ascii") in argv:
                at = argv.index(bytes(MODULE, "ascii"))
                found[int(entry.name)] = argv[at + 1].decode()
    return found


def stop(host: str) -> None:
    """Stop ``host``'s relay, if one runs; it turns the offloads back on as it goes."""
    pids = [pid for pid, impaired in relays().items() if impaired == host]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.02)
    for pid in pids:
        if _running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # our own child is reaped, not counted as a zombie
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# The relay itself.


class Stopped(Exception):
    """SIGTERM or SIGINT: leave the loop and restore the offloads."""


def open_tap(name: str) -> int:
    fd = os.open(TUN_DEVICE, os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def open_link(name: str) -> socket.socket:
    """A raw socket on ``name`` that sees every frame the host sends, and none of ours."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((name, ETH_P_ALL))
    with contextlib.suppress(OSError):  # before Linux 4.20: the pkttype check does it
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.setblocking(False)
    return sock


def ethtool(sock: socket.socket, device: str, command: int, value: int = 0) -> int:
    """One legacy ethtool get or set on ``device``, in the namespace ``sock`` belongs to."""
    data = ctypes.create_string_buffer(struct.pack("II", command, value), 8)
    request = struct.pack("16sP16x", device.encode(), ctypes.addressof(data))
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, request)
    return struct.unpack("II", data.raw)[1]


def control_socket(host: str) -> socket.socket:
    """A socket in ``host``'s namespace, for ethtool on its eth0; close it soon, it pins
    the namespace."""
    return network.in_host(host, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))


def offloads_off(host: str) -> dict[str, int]:
    """Turn off eth0's checksum and segmentation offloads and lsim-HOST's GRO; what was on."""
    before = {}
    with control_socket(host) as sock:
        for feature, (get, set_) in OFFLOADS.items():
            before[feature] = ethtool(sock, "eth0", get)
            if before[feature]:
                ethtool(sock, "eth0", set_, 0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        before["gro"] = ethtool(sock, network.namespace(host), GRO[0])
        if before["gro"]:
            ethtool(sock, network.namespace(host), GRO[1], 0)
    return before


def offloads_back(host: str, before: dict[str, int]) -> None:
    if not (network.NETNS_DIR / network.namespace(host)).exists():
        return  # the host is gone, and its links with it
    with contextlib.suppress(OSError), control_socket(host) as sock:
        for feature, (_, set_) in reversed(OFFLOADS.items()):
            if before.get(feature):
                ethtool(sock, "eth0", set_, 1)
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        if before.get("gro"):
            ethtool(sock, network.namespace(host), GRO[1], 1)


class Relay:
    """Frames between the host's veth and the tap, each direction delayed and lossy.

    The delay is the same for every frame, so a FIFO per direction is already in the
    order frames fall due, and each direction keeps its order."""

    def __init__(self, impairment: Impairment, link: socket.socket, tap: int) -> None:
        self.impairment = impairment
        self.link = link
        self.tap = tap
        self.to_bridge: deque[tuple[float, bytes]] = deque()
        self.to_host: deque[tuple[float, bytes]] = deque()

    def hold(self, queue: deque[tuple[float, bytes]], frame: bytes, now: float) -> None:
        if random.random() < self.impairment.loss or len(queue) >= QUEUE_LIMIT:  # noqa: S311
            return
        queue.append((now + self.impairment.delay, frame))

    def read_link(self, now: float) -> None:
        for _ in range(256):  # then the other side gets its turn
            try:
                frame, address = self.link.recvfrom(FRAME_BUFFER)
            except BlockingIOError:
                return
            except OSError:  # ENETDOWN once when the link is cut; it comes back with heal
                return
            if address[2] != PACKET_OUTGOING:
                self.hold(self.to_bridge, frame, now)

    def read_tap(self, now: float) -> bool:
        """Hold what the bridge sent the host; False once the tap is gone (deleted)."""
        for _ in range(256):
            try:
                frame = os.read(self.tap, FRAME_BUFFER)
            except BlockingIOError:
                return True
            except OSError:  # EBADFD: `ip link del` took the tap away
                return False
            self.hold(self.to_host, frame, now)
        return True

    def send_due(self, now: float) -> None:
        while self.to_bridge and self.to_bridge[0][0] <= now:
            frame = self.to_bridge.popleft()[1]
            with contextlib.suppress(OSError):  # the tap not up yet, or full: lost
                os.write(self.tap, frame)
        while self.to_host and self.to_host[0][0] <= now:
            frame = self.to_host.popleft()[1]
            with contextlib.suppress(OSError):  # the link cut, or its queue full: lost
                self.link.send(frame)

    def next_due(self) -> float | None:
        due = [queue[0][0] for queue in (self.to_bridge, self.to_host) if queue]
        return min(due) if due else None

    def run(self, still_there: Callable[[], bool]) -> None:
        poller = select.poll()
        poller.register(self.link.fileno(), select.POLLIN)
        poller.register(self.tap, select.POLLIN)
        checked = time.monotonic()
        while True:
            now = time.monotonic()
            due = self.next_due()
            wait = LIVENESS_INTERVAL if due is None else min(max(due - now, 0), 1.0)
            for fd, _ in poller.poll(wait * 1000):
                if fd == self.tap:
                    if not self.read_tap(time.monotonic()):
                        return
                else:
                    self.read_link(time.monotonic())
            now = time.monotonic()
            self.send_due(now)
            if now - checked > LIVENESS_INTERVAL:
                checked = now
                if not still_there():
                    return


def relay(host: str, impairment: Impairment) -> int:
    """The relay process: open both sides, say ready, relay until told to stop."""
    link_name = network.namespace(host)

    def stopped(signum, frame):
        raise Stopped

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)
    before: dict[str, int] = {}
    try:
        ifindex = socket.if_nametoindex(link_name)
        tap = open_tap(tap_name(host))
        link = open_link(link_name)
        before = offloads_off(host)
    except Exception as exc:  # said on the one line the caller reads
        offloads_back(host, before)
        print(f"{type(exc).__name__}: {exc}", flush=True)
        return 1

    def still_there() -> bool:
        """lsim-HOST is the link we opened, not gone nor made again by a later sim."""
        try:
            return socket.if_nametoindex(link_name) == ifindex
        except OSError:
            return False

    print(READY, flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the caller has stopped reading
    try:
        Relay(impairment, link, tap).run(still_there)
    except Stopped:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut this short
        offloads_back(host, before)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("host")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds, each direction")
    parser.add_argument("--loss", type=float, default=0.0, help="0 to 1, each direction")
    options = parser.parse_args(argv)
    return relay(options.host, Impairment(options.delay, options.loss))


if __name__ == "__main__":
    sys.exit(main())
