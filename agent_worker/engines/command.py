"""A process an engine adapter asks the supervisor to run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SecretFile:
    """A secret a process reads from a file whose path its command line names.

    A command line is world-readable (``ps``, ``/proc/<pid>/cmdline``); the file is not.
    The supervisor writes ``content`` to ``name`` in the shard's own directory, mode 0600,
    before the process starts, adds ``flag PATH`` to its argv, and removes the file when
    the shard ends.
    """

    flag: str  # e.g. "--api-key-file"; "" puts the path alone
    name: str  # a plain file name, e.g. "api-key"
    content: str = field(repr=False)  # never in a log line or a traceback's repr


@dataclass(frozen=True)
class LaunchCommand:
    """One process of a shard.

    A shard is a sequence of these: every command but the last is a sidecar (a Ray
    head, say) that lives and dies with the shard; the last one's exit is the
    shard's. ``wait_for_port`` makes the supervisor wait until host:port accepts a
    connection after starting this command and before starting the next, bounded
    by ``wait_timeout`` seconds, so a head that never appears fails the shard.
    ``secret_files`` and ``secret_env`` reach the process by file or environment (both
    private to its user), never on its command line.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = ""
    wait_for_port: tuple[str, int] | None = None
    wait_timeout: float = 60.0
    secret_files: tuple[SecretFile, ...] = ()
    # Added to the environment like ``env``, kept out of repr: VLLM_API_KEY, say.
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Listener:
    """A port another rank listens on, which this rank waits for before it starts."""

    name: str  # in words, e.g. "rank 0's rendezvous"
    host: str
    port: int
