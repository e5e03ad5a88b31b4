"""Space on the filesystems holding the directories the agent uses."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from core import mounts as mount_table
from protocol.inventory import Filesystem


def ensure_weights_dir(weights_dir: Path) -> list[str]:
    """Create the weights directory, so a new node reports its disk from its first heartbeat."""
    try:
        weights_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [
            f"weights directory {weights_dir} cannot be created ({exc.strerror or exc}): "
            "fetching weights will fail until it exists and the agent may write to it"
        ]
    return []


def resolve_mounts(dirs: Sequence[Path]) -> list[tuple[Path, str]]:
    """Pair the first directory on each mount with that mount, in the order given."""
    mountpoints = _mountpoints()
    seen: dict[str, Path] = {}
    for directory in dirs:
        mount = mount_of(directory, mountpoints)
        seen.setdefault(mount, directory)
    return [(directory, mount) for mount, directory in seen.items()]


def measure(mounts: Sequence[tuple[Path, str]]) -> list[Filesystem]:
    """Measure each (directory, mount) now; one that cannot be read is left out."""
    filesystems = []
    for directory, mount in mounts:
        try:
            usage = shutil.disk_usage(_existing(directory))
        except OSError:
            continue
        filesystems.append(
            Filesystem(path=str(directory), mount=mount, total=usage.total, free=usage.free)
        )
    return filesystems


def mount_of(directory: Path, mountpoints: Sequence[str] | None = None) -> str:
    """Return the mount point holding `directory` (or, if missing, its nearest ancestor).

    The mount table is asked first because os.path.ismount cannot see a bind mount of the
    same filesystem, which is how containers usually receive their volumes.
    """
    path = os.path.realpath(_existing(directory))
    points = mountpoints if mountpoints is not None else _mountpoints()
    found = mount_table.mount_of(Path(path), [mount_table.Mount(point) for point in points])
    if found is not None:
        return found.point
    while not os.path.ismount(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def _mountpoints() -> list[str]:
    return [mount.point for mount in mount_table.read_mounts()]


def _existing(directory: Path) -> Path:
    """Return `directory` or its nearest existing ancestor: a state dir may not exist yet."""
    path = directory.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
