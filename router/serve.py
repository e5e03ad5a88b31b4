"""The router served on one port, by one process or several::

    python -m router.serve --host 127.0.0.1 --port 8080 [--processes N]
    python -m router.serve --fd 5            # a listening socket another process holds

One router process is one core at most (an event loop, and the GIL): past about a
thousand requests a second it is the limit. ``--processes N`` (``LLMGW_ROUTER_PROCESSES``;
by default one per four cores, at most four, since engines and the control plane share
the machine) opens the port once and runs N processes on it, the kernel handing each new
connection to whichever accepts it first; a process that dies is started again after a
second, the others serving meanwhile. `llmgw up` holds the socket itself and runs each
process as a child of its own (``--fd``), as it does the control plane's. They are N
routers as far as the fleet is concerned: limits are counted in Redis, usage journalled
per process, the in-flight report made per process.

Each process serves with the router's own server (router/wire/server.py; bench/README.md
says what it saved over uvicorn, which ``--server uvicorn`` still runs to measure against).
Why not ``uvicorn --fd``: uvicorn takes an inherited socket for a Unix one, so asyncio
leaves Nagle's algorithm on for the TCP connections it accepts, and every small answer
waits for the client's delayed ACK (40 ms). The socket here is taken for what it is.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import time

from core import sockets
from core.env import env_int

APPLICATION = "router.asgi:application"
PROCESSES_ENV = "LLMGW_ROUTER_PROCESSES"
# Most router processes a machine gets by default, and the cores per process.
MOST_PROCESSES = 4
CORES_PER_PROCESS = 4
RESTART_SECONDS = 1.0

logger = logging.getLogger(__name__)


def default_processes(cores: int | None = None) -> int:
    """One router process per CORES_PER_PROCESS cores, at most MOST_PROCESSES."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(MOST_PROCESSES, cores // CORES_PER_PROCESS))


def processes_wanted() -> int:
    """LLMGW_ROUTER_PROCESSES, or the default for this machine's cores."""
    count = env_int(PROCESSES_ENV, 0) or default_processes()
    if not 1 <= count <= 64:
        raise SystemExit(f"{PROCESSES_ENV}={count}: give a number of processes from 1 to 64")
    return count


def listening_socket(host: str, port: int) -> socket.socket:
    """The routers' socket, which each router process adopts."""
    return sockets.listening_socket(host, port, serving="the router")


def serve_socket(sock: socket.socket, args: argparse.Namespace) -> None:
    """This process serves the router on ``sock`` until it is told to stop."""
    if args.server == "uvicorn":  # kept to measure against (bench/router_overhead.py)
        import uvicorn

        config = uvicorn.Config(
            args.app, access_log=False, log_level=args.log_level, lifespan="on",
            loop=args.loop, http=args.http,
            # The router reads neither the client's address nor its scheme: no middleware a
            # request to rewrite them from X-Forwarded-* headers.
            proxy_headers=False,
            ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
        )  # fmt: skip
        uvicorn.Server(config).run(sockets=[sock])
        return
    from router.wire import serving

    module, _, name = args.app.partition(":")
    app = getattr(importlib.import_module(module), name)
    logging.getLogger("router.wire").setLevel(args.log_level.upper())
    context = None
    if args.ssl_certfile:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    serving.run(app, sock, context)


def child_argv(fd: int, args: argparse.Namespace) -> list[str]:
    argv = [sys.executable, "-m", "router.serve", "--fd", str(fd), "--log-level", args.log_level,
            "--app", args.app, "--server", args.server, "--loop", args.loop,
            "--http", args.http]  # fmt: skip
    if args.ssl_certfile:
        argv += ["--ssl-certfile", args.ssl_certfile, "--ssl-keyfile", args.ssl_keyfile]
    return argv


def supervise(sock: socket.socket, count: int, args: argparse.Namespace) -> None:
    """``count`` children serving ``sock``, each started again when it dies, until this
    process gets SIGTERM or SIGINT (then passed on to them)."""
    fd = sock.fileno()
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    children = [subprocess.Popen(child_argv(fd, args), pass_fds=(fd,)) for _ in range(count)]
    died_at: dict[int, float] = {}
    while not stopping:
        time.sleep(0.2)
        for index, child in enumerate(children):
            if child.poll() is None or stopping:
                continue
            since = died_at.setdefault(index, time.monotonic())
            if time.monotonic() - since >= RESTART_SECONDS:
                logger.warning("router process %d exited with %s; starting it again",
                               child.pid, child.returncode)  # fmt: skip
                children[index] = subprocess.Popen(child_argv(fd, args), pass_fds=(fd,))
                died_at.pop(index)
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        child.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--fd", type=int, help="serve on this inherited listening socket")
    parser.add_argument("--processes", type=int, help=f"default: {PROCESSES_ENV}, else by cores")
    parser.add_argument("--ssl-certfile")
    parser.add_argument("--ssl-keyfile")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--app", default=APPLICATION, help="the ASGI application (benches')")
    parser.add_argument(
        "--server",
        default="own",
        choices=("own", "uvicorn"),
        help="own (router/wire/server.py) or uvicorn (to measure against)",
    )
    parser.add_argument("--loop", default="auto", help="uvicorn's: auto (uvloop), asyncio")
    parser.add_argument("--http", default="auto", help="uvicorn's: auto (httptools), h11")
    args = parser.parse_args(argv)
    if args.fd is not None:
        serve_socket(socket.socket(fileno=args.fd), args)
        return
    count = args.processes or processes_wanted()
    sock = listening_socket(args.host, args.port)
    if count == 1:
        serve_socket(sock, args)
    else:
        logging.basicConfig(level=logging.INFO)
        supervise(sock, count, args)


if __name__ == "__main__":
    main()
