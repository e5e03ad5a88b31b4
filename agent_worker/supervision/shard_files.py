"""Each shard's own directory: the secrets its engine reads by file.

``ROOT/<shard_id>/`` exists from just before the shard's first process starts until the
shard ends. A secret is written there before the process that reads it starts, and only
its path goes on the command line, which anyone on the node can read (``ps``,
``/proc/<pid>/cmdline``). ROOT is ``<agent_dir>/shard-files`` (0700) where engines run as
the agent's user; where they run as the engine user it is ``/run/llmgw/shards`` (tmpfs on
most systems, searchable by all, listable by none, reachable whatever the agent's directory
allows), and each shard's directory and files belong to root and the shard's own group
(0750, 0640): its engine reads them, no other shard's can.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from agent_worker.engines.command import SecretFile
from agent_worker.supervision.statedir import check_shard_id

# Where engines run as the engine user: reachable by it whatever the agent's directory is.
SHARED_FILES = Path("/run/llmgw/shards")


class ShardFiles:
    """The directories of every shard, under ``root``."""

    def __init__(self, root: Path, shared: bool = False) -> None:
        self.root = Path(root)
        self.shared = shared  # engines of other users reach their directories here

    def directory(self, shard_id: str) -> Path:
        return self.root / check_shard_id(shard_id)

    def prepare(self, shard_id: str, group: int | None = None) -> Path:
        """Create the shard's directory (and the root): the agent's alone, or shared with
        ``group``, the shard's own, to read."""
        self.root.mkdir(mode=0o711 if self.shared else 0o700, parents=True, exist_ok=True)
        directory = self.directory(shard_id)
        directory.mkdir(mode=0o700, exist_ok=True)
        if group is not None:
            os.chown(directory, 0, group)
            directory.chmod(0o750)
        return directory

    def write_secrets(
        self, shard_id: str, secrets: tuple[SecretFile, ...], group: int | None = None
    ) -> list[str]:
        """Write each secret into the shard's directory, readable by ``group`` too when
        given; return the flags that name them."""
        if not secrets:
            return []
        directory = self.prepare(shard_id, group)
        flags = []
        for secret in secrets:
            if not secret.name or "/" in secret.name or secret.name.startswith("."):
                raise ValueError(f"secret file name {secret.name!r} is not a plain file name")
            path = directory / secret.name
            _write_private(path, secret.content, group)
            flags += [secret.flag, str(path)] if secret.flag else [str(path)]
        return flags

    def remove(self, shard_id: str) -> None:
        """Forget the shard's directory and every secret in it."""
        with contextlib.suppress(ValueError):
            shutil.rmtree(self.directory(shard_id), ignore_errors=True)


def _write_private(path: Path, content: str, group: int | None) -> None:
    # Replaced whole, 0600 from the moment it exists (then 0640 to the shard's group): a
    # leftover of a crashed agent is overwritten, never appended to.
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with open(fd, "w") as file:
        if group is not None:
            os.fchown(fd, 0, group)
            os.fchmod(fd, 0o640)
        file.write(content)
