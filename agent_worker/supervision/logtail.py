"""Follow a shard's log file into the in-memory log buffer.

The engine writes its output straight to the file, so it keeps a place to write when
the agent is gone; the agent reads what was added since it last looked.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from agent_worker.logbuffer import LogBuffer

# One read per pump, so an engine printing in a tight loop cannot hold a step forever.
_CHUNK = 1 << 20
# A "line" this long without a newline (a progress bar redrawn with \r) is cut here.
MAX_LINE = 8192
NOTE_PREFIX = "[llmgw] "


class LogTail:
    """Read new lines of one log file into ``buffer`` under ``source``."""

    def __init__(self, path: Path, buffer: LogBuffer, source: str) -> None:
        self.path = Path(path)
        self.buffer = buffer
        self.source = source
        self._lock = threading.Lock()
        self.path.touch(mode=0o600, exist_ok=True)
        # Start at the end: what is already there belongs to an earlier run or agent.
        self._offset = self.path.stat().st_size
        self._partial = b""

    def note(self, text: str) -> None:
        """Append a line of the agent's own to the file, where the tail will pick it up."""
        with open(self.path, "ab") as out:
            out.write(f"{NOTE_PREFIX}{text}\n".encode())

    def pump(self) -> bool:
        """Read what was appended since the last call; say whether there was any."""
        with self._lock:
            try:
                with open(self.path, "rb") as src:
                    size = os.fstat(src.fileno()).st_size
                    if size < self._offset:  # truncated or replaced: start over
                        self._offset, self._partial = 0, b""
                    if size == self._offset:
                        return False
                    src.seek(self._offset)
                    data = src.read(_CHUNK)
            except FileNotFoundError:
                return False
            self._offset += len(data)
            chunks = (self._partial + data).split(b"\n")
            self._partial = chunks.pop()
            if len(self._partial) > MAX_LINE:
                chunks.append(self._partial)
                self._partial = b""
            lines = [_clean(chunk) for chunk in chunks]
        self.buffer.extend(self.source, lines)
        return True

    def flush(self) -> None:
        """Read everything left, including a last line with no newline."""
        while self.pump():
            pass
        with self._lock:
            rest, self._partial = self._partial, b""
        if rest:
            self.buffer.append(self.source, _clean(rest))


def _clean(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    if "\r" in text:  # a redrawn progress line: its last state is the one worth keeping
        text = next((part for part in reversed(text.split("\r")) if part.strip()), "")
    return text[:MAX_LINE]
