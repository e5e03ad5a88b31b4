"""Files written whole or not at all: the one atomic writer and the one directory fsync;
and the one reader of a file's size that a file going away cannot break (``size_or_zero``).

A reader sees the old content or the new, never half of either: the text goes to a
private temporary file beside the target (mode 0600 from the moment its name exists),
is flushed to disk, renamed over the target, and the rename itself made durable by an
fsync of the directory. A writer cut short leaves a hidden temporary file whose name
starts with ``TEMPORARY_PREFIX``; whoever lists the directory may remove those.

Imports only the standard library: the agent, ``llmgw up`` and the router (its saved routing
table) use it as well as the control plane.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

# Hidden (a leading dot), so a listing of the directory never reads a half-written file.
TEMPORARY_PREFIX = ".tmp-"


def write_atomically(
    target: Path, data: str | bytes, *, keep_owner: bool = False, modified_at: float | None = None
) -> None:
    """Replace ``target`` with ``data`` (mode 0600) so a reader sees the old or the new whole.

    ``keep_owner``: run as root, give the new file the owner of the one it replaces (a
    server's configuration file that the server, not root, must go on reading).
    ``modified_at``: the new file's modification time (unix time) from the moment it has
    its name, for a file whose age says something (the router's saved table).
    """
    owner = _owner_of(target) if keep_owner and os.geteuid() == 0 else None
    fd, temporary = tempfile.mkstemp(prefix=TEMPORARY_PREFIX, dir=target.parent)  # 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
            out.flush()
            os.fsync(out.fileno())
            if owner is not None:
                os.fchown(out.fileno(), *owner)
        if modified_at is not None:
            os.utime(temporary, (modified_at, modified_at))
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    fsync_directory(target.parent)


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable, so a power cut cannot bring back the old name.

    Best effort: a filesystem that cannot open or fsync a directory still has the rename,
    only without that guarantee.
    """
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _owner_of(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_uid, info.st_gid


def size_or_zero(path: Path) -> int:
    """The size of the file at ``path`` (through a link), or 0 when there is none to read:
    a download not begun, a file removed or rotated between a listing and this look."""
    try:
        return path.stat().st_size
    except OSError:
        return 0
