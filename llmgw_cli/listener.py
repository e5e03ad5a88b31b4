"""One listening socket for several control-plane processes: the kernel hands each new
connection to whichever process accepts it first, so a busy process takes fewer.

`llmgw up` opens it once and keeps it for its whole life, and each daphne adopts it
(``--fd``): connections that arrive while a process restarts wait in the backlog
instead of being refused. Agents need no channel layer between the processes: commands
reach nodes through Celery, and each process writes the heartbeats of its own links.
"""

from __future__ import annotations

import socket

# Agents relink in a burst after a control-plane restart; the kernel caps this at
# net.core.somaxconn.
BACKLOG = 4096


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket that children inherit (pass its fileno to them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise SystemExit(
            f"cannot listen on {host}:{port} for the control plane: {exc.strerror}; stop "
            "what holds that port or set LLMGW_PORT to another"
        ) from None
    sock.set_inheritable(True)
    return sock


def daphne_command(python: str, fd: int, application: str) -> list[str]:
    """daphne serving ``application`` on an inherited listening socket."""
    return [python, "-m", "daphne", "--fd", str(fd), application]
