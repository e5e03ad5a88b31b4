"""An ASGI application served by ``router.wire.server`` on a listening socket, from its
lifespan's startup until SIGTERM or SIGINT, on uvloop.

A stop closes the socket, closes idle connections, lets the answers under way finish for
up to STOP_GRACE_SECONDS (a second signal cuts them at once), then runs the lifespan's
shutdown (the router's last usage written, its places given back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl

from core.sockets import BACKLOG
from router.wire.server import ASGI, Application, Server

logger = logging.getLogger(__name__)

# How long a stop waits for the answers under way (streams among them) before cutting.
STOP_GRACE_SECONDS = 30.0
POLL_SECONDS = 0.05


class LifespanFailed(Exception):
    """The application said it could not start."""


class Lifespan:
    """ASGI's lifespan protocol, spoken to the application: startup, then shutdown."""

    def __init__(self, app: Application) -> None:
        self.app = app
        self.inbox: asyncio.Queue[dict] = asyncio.Queue()
        self.answers: asyncio.Queue[dict] = asyncio.Queue()
        self.task: asyncio.Task | None = None

    async def _send(self, message: dict) -> None:
        await self.answers.put(message)

    async def _run(self) -> None:
        try:
            await self.app({"type": "lifespan", "asgi": ASGI, "state": {}}, self.inbox.get,
                           self._send)  # fmt: skip
        except Exception as exc:  # an application without lifespan: started on first use
            logger.debug("lifespan not supported: %s", exc)
        await self.answers.put({"type": "lifespan.unsupported"})

    async def startup(self) -> None:
        self.task = asyncio.create_task(self._run())
        await self.inbox.put({"type": "lifespan.startup"})
        answer = await self.answers.get()
        if answer["type"] == "lifespan.startup.failed":
            raise LifespanFailed(answer.get("message") or "the application did not start")

    async def shutdown(self) -> None:
        if self.task is None or self.task.done():
            return
        await self.inbox.put({"type": "lifespan.shutdown"})
        await self.answers.get()
        with contextlib.suppress(Exception):
            await self.task


async def serve(app: Application, sock: socket.socket,
                ssl_context: ssl.SSLContext | None = None) -> None:  # fmt: skip
    """Serve ``app`` on the listening ``sock`` until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    lifespan = Lifespan(app)
    try:
        await lifespan.startup()
    except LifespanFailed as exc:
        raise SystemExit(f"the router did not start: {exc}") from None
    # An application may answer what needs no waiting from callbacks (``express``).
    server = Server(app, scheme="https" if ssl_context else "http",
                    express=getattr(app, "express", None))  # fmt: skip
    listener = await loop.create_server(server.connection, sock=sock, ssl=ssl_context,
                                        backlog=BACKLOG)  # fmt: skip
    signals = 0
    stopped = asyncio.Event()
    cut = asyncio.Event()

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        (stopped if signals == 1 else cut).set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    sweeper = loop.create_task(sweep_every_second(server))
    host, port = sock.getsockname()[:2]
    logger.info("router serving on %s://%s:%s (pid %d)", server.scheme, host, port, os.getpid())
    try:
        await stopped.wait()
        listener.close()
        server.stop_accepting()
        if server.busy():
            logger.info("stopping: answers under way")
            waiting = asyncio.ensure_future(answered(server, STOP_GRACE_SECONDS))
            cutting = asyncio.ensure_future(cut.wait())
            await asyncio.wait([waiting, cutting], return_when=asyncio.FIRST_COMPLETED)
            cutting.cancel()
            waiting.cancel()
        for task in list(server.tasks):
            task.cancel()
        for connection in list(server.connections):
            connection.transport.close()
    finally:
        sweeper.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await lifespan.shutdown()


async def answered(server: Server, seconds: float) -> None:
    """Return once no answer is under way, or after ``seconds`` (a stop's wait: a poll)."""
    for _ in range(int(seconds / POLL_SECONDS)):
        if not server.busy():
            return
        await asyncio.sleep(POLL_SECONDS)


async def sweep_every_second(server: Server) -> None:
    while True:
        await asyncio.sleep(1.0)
        server.sweep()


def run(app: Application, sock: socket.socket, ssl_context: ssl.SSLContext | None = None) -> None:
    """``serve`` on uvloop (bench/README.md: 5-10% less CPU an answer than asyncio's loop)."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(app, sock, ssl_context))
