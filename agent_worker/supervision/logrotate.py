"""Keep a log file another process writes in bounds, and read its last lines back.

The writers (engines, and the children of ``llmgw up``) hold their log open by a
descriptor of their own and outlive whoever rotates it, so the file cannot be renamed
and reopened under them: it is copied to ``NAME.1`` and truncated in place. That only
works because every writer opened it with O_APPEND — after the truncation its next
write lands at the new end instead of at its old offset, which would leave a hole of
NUL bytes. ``NAME.1`` is the newest old file, ``NAME.COUNT`` the oldest.

Standard library only: ``llmgw up`` uses it for its own children's logs.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

# Copy and scan in blocks this big: big enough to be fast, small enough to stay cheap.
_BLOCK = 1 << 20
# A reader asked for N lines scans at most N times this, so a file of one endless line
# (a progress bar never ending in a newline) cannot make it read 50 MiB for one answer.
MAX_LINE_SCAN = 16 * 1024

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


@contextlib.contextmanager
def rotation_lock(path: Path) -> Iterator[None]:
    """Hold off this process's rotation of ``path``, so a reader sees the set whole."""
    key = os.path.abspath(path)
    with _locks_guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        yield


def rotated_paths(path: Path, count: int) -> list[Path]:
    """``path`` and the names of its old files, newest first: NAME, NAME.1 … NAME.COUNT."""
    path = Path(path)
    return [path] + [path.with_name(f"{path.name}.{n}") for n in range(1, count + 1)]


def rotate_if_large(path: Path, max_bytes: int, count: int) -> bool:
    """Rotate ``path`` if it holds more than ``max_bytes``; say whether it did.

    Keeps ``count`` old files (0: the file is only emptied). Cheap when under the limit
    (one stat) and a no-op when the file is gone, so it can be called on a timer.
    Lines written in the instant between the last read of the copy and the truncation
    are lost, as with logrotate's copytruncate; nothing else is.
    """
    path = Path(path)
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    with rotation_lock(path):
        try:
            # Not O_APPEND, and never written: it is only read and truncated.
            source = open(path, "r+b")  # noqa: SIM115 (closed below, after the rename)
        except FileNotFoundError:
            return False
        with source:
            if os.fstat(source.fileno()).st_size <= max_bytes:  # another thread was first
                return False
            _drop_beyond(path, count)
            if count == 0:
                os.ftruncate(source.fileno(), 0)
                return True
            names = rotated_paths(path, count)
            for n in range(count - 1, 0, -1):  # .N-1 becomes .N, the oldest first
                with contextlib.suppress(FileNotFoundError):
                    os.replace(names[n], names[n + 1])
            partial = names[1].with_name(f"{names[1].name}.partial")
            mode = os.fstat(source.fileno()).st_mode & 0o777
            _copy_then_truncate(source, partial, mode)
            os.replace(partial, names[1])
    return True


def _drop_beyond(path: Path, count: int) -> None:
    # The oldest file goes, and any left past a count that was once higher.
    n = max(count, 1)
    while True:
        old = path.with_name(f"{path.name}.{n}")
        if n > count and not old.exists():
            return
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
        n += 1


def _copy_then_truncate(source, target: Path, mode: int) -> None:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with open(fd, "wb") as out:
        # Read until the end as it is now, then truncate at once: what the writer adds
        # while the copy runs is copied too, and the window for a lost line stays tiny.
        while chunk := source.read(_BLOCK):
            out.write(chunk)
        os.ftruncate(source.fileno(), 0)


def last_raw_lines(path: Path, n: int, keep: int) -> list[bytes]:
    """The last ``n`` lines across ``path`` and its old files, oldest first, as bytes.

    The set reads as one stream (NAME.KEEP … NAME.1, NAME), so a line the rotation cut
    in two comes back whole. A last line without a newline is returned as it stands.
    """
    if n <= 0:
        return []
    budget = n * MAX_LINE_SCAN
    chunks: list[bytes] = []  # from the end backwards
    newlines = 0
    with rotation_lock(path):
        for member in rotated_paths(path, keep):
            try:
                with open(member, "rb") as src:
                    position = os.fstat(src.fileno()).st_size
                    while position > 0 and budget > 0:
                        step = min(_BLOCK, position, budget)
                        position -= step
                        budget -= step
                        src.seek(position)
                        chunk = src.read(step)
                        chunks.append(chunk)
                        newlines += chunk.count(b"\n")
                        if newlines > n:  # n whole lines, and the newline before them
                            break
            except FileNotFoundError:
                continue
            if newlines > n or budget <= 0:
                break
    stream = b"".join(reversed(chunks))
    if stream.endswith(b"\n"):
        stream = stream[:-1]
    return stream.split(b"\n")[-n:] if stream else []


def last_lines(path: Path, n: int, keep: int) -> list[str]:
    """The last ``n`` lines across ``path`` and its old files, oldest first, as text."""
    return [line.decode("utf-8", errors="replace") for line in last_raw_lines(path, n, keep)]
