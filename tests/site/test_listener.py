"""The control plane's listening socket, shared by its processes."""

from __future__ import annotations

import socket

import pytest

from llmgw_cli.listener import daphne_command, listening_socket
from llmgw_cli.up import control_processes


def test_the_socket_listens_and_children_inherit_it():
    sock = listening_socket("127.0.0.1", 0)
    try:
        assert sock.get_inheritable()
        port = sock.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted, _address = sock.accept()  # queued even before any process accepts
            accepted.close()
        command = daphne_command("python", sock.fileno(), "llmgw_site.asgi:application")
        assert command[-3:] == ["--fd", str(sock.fileno()), "llmgw_site.asgi:application"]
    finally:
        sock.close()


def test_a_taken_port_is_refused_with_the_setting_to_change():
    taken = listening_socket("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as refused:
            listening_socket("127.0.0.1", port)
        assert f"127.0.0.1:{port}" in str(refused.value)
        assert "LLMGW_PORT" in str(refused.value)
    finally:
        taken.close()


@pytest.mark.parametrize("value", ["0", "65"])
def test_a_process_count_out_of_range_is_refused(monkeypatch, value):
    monkeypatch.setenv("LLMGW_CONTROL_PLANE_PROCESSES", value)
    with pytest.raises(SystemExit, match="LLMGW_CONTROL_PLANE_PROCESSES"):
        control_processes()
