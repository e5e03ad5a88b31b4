"""Each shard's own directory under the agent's: the secrets its engine reads by file.

``<agent_dir>/shard-files/<shard_id>/`` exists from just before the shard's first process
starts until the shard ends. A secret is written there mode 0600 before the process that
reads it starts, and only its path goes on the command line, which anyone on the node can
read (``ps``, ``/proc/<pid>/cmdline``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from agent_worker.engines.command import SecretFile
from agent_worker.supervision.statedir import check_shard_id


class ShardFiles:
    """The directories of every shard, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def directory(self, shard_id: str) -> Path:
        return self.root / check_shard_id(shard_id)

    def prepare(self, shard_id: str) -> Path:
        """Create the shard's directory (and the root), private to the agent's user."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory = self.directory(shard_id)
        directory.mkdir(mode=0o700, exist_ok=True)
        return directory

    def write_secrets(self, shard_id: str, secrets: tuple[SecretFile, ...]) -> list[str]:
        """Write each secret into the shard's directory; return the flags that name them."""
        if not secrets:
            return []
        directory = self.prepare(shard_id)
        flags = []
        for secret in secrets:
            if not secret.name or "/" in secret.name or secret.name.startswith("."):
                raise ValueError(f"secret file name {secret.name!r} is not a plain file name")
            path = directory / secret.name
            _write_private(path, secret.content)
            flags += [secret.flag, str(path)]
        return flags

    def remove(self, shard_id: str) -> None:
        """Forget the shard's directory and every secret in it."""
        with contextlib.suppress(ValueError):
            shutil.rmtree(self.directory(shard_id), ignore_errors=True)


def _write_private(path: Path, content: str) -> None:
    # Replaced whole, 0600 from the moment it exists: a restart of the same shard id
    # (never, today) or a leftover of a crashed agent is overwritten, never appended to.
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with open(fd, "w") as file:
        file.write(content)
