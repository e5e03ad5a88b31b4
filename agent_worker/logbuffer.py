"""The last lines of every log on this node, kept in memory so the admin page can show them.

Sources are the agent itself ("agent") and every shard by id. Each keeps its last
``max_lines`` lines. The agent's own log lives only here; a shard's files on disk stay
its record (``read_logs`` answers from them, across their rotation), and this is where a
failed shard's last words are taken from.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque

from protocol.commands import LOG_LINES_KEPT

AGENT_SOURCE = "agent"
# Finished shards keep their lines so a failure can still be read; this bounds how many.
DEFAULT_MAX_SOURCES = 256


class LogBuffer:
    """A thread-safe ring buffer of lines per source."""

    def __init__(
        self, max_lines: int = LOG_LINES_KEPT, max_sources: int = DEFAULT_MAX_SOURCES
    ) -> None:
        if max_lines < 1 or max_sources < 1:
            raise ValueError("a log buffer needs room for at least one line and one source")
        self.max_lines = max_lines
        self.max_sources = max_sources
        self._lock = threading.Lock()
        self._lines: OrderedDict[str, deque[str]] = OrderedDict()

    def append(self, source: str, line: str) -> None:
        """Keep one line under ``source``, dropping its oldest beyond ``max_lines``."""
        self.extend(source, [line])

    def extend(self, source: str, lines: list[str]) -> None:
        """Keep several lines under ``source``, in order."""
        if not lines:
            return
        with self._lock:
            kept = self._lines.get(source)
            if kept is None:
                kept = self._lines[source] = deque(maxlen=self.max_lines)
                self._evict_quiet_sources()
            else:
                self._lines.move_to_end(source)
            kept.extend(lines)

    def read(self, source: str, n: int = LOG_LINES_KEPT) -> list[str]:
        """Return the last ``n`` lines of ``source``, oldest first; none for an unknown one."""
        if n <= 0:
            return []
        with self._lock:
            kept = self._lines.get(source)
            if kept is None:
                return []
            start = max(0, len(kept) - n)
            return [kept[i] for i in range(start, len(kept))]

    def sources(self) -> list[str]:
        """Return every source that has lines, the agent's first."""
        with self._lock:
            names = list(self._lines)
        return sorted(names, key=lambda name: (name != AGENT_SOURCE, name))

    def forget(self, source: str) -> None:
        """Drop everything kept for ``source``."""
        with self._lock:
            self._lines.pop(source, None)

    def handler(self, source: str = AGENT_SOURCE, level: int = logging.INFO) -> logging.Handler:
        """Return a logging handler that keeps records here under ``source``."""
        return LogBufferHandler(self, source, level)

    def _evict_quiet_sources(self) -> None:
        # Least recently written first; the agent's own log is never the one to go.
        while len(self._lines) > self.max_sources:
            victim = next((name for name in self._lines if name != AGENT_SOURCE), None)
            if victim is None:
                return
            del self._lines[victim]


class LogBufferHandler(logging.Handler):
    """Send log records into a :class:`LogBuffer`, one entry per line of the message."""

    def __init__(self, buffer: LogBuffer, source: str = AGENT_SOURCE, level: int = 0) -> None:
        super().__init__(level)
        self.buffer = buffer
        self.source = source
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # a broken format string must not take the agent down
            self.handleError(record)
            return
        self.buffer.extend(self.source, text.splitlines() or [""])
