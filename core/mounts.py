"""The mount table: which filesystem holds a path, as the kernel lists this process's mounts.

The one reader of ``/proc/self/mounts``: the agent asks it where a directory's free space
comes from and whether a directory is on a network filesystem; ``llmgw sim`` asks it which
of its namespaces' mounts are left. Imports only the standard library.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The mounts of this process's mount namespace (``/proc/mounts`` links here).
MOUNT_TABLE = Path("/proc/self/mounts")
# The kernel writes a space, tab, newline or backslash in a field as \040, \011, \012, \134.
_ESCAPED = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of the mount table: where, what from, and which filesystem type."""

    point: str
    source: str = ""
    fstype: str = ""


def read_mounts(table: Path = MOUNT_TABLE) -> list[Mount]:
    """Every mount in ``table``, in its order; none when it cannot be read (not Linux)."""
    try:
        lines = table.read_text().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        fields = [_unescape(field) for field in line.split()]
        if len(fields) >= 3:
            mounts.append(Mount(point=fields[1], source=fields[0], fstype=fields[2]))
    return mounts


def mount_of(path: Path, mounts: Sequence[Mount]) -> Mount | None:
    """The mount ``path`` lies on: the longest mount point at or above it (None: no mount
    in ``mounts`` holds it). ``path`` is taken as written: resolve it first."""
    best = None
    for mount in mounts:
        if path.is_relative_to(mount.point) and (
            best is None or len(mount.point) > len(best.point)
        ):
            best = mount
    return best


def _unescape(field: str) -> str:
    return _ESCAPED.sub(lambda match: chr(int(match.group(1), 8)), field)
