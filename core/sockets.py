"""One listening TCP socket for several server processes: the kernel hands each new
connection to whichever process accepts it first, and connections that arrive while one
restarts wait in the backlog instead of being refused. The parent opens it once and each
child adopts it by its file descriptor (the control plane's daphnes, the routers)."""

from __future__ import annotations

import socket

# Agents relink in a burst after a control-plane restart; the kernel caps this at
# net.core.somaxconn.
BACKLOG = 4096


def listening_socket(host: str, port: int, *, serving: str, fix: str = "") -> socket.socket:
    """A bound, listening TCP socket that children inherit (pass its fileno to them), or
    SystemExit naming what could not listen (``serving``) and ``fix``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        said = f"cannot listen on {host}:{port} for {serving}: {exc.strerror}"
        raise SystemExit(f"{said}; {fix}" if fix else said) from None
    sock.set_inheritable(True)
    return sock
