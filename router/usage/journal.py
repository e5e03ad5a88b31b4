"""A router's usage journalled before its rows are written: what a SIGKILL would lose.

Each router process appends a line per request to a file of its own in
``LLMGW_ROUTER_JOURNAL`` (``$LLMGW_HOME/router/usage-journal``; empty turns it off): one when
the request reached an engine (its key, model and prompt's estimate) and one when it was
counted (its tokens). An append is in the kernel once ``write`` returns, so a router
killed with SIGKILL leaves it behind; in a router's event loop the lines of one turn of the
loop go in one write at its end (a write a request was a share of the router's CPU), so a
SIGKILL loses at most the lines of the turn it struck. Each write of the usage rows
starts a new file (the requests still running carried over) and removes the old one once
its rows are in PostgreSQL.

A router adopts the files of routers that are gone (their process no longer runs) when it
starts and at each write: their counted requests as counted, the ones they were still
answering charged the prompt's estimate, so no request answered goes without its usage
row. (A router killed between a write's commit and removing its file has that second
counted twice: the smaller error.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SUFFIX = ".jsonl"
# A request's two lines (read back by read_entries): made by hand, not by encoding a dict,
# a quarter of the cost on every request's path; %d takes an engine's float count too.
BEGUN = '{"begun":%d,"h":%d,"p":%s,"n":%s,"m":%s,"pt":%d,"ct":0}\n'
COUNTED = '{"counted":%d,"h":%d,"p":%s,"n":%s,"m":%s,"pt":%d,"ct":%d,"cp":%d}\n'


class Journal:
    """This process's journal file, and the adopting of others'."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._generation = 0
        self._running: dict[int, bytes] = {}  # begun, not counted yet: their lines
        self._pending: list[bytes] | None = None  # lines to write at the end of the turn
        self.path = self._next_path()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def begun(self, request: int, hour: int, key_prefix: str, key_name: str, model: str,
              prompt: int) -> None:  # fmt: skip
        """A request reached an engine, charged ``prompt`` (its estimate) if never counted."""
        line = BEGUN % (request, hour, _text(key_prefix), _text(key_name), _text(model), prompt)
        data = line.encode()
        self._running[request] = data
        self._append(data)

    def counted(self, request: int, hour: int, key_prefix: str, key_name: str, model: str,
                prompt: int, completion: int, cached_prompt: int) -> None:  # fmt: skip
        self._running.pop(request, None)
        line = COUNTED % (request, hour, _text(key_prefix), _text(key_name), _text(model), prompt,
                          completion, cached_prompt)  # fmt: skip
        self._append(line.encode())

    def rotate(self) -> Path:
        """Start a new file (with the requests still running) and return the old one,
        for the caller to remove once what it holds is written."""
        self._write_pending()
        old, old_fd = self.path, self._fd
        self.path = self._next_path()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        # Written now, not at the turn's end: the caller removes the old file soon after.
        if self._running:
            self._write(b"".join(self._running.values()))
        os.close(old_fd)
        return old

    def adopt(self) -> tuple[list[dict[str, Any]], list[Path]]:
        """The entries of the journals whose routers are gone, and their files (claimed:
        renamed as this router's), to remove once the entries are written."""
        claimed: list[Path] = []
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            owner = path.name.split("-", 1)[0]
            if path.name.startswith(self._name) or not owner.isdigit() or _alive(int(owner)):
                continue
            mine = self.directory / f"{self._name}-adopted-{path.name}.done"
            try:
                path.rename(mine)  # only one router claims it
            except OSError:
                continue
            claimed.append(mine)
        entries = read_entries(claimed)
        if claimed:
            logger.warning("adopted the usage journals of %d routers that are gone (%d "
                           "requests)", len(claimed), len(entries))  # fmt: skip
        return entries, claimed

    def close(self) -> None:
        """At the router's end, once its rows are written: its file goes unless requests
        were still running (then the next router charges their prompts)."""
        self._write_pending()
        with contextlib.suppress(OSError):
            os.close(self._fd)
        if not self._running:
            self.path.unlink(missing_ok=True)

    def _next_path(self) -> Path:
        self._generation += 1
        return self.directory / f"{self._name}-{self._generation}{SUFFIX}"

    def _append(self, data: bytes) -> None:
        if self._pending is not None:
            self._pending.append(data)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: written now
            self._write(data)
            return
        self._pending = [data]
        loop.call_soon(self._write_pending)

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending:
            self._write(b"".join(pending))

    def _write(self, data: bytes) -> None:
        try:
            os.write(self._fd, data)
        except OSError as exc:  # a full disk: the rows are still written from memory
            logger.warning("usage journal not written (%s): %s", self.path, exc)


_text = encode_basestring  # a string as JSON (json.dumps' own, in C)


def read_entries(paths: list[Path]) -> list[dict[str, Any]]:
    """Journals' requests: each counted one as counted, each one only begun as begun
    (a request's lines may be in two files of one router, either side of a rotation)."""
    begun: dict[tuple[str, int], dict[str, Any]] = {}
    counted: dict[tuple[str, int], dict[str, Any]] = {}
    for path in paths:
        router = path.name.split("-adopted-", 1)[-1].rsplit("-", 1)[0]
        with contextlib.suppress(OSError), path.open("rb") as lines:
            for raw in lines:
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue  # the last line, cut by the kill
                if "counted" in line:
                    counted[(router, line["counted"])] = line
                elif "begun" in line:
                    begun[(router, line["begun"])] = line
    return list(counted.values()) + [v for k, v in begun.items() if k not in counted]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
