"""Weights the node did not fetch and must never delete: model files in the directories
the agent file names to look in (``weights: {look: [...], shared: [...]}``).

A look directory may be a shared filer: a directory declared shared, or one on a network
filesystem (by the mount table), is reported with a store id (``shares``: its fabric and
the filer's own identity), so the control plane counts it once and knows who else sees it.
Local storage is never taken for shared.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_worker.weights.shares import network_store, share_store
from core.files import size_or_zero
from core.mounts import MOUNT_TABLE, Mount, read_mounts

log = logging.getLogger("llmgw.agent.weights")

# Filers hold thousands of files; models lie near the top.
MAX_DEPTH = 3


@dataclass(frozen=True)
class LookDirs:
    look: tuple[Path, ...] = ()
    shared: tuple[Path, ...] = ()  # declared shared (each also looked in)
    mounts: Path = MOUNT_TABLE
    fabrics: tuple[str, ...] = ()  # the node's: a store is its fabric's

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
            return share_store(shared.resolve(), dirs.fabrics, mounts)
    return network_store(resolved, dirs.fabrics, mounts)


def holds_a_model(directory: Path) -> bool:
    """Say whether ``directory`` is, or holds, a model by the rule of ``models_under``."""
    return bool(models_under(directory))


def models_under(top: Path) -> list[tuple[Path, int]]:
    """GGUF files, and directories of safetensors with a config.json, with their sizes.

    The one rule for what counts as a model on disk: a directory with only a config.json,
    or a half-copied one without all its safetensors (``is_model_directory``), is no model
    and must not draw placement.
    """
    found = []
    for root, dirs, files in os.walk(top):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if len(here.relative_to(top).parts) >= MAX_DEPTH:
            dirs[:] = []
        if is_model_directory(here, files):
            found.append((here, sum(size_or_zero(here / name) for name in files)))
            dirs[:] = []  # a model directory is one model
            continue
        for name in sorted(files):
            if name.endswith(".gguf") and not name.startswith("."):
                found.append((here / name, size_or_zero(here / name)))
    return [(path, size) for path, size in found if size]


def is_model_directory(directory: Path, files: Iterable[str]) -> bool:
    """A directory with a config.json and every one of its safetensors files: all that its
    index file (``*.safetensors.index.json``) maps tensors to, and without one, all the
    parts its files' names count (``model-00001-of-00004.safetensors``). Half a download
    holds some of them and is no model; an index that does not read is taken for one being
    copied."""
    names = set(files)
    if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
        return False
    indexes = sorted(name for name in names if name.endswith(INDEX_SUFFIX))
    if indexes:
        wanted: set[str] = set()
        for index in indexes:
            mapped = files_an_index_names(directory / index)
            if mapped is None:
                return False
            wanted |= mapped
    else:
        wanted = parts_their_names_count(names)
    safetensors = wanted | {name for name in names if name.endswith(".safetensors")}
    return wanted <= names and all(size_or_zero(directory / name) for name in safetensors)


INDEX_SUFFIX = ".safetensors.index.json"
_PART = re.compile(r"(?P<stem>.+)-(?P<part>\d+)-of-(?P<count>\d+)\.safetensors")


def files_an_index_names(index: Path) -> set[str] | None:
    """The safetensors files a ``*.safetensors.index.json`` maps tensors to, or None when it
    does not read as one."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return {str(name) for name in weight_map.values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def parts_their_names_count(names: set[str]) -> set[str]:
    """Every part file that sharded safetensors names imply: ``x-00002-of-00003`` implies
    parts 1 to 3, with the same number of digits."""
    wanted = set()
    for name in names:
        match = _PART.fullmatch(name)
        if match is None:
            continue
        width, count = len(match["part"]), int(match["count"])
        for part in range(1, count + 1):
            wanted.add(f"{match['stem']}-{part:0{width}d}-of-{match['count']}.safetensors")
    return wanted
