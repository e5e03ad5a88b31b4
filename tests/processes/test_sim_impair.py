"""`impair.impair` on real traffic between two simulated hosts: netem where the kernel has
it, else the userspace relay; `unimpair` puts the link back as it was."""

from __future__ import annotations

import contextlib
import socket
import statistics
import struct
import threading
import time
from pathlib import Path

import pytest

from llmgw_cli.sim import cleanup, impair, network
from llmgw_cli.sim.impair import Impairment

pytestmark = pytest.mark.process

needs_namespaces = pytest.mark.skipif(
    bool(network.unavailable_reason()), reason=str(network.unavailable_reason())
)

# Names of this module's own: another person's sim may run on this machine at the same
# time, on lsim-br0, and nothing of theirs is touched here.
BRIDGE = "lsim-brimp"
HOSTS = {"imp1": "198.18.200.1", "imp2": "198.18.200.2"}
PORT = 7000
BULK_BYTES = 5 << 20
TCP_INFO_TOTAL_RETRANS = 100  # offset of tcpi_total_retrans in struct tcp_info


def remove_test_network() -> None:
    """What this module made (or a crashed run of it left), and nothing else."""
    for host in HOSTS:
        impair.stop(host)
        # The veth first: a socket still closing can keep the namespace alive a while.
        network.run("ip", "link", "del", network.namespace(host), check=False)
        network.run("ip", "netns", "del", network.namespace(host), check=False)
        etc = network.ETC_NETNS / network.namespace(host)
        if etc.is_dir():
            for file in etc.iterdir():
                file.unlink()
            etc.rmdir()
    network.run("ip", "link", "del", BRIDGE, check=False)
    for point in cleanup.uts_mounts():
        if Path(point).parent.name == cleanup.UTS_DIR and Path(point).name in HOSTS:
            network.run("umount", "-l", point, check=False)


@pytest.fixture
def two_hosts(tmp_path):
    """imp1 and imp2 on a bridge of their own; imp2 echoes bytes and counts bulk uploads."""
    remove_test_network()
    try:
        network.create_bridge(BRIDGE)
        hosts_file = "".join(f"{address} {host}\n" for host, address in HOSTS.items())
        for host, address in HOSTS.items():
            uts_file = tmp_path / cleanup.UTS_DIR / host
            network.create_host(host, address, uts_file, hosts_file, bridge=BRIDGE)
        listener = network.in_host("imp2", listen)
        threading.Thread(target=serve, args=(listener,), daemon=True).start()
        yield
        listener.close()
    finally:
        remove_test_network()


def listen() -> socket.socket:
    listener = socket.socket()
    listener.bind((HOSTS["imp2"], PORT))
    listener.listen()
    return listener


def serve(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # closed: the test is over
            return
        threading.Thread(target=answer, args=(conn,), daemon=True).start()


def answer(conn: socket.socket) -> None:
    """``e``: echo each byte back; ``b``: read to the end, then say how many bytes came."""
    with conn, contextlib.suppress(OSError):
        if conn.recv(1) == b"e":
            while byte := conn.recv(1):
                conn.sendall(byte)
        else:
            received = 0
            while chunk := conn.recv(65536):
                received += len(chunk)
            conn.sendall(str(received).encode())


def connect_from_imp1() -> socket.socket:
    conn = network.in_host("imp1", lambda: socket.create_connection((HOSTS["imp2"], PORT), 10))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def round_trips(count: int = 5) -> list[float]:
    """Seconds each one-byte request took to come back, on one connection."""
    with connect_from_imp1() as conn:
        conn.sendall(b"e")
        times = []
        for _ in range(count):
            started = time.monotonic()
            conn.sendall(b"x")
            assert conn.recv(1) == b"x"
            times.append(time.monotonic() - started)
    return times


def upload(size: int) -> tuple[int, int]:
    """Send ``size`` bytes from imp1 to imp2: (bytes imp2 received, segments retransmitted)."""
    with connect_from_imp1() as conn:
        conn.sendall(b"b" + bytes(size))
        conn.shutdown(socket.SHUT_WR)
        received = int(conn.recv(64))
        info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return received, struct.unpack_from("I", info, TCP_INFO_TOTAL_RETRANS)[0]


@needs_namespaces
def test_impaired_link_is_delayed_both_ways_and_lossy_and_unimpair_restores_it(two_hosts):
    assert statistics.median(round_trips()) < 0.020

    impair.impair("imp1", "delay 50ms loss 1%", bridge=BRIDGE)
    if "netem" not in network.run("tc", "qdisc", "show", "dev", "lsim-imp1").stdout:
        # No netem in this kernel: the relay's tap stands on the bridge for imp1.
        assert network.link_master("lsim-imp1") is None
        assert network.link_master(impair.tap_name("imp1")) == BRIDGE
    assert min(round_trips()) >= 0.090  # 50 ms out, 50 ms back: every time
    received, retransmitted = upload(BULK_BYTES)  # a stall would time the socket out
    assert received == BULK_BYTES
    assert retransmitted > 0  # ~3,600 segments at 1% loss: frames were lost, and recovered

    impair.unimpair("imp1", bridge=BRIDGE)
    assert network.link_master("lsim-imp1") == BRIDGE
    assert impair.tap_name("imp1") not in network.our_links()
    assert "imp1" not in impair.relays().values()
    assert statistics.median(round_trips()) < 0.020


@pytest.mark.parametrize(
    "spec", ["rate 1mbit", "delay 50ms rate 1mbit", "delay", "loss 150%", "delay 5ms delay 9ms", ""]
)
def test_an_impairment_beyond_delay_and_loss_is_refused_naming_what_is_supported(spec):
    with pytest.raises(network.SimError, match="it takes `delay Nms` and `loss P%`"):
        impair.impair("imp1", spec)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("delay 50ms loss 1%", Impairment(delay=0.05, loss=0.01)),
        ("loss 0.5%", Impairment(delay=0.0, loss=0.005)),
        ("delay 1s", Impairment(delay=1.0, loss=0.0)),
    ],
)
def test_netem_words_for_delay_and_loss_are_understood(spec, expected):
    assert impair.parse(spec) == expected
