"""Who may read the weights in the store: each entry's own group, which only the shards
whose command line names the entry are given (agent_worker/supervision/process.py), so an
engine reads the weights it serves and no other model's, even knowing their path.

The store's directory lets engines reach an entry by path and list none; each entry is
root's (or its operator's), its group's to read and nobody else's; a download in progress
and the records beside each file are the agent's alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from agent_worker.weights.names import PARTIAL_SUFFIX, SIDECAR_SUFFIX

log = logging.getLogger("llmgw.agent")

# Nameless groups, one per entry: the 2**24 after the shards' own (SHARD_GID_BASE in
# agent_worker/supervision/engine_user.py), far above any distribution's groups.
WEIGHTS_GID_BASE = 1_000_000_000 + 2**24


def weights_gid(entry_name: str) -> int:
    """The group that may read the store entry ``entry_name`` (a fetched file, a model's
    directory), given to the shards whose command line names it."""
    digest = hashlib.sha256(entry_name.encode()).digest()
    return WEIGHTS_GID_BASE + int.from_bytes(digest[:3], "big")


def restrict(entry: Path) -> None:
    """``entry`` (a file or a model's directory directly in the store) readable by its own
    group only: the group's to read (and enter), nobody else's. A link is left alone: it
    points elsewhere, and what it points at is not the store's to change."""
    if entry.is_symlink():
        return
    gid = weights_gid(entry.name) if os.geteuid() == 0 else -1
    paths = [entry]
    if entry.is_dir():
        for root, dirs, files in os.walk(entry):
            paths += [Path(root, name) for name in (*dirs, *files)]
    for path in paths:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            continue
        wanted = (0o750 if stat.S_ISDIR(mode) else 0o640) | (stat.S_IMODE(mode) & 0o700)
        if gid >= 0:
            os.chown(path, -1, gid, follow_symlinks=False)
        os.chmod(path, wanted)


def restrict_store(weights_dir: Path) -> int:
    """Every entry of the store restricted (at the agent's start: entries fetched by an
    older agent, or copied in by an operator); a partial download and a record are the
    agent's alone. Returns how many entries were restricted."""
    done = 0
    try:
        entries = list(os.scandir(weights_dir))
    except OSError:
        return 0
    for entry in entries:
        path = Path(entry.path)
        try:
            if entry.name.endswith((PARTIAL_SUFFIX, SIDECAR_SUFFIX)):
                if not entry.is_symlink():
                    path.chmod(0o600)
            elif not entry.name.startswith("."):
                restrict(path)
                done += 1
        except OSError as err:  # gone meanwhile, or not ours to change (a read-only mount)
            log.warning("cannot restrict %s to the shards that use it: %s", path, err)
    return done


def groups_for(argv: Iterable[str], weights_dir: Path) -> list[int]:
    """The groups of the store entries ``argv`` names (``-m <path>``, ``--model=<path>``),
    which the process needs to read them."""
    root = os.path.abspath(weights_dir) + os.sep
    groups: set[int] = set()
    for arg in argv:
        for value in (arg, arg.partition("=")[2]):
            path = os.path.abspath(value) if value.startswith("/") else ""
            if path.startswith(root):
                groups.add(weights_gid(path[len(root) :].split(os.sep, 1)[0]))
    return sorted(groups)
