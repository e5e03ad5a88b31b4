"""Request ids: one per request, on every answer, sent to the engine and in the log line.

A client's own ``x-request-id`` is kept when it is a plain token (so a request can be
followed from the client through the router to the engine's log); anything else, or
none, gets a new one. Each inference request is one line of the ``router.requests``
log, with its id, model, key, status, time and tokens.
"""

from __future__ import annotations

import logging
import re
import uuid

logger = logging.getLogger("router.requests")

_PLAIN = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")


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
