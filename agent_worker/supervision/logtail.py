"""Follow a shard's log file into the in-memory log buffer, across its rotation.

The engine writes its output straight to the file, so it keeps a place to write when
the agent is gone; the agent reads what was added since it last looked. The file is
rotated by copy and truncation (``logrotate``): the tail notices a new ``NAME.1``, reads
the rest of what it had not read from there, and carries on from the start of the file.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from agent_worker.logbuffer import LogBuffer
from agent_worker.supervision.logrotate import last_raw_lines, rotation_lock

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
        self._rotated_path = self.path.with_name(f"{self.path.name}.1")
        self._rotated_seen = _identity(self._rotated_path)

    def note(self, text: str) -> None:
        """Append a line of the agent's own to the file, where the tail will pick it up."""
        with open(self.path, "ab") as out:
            out.write(f"{NOTE_PREFIX}{text}\n".encode())

    def pump(self) -> bool:
        """Read what was appended since the last call; say whether there was any."""
        # Under the rotation's lock too: never between a rotation's copy and its rename.
        with self._lock, rotation_lock(self.path):
            data = self._since_rotation() + self._read_appended()
            if not data:
                return False
            chunks = (self._partial + data).split(b"\n")
            self._partial = chunks.pop()
            if len(self._partial) > MAX_LINE:
                chunks.append(self._partial)
                self._partial = b""
            lines = [_clean(chunk) for chunk in chunks]
        self.buffer.extend(self.source, lines)
        return True

    def _since_rotation(self) -> bytes:
        """What the last rotation took before this tail read it; call under both locks."""
        rotated = _identity(self._rotated_path)
        if rotated == self._rotated_seen:
            return b""
        self._rotated_seen = rotated
        if rotated is None:  # old files deleted: the file itself was not touched
            return b""
        offset, self._offset = self._offset, 0
        # A second rotation between two pumps (0.5 s apart, checks every 15 s) would
        # leave the first one's rest in NAME.2, unread here; it is still on disk.
        try:
            with open(self._rotated_path, "rb") as src:
                src.seek(offset)
                return src.read()
        except FileNotFoundError:
            return b""

    def _read_appended(self) -> bytes:
        try:
            with open(self.path, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                if size < self._offset:  # truncated by someone else: start over
                    self._offset, self._partial = 0, b""
                if size == self._offset:
                    return b""
                src.seek(self._offset)
                data = src.read(_CHUNK)
        except FileNotFoundError:
            return b""
        self._offset += len(data)
        return data

    def flush(self) -> None:
        """Read everything left, including a last line with no newline."""
        while self.pump():
            pass
        with self._lock:
            rest, self._partial = self._partial, b""
        if rest:
            self.buffer.append(self.source, _clean(rest))


def read_log_lines(path: Path, n: int, keep: int) -> list[str]:
    """The last ``n`` lines of a shard's log and its rotated files, cleaned as the tail does."""
    return [_clean(line) for line in last_raw_lines(path, n, keep)]


def _identity(path: Path) -> tuple[int, int] | None:
    # The inode alone could be reused by the file that replaces a deleted one; a rename
    # also stamps the change time.
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_ctime_ns


def _clean(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    if "\r" in text:  # a redrawn progress line: its last state is the one worth keeping
        text = next((part for part in reversed(text.split("\r")) if part.strip()), "")
    return text[:MAX_LINE]
