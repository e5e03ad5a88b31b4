"""Weights the node did not fetch and must never delete: model files in the directories
the agent file names to look in (``weights: {look: [...], shared: [...]}``).

A look directory may be a shared filer: a directory declared shared, or one on a network
filesystem (by the mount table), is reported with a store id, so the control plane counts
it once and knows who else sees it. Local storage is never taken for shared.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.files import size_or_zero
from core.mounts import MOUNT_TABLE, Mount, mount_of, read_mounts

log = logging.getLogger("llmgw.agent.weights")

NETWORK_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "cephfs", "ceph", "beegfs", "fuse.cephfs")
# Filers hold thousands of files; models lie near the top.
MAX_DEPTH = 3


@dataclass(frozen=True)
class LookDirs:
    look: tuple[Path, ...] = ()
    shared: tuple[Path, ...] = ()  # declared shared (each also looked in)
    mounts: Path = MOUNT_TABLE

    @property
    def all(self) -> tuple[Path, ...]:
        return tuple(dict.fromkeys((*self.look, *self.shared)))


def list_look_dirs(dirs: LookDirs) -> list[dict[str, Any]]:
    """Every model file under the look directories, as WeightFile fields, never fetched."""
    mounts = read_mounts(dirs.mounts)
    found: list[dict[str, Any]] = []
    for directory in dirs.all:
        if not directory.is_dir():
            continue
        store = store_of(directory, dirs, mounts)
        for path, size in models_under(directory):
            found.append({"source": str(path), "path": str(path), "size": size,
                          "fetched": False, "store": store})  # fmt: skip
    return found


def store_of(directory: Path, dirs: LookDirs, mounts: Sequence[Mount]) -> str:
    """The shared store a directory is on, or "" for this node's own storage."""
    resolved = directory.resolve()
    for shared in dirs.shared:
        if resolved.is_relative_to(shared.resolve()):
            return f"shared:{shared.resolve()}"
    mount = mount_of(resolved, mounts)
    if mount is not None and mount.fstype in NETWORK_FILESYSTEMS:
        device = os.stat(resolved).st_dev
        return f"{mount.fstype}:{mount.source}:{device}"
    return ""


def holds_a_model(directory: Path) -> bool:
    """Say whether ``directory`` is, or holds, a model by the rule of ``models_under``."""
    return bool(models_under(directory))


def models_under(top: Path) -> list[tuple[Path, int]]:
    """GGUF files, and directories of safetensors with a config.json, with their sizes.

    The one rule for what counts as a model on disk: a directory with only a config.json,
    or a half-copied one without its safetensors, is no model and must not draw placement.
    """
    found = []
    for root, dirs, files in os.walk(top):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if len(here.relative_to(top).parts) >= MAX_DEPTH:
            dirs[:] = []
        if is_model_directory(files):
            found.append((here, sum(size_or_zero(here / name) for name in files)))
            dirs[:] = []  # a model directory is one model
            continue
        for name in sorted(files):
            if name.endswith(".gguf") and not name.startswith("."):
                found.append((here / name, size_or_zero(here / name)))
    return [(path, size) for path, size in found if size]


def is_model_directory(files: Iterable[str]) -> bool:
    """A directory whose files include a config.json and at least one .safetensors."""
    names = set(files)
    return "config.json" in names and any(name.endswith(".safetensors") for name in names)
