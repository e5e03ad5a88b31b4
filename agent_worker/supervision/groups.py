"""The nameless groups engines run in, each from a hash of what it guards: a shard's own
(the secrets in its directory, its processes' memory) and a weights entry's (the store's
file or directory, agent_worker/weights/access.py). Far above any distribution's own
groups and any user namespace's usual range."""

from __future__ import annotations

import hashlib

SHARD_GID_BASE = 1_000_000_000
WEIGHTS_GID_BASE = SHARD_GID_BASE + 2**24  # the 2**24 after the shards'


def shard_gid(shard_id: str) -> int:
    """The group of shard ``shard_id``: one of 2**24, from its id, so two shards share one
    with odds of about one in 300,000 on a node of ten (ports would be unique on a node,
    but not on a machine that runs several agents: a simulated fleet)."""
    return SHARD_GID_BASE + _hash24(shard_id)


def weights_gid(entry_name: str) -> int:
    """The group that may read the store entry ``entry_name`` (a fetched file, a model's
    directory), given to the shards whose command line names it."""
    return WEIGHTS_GID_BASE + _hash24(entry_name)


def _hash24(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:3], "big")
