"""One listening socket for several control-plane processes: the kernel hands each new
connection to whichever process accepts it first, so a busy process takes fewer.

`llmgw up` opens it once and keeps it for its whole life, and each daphne adopts it
(``--fd``): connections that arrive while a process restarts wait in the backlog
instead of being refused. Agents need no channel layer between the processes: commands
reach nodes through Celery, and each process writes the heartbeats of its own links.
"""

from __future__ import annotations

import socket

from core import sockets


def listening_socket(host: str, port: int) -> socket.socket:
    """The control plane's socket, which each daphne adopts."""
    return sockets.listening_socket(
        host, port, serving="the control plane",
        fix="stop what holds that port or set LLMGW_PORT to another",
    )  # fmt: skip


def daphne_command(python: str, fd: int, application: str) -> list[str]:
    """daphne serving ``application`` on an inherited listening socket."""
    return [python, "-m", "daphne", "--fd", str(fd), application]
