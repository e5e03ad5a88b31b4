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
import uuid

logger = logging.getLogger("router.requests")

_PLAIN = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")
# Request lines are written at least this often, and at once when this many are held.
BATCH_SECONDS = 0.2
BATCH_LINES = 512


def request_id_for(sent: bytes | None) -> bytes:
    """The client's request id if it is a plain token of at most 128 bytes, else a new one."""
    if sent is not None and _PLAIN.fullmatch(sent):
        return sent
    return uuid.uuid4().hex.encode()


def log_request(request_id: bytes, path: str, model: str, caller, status: int,
                elapsed: float, call) -> None:  # fmt: skip
    if not logger.isEnabledFor(logging.INFO):
        return
    logger.info(
        "request %s %s model=%s key=%s status=%d %.1f ms tokens=%d",
        request_id.decode("latin-1"), path, model or "-",
        getattr(caller, "name", "") or "-", status, elapsed * 1000,
        call.tokens_spent if call is not None else 0,
    )  # fmt: skip


class BatchedLines(logging.Handler):
    """Holds records and hands them to the root logger's handlers together: a stream
    handler gets them formatted, in one write and one flush; any other, one by one."""

    def __init__(self) -> None:
        super().__init__()
        self._records: list[logging.LogRecord] = []
        self._writing = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        self._records.append(record)
        if len(self._records) >= BATCH_LINES:
            self.flush()

    def flush(self) -> None:
        with self._writing:
            records, self._records = self._records, []
            if records:
                write_together(records, logging.getLogger().handlers)


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
    handler = BatchedLines()
    logger.addHandler(handler)
    logger.propagate = False

    def flush_often() -> None:
        while True:
            time.sleep(BATCH_SECONDS)
            handler.flush()

    threading.Thread(target=flush_often, name="request-lines", daemon=True).start()
    atexit.register(handler.flush)
    return handler
