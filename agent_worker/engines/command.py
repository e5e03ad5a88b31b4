"""A process an engine adapter asks the supervisor to run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LaunchCommand:
    """One process of a shard.

    A shard is a sequence of these: every command but the last is a sidecar (a Ray
    head, say) that lives and dies with the shard; the last one's exit is the
    shard's. ``wait_for_port`` makes the supervisor wait until host:port accepts a
    connection after starting this command and before starting the next, bounded
    by ``wait_timeout`` seconds, so a head that never appears fails the shard.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = ""
    wait_for_port: tuple[str, int] | None = None
    wait_timeout: float = 60.0


@dataclass(frozen=True)
class Listener:
    """A port another rank listens on, which this rank waits for before it starts."""

    name: str  # in words, e.g. "rank 0's rendezvous"
    host: str
    port: int
