"""Request ids: one per request, on every answer, sent to the engine and in the log line.

A client's own ``x-request-id`` is kept when it is a plain token (so a request can be
followed from the client through the router to the engine's log); anything else, or
none, gets a new one. Each inference request is one line of the ``router.requests``
log, with its id, model, key, status, time and tokens.

A router process (router/asgi.py) writes those lines in batches (``batch_request_lines``):
held at most BATCH_SECONDS and written to each of the root logger's streams in one write,
rather than one write and flush a request, which at a thousand requests a second was a
share of the router's CPU of its own. Each line keeps its own time; a router killed with
SIGKILL loses the lines of its last BATCH_SECONDS (its usage is journalled apart).
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
import time
from collections import deque
from os import urandom

logger = logging.getLogger("router.requests")

_PLAIN = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")
# Request lines are written at least this often, and at once when this many are held.
BATCH_SECONDS = 0.2
BATCH_LINES = 512


def request_id_for(sent: bytes | None) -> bytes:
    """The client's request id if it is a plain token of at most 128 bytes, else a new one."""
    if sent is not None and _PLAIN.fullmatch(sent):
        return sent
    # 128 random bits as 32 hex digits, as uuid4().hex (less its 6 fixed bits), at a
    # quarter of its cost: no UUID object built and formatted per request.
    return urandom(16).hex().encode()


# The router's log format (router/asgi.py configures the root logger with it).
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MESSAGE = "request %s %s model=%s key=%s status=%d %.1f ms tokens=%d"
_batched: BatchedLines | None = None


def log_request(request_id: bytes, path: str, model: str, caller, status: int,
                elapsed: float, call) -> None:  # fmt: skip
    if not logger.isEnabledFor(logging.INFO):
        return
    line = (request_id.decode("latin-1"), path, model or "-", getattr(caller, "name", "") or "-",
            status, elapsed * 1000, call.tokens_spent if call is not None else 0)  # fmt: skip
    if _batched is not None:
        _batched.hold(time.time(), line)
    else:
        logger.info(MESSAGE, *line)


class BatchedLines(logging.Handler):
    """Holds request lines and hands them to the root logger's handlers together: a stream
    handler gets them formatted, in one write and one flush; any other, one by one.

    A line held with ``hold`` is its time and arguments only, not a LogRecord (making one
    and formatting it was about 10 us a request): a stream handler that formats with
    LINE_FORMAT gets the line written straight, its time made once a second, and a record
    is made only for a handler that formats otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self._records: list[logging.LogRecord] = []
        self._held: deque[tuple[float, tuple]] = deque()  # appended by the loop, taken here
        self._writing = threading.Lock()
        self._second = -1
        self._stamp = ""

    def emit(self, record: logging.LogRecord) -> None:
        self._records.append(record)
        if len(self._records) >= BATCH_LINES:
            self.flush()

    def hold(self, created: float, line: tuple) -> None:
        self._held.append((created, line))
        if len(self._held) >= BATCH_LINES:
            self.flush()

    def flush(self) -> None:
        with self._writing:
            held = self._held
            taken = [held.popleft() for _ in range(len(held))]
            records, self._records = self._records, []
            if taken:
                self.write_held(taken, logging.getLogger().handlers)
            if records:
                write_together(records, logging.getLogger().handlers)

    def write_held(self, taken: list[tuple[float, tuple]], handlers: list[logging.Handler]) -> None:
        plain = [h for h in handlers if isinstance(h, logging.StreamHandler)
                 and plainly_formatted(h)]  # fmt: skip
        if plain:
            text = "".join(f"{self.asctime(created)} INFO router.requests: {MESSAGE % line}\n"
                           for created, line in taken)  # fmt: skip
            for handler in plain:
                with handler.lock:  # type: ignore[union-attr]
                    handler.stream.write(text)
                    handler.stream.flush()
        others = [h for h in handlers if h not in plain]
        if others:
            records = []
            for created, line in taken:
                record = logger.makeRecord(logger.name, logging.INFO, "(unknown file)", 0,
                                           MESSAGE, line, None)  # fmt: skip
                record.created = created
                record.msecs = int((created - int(created)) * 1000) + 0.0
                records.append(record)
            write_together(records, others)

    def asctime(self, created: float) -> str:
        """``created`` as logging.Formatter writes %(asctime)s, the second made once."""
        second = int(created)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return f"{self._stamp},{int((created - second) * 1000):03d}"


def plainly_formatted(handler: logging.Handler) -> bool:
    """The handler writes INFO lines in LINE_FORMAT, with no filter of its own."""
    formatter = handler.formatter
    return (formatter is not None and formatter._fmt == LINE_FORMAT and formatter.datefmt is None
            and handler.level <= logging.INFO and not handler.filters)  # fmt: skip


def write_together(records: list[logging.LogRecord], handlers: list[logging.Handler]) -> None:
    for handler in handlers:
        if isinstance(handler, logging.StreamHandler):
            text = "".join(
                handler.format(r) + handler.terminator
                for r in records
                if r.levelno >= handler.level and handler.filter(r)
            )
            if text:
                with handler.lock:  # type: ignore[union-attr]
                    handler.stream.write(text)
                    handler.stream.flush()
        else:
            for record in records:
                if record.levelno >= handler.level:
                    handler.handle(record)


def batch_request_lines() -> BatchedLines:
    """From now on this process writes its request lines in batches (a thread flushes
    them every BATCH_SECONDS, and at exit)."""
    global _batched
    handler = _batched = BatchedLines()
    logger.addHandler(handler)
    logger.propagate = False

    def flush_often() -> None:
        while True:
            time.sleep(BATCH_SECONDS)
            handler.flush()

    threading.Thread(target=flush_often, name="request-lines", daemon=True).start()
    atexit.register(handler.flush)
    return handler
