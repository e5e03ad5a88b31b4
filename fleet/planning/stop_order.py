"""Stopping a replica across nodes in order: the ranks that connect (llama.cpp's rank 0,
``llama-server --rpc``; vLLM's and SGLang's workers) before the ranks they connect to
(``protocol.shard``). A rank whose peer vanishes under it aborts with a backtrace
in its log, or hangs in a collective; one whose peer left first just ends.

``stop_replica`` sends the first stops and holds the others; this says when the held ones
are due, which ``release_held_stops`` then sends (the connecting ranks' stopped reports at
once, the reconciler's pass for the rest).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from fleet.models import NodeState, Replica, ReplicaState, Shard, ShardState
from protocol.shard import ranks_of

# How long the ranks a stopping replica's others connect to wait for those to stop before
# they are stopped anyway: an agent that never answers its stop must not keep them forever.
HELD_STOP_LIMIT = timedelta(seconds=60)


def held_stops_due(replica: Replica, now: datetime, *, answered: bool = True) -> list[Shard]:
    """The shards of a stopping replica whose stop waits on the ranks that connect to
    them, once those have stopped (unless ``answered`` is False: the reconciler's, whose
    pass comes after the stopped reports sent them), are out of reach (their node not
    connected), or have been waited for ``HELD_STOP_LIMIT``; empty while they must still
    wait. Reads the replica's shards and their nodes as prefetched."""
    if replica.state != ReplicaState.STOPPING:
        return []
    ranks = ranks_of(replica.engine)
    shards = [shard for shard in replica.shards.all() if shard.node is not None]
    held = [s for s in shards if not ranks.connects(s.rank) and s.state not in ShardState.FINAL]
    if not held:
        return []
    if now - replica.state_changed_at >= HELD_STOP_LIMIT:
        return held
    connecting = [s for s in shards if ranks.connects(s.rank) and s.state not in ShardState.FINAL]
    if any(shard.node and shard.node.state == NodeState.CONNECTED for shard in connecting):
        return []
    return held if connecting or answered else []


def held_stop_reason(replica: Replica, now: datetime) -> str:
    """Why the held stops go now, in words for the replica's Event."""
    ranks = ranks_of(replica.engine)
    connecting = [
        shard
        for shard in replica.shards.all()
        if ranks.connects(shard.rank)
        and shard.node_id is not None
        and shard.state not in ShardState.FINAL
    ]
    names = ", ".join(str(shard.rank) for shard in connecting)
    if not connecting:
        return "the ranks that connect to them have stopped"
    if now - replica.state_changed_at >= HELD_STOP_LIMIT:
        waited = HELD_STOP_LIMIT.seconds
        return f"rank {names}, connecting to them, has not answered its stop in {waited}s"
    return f"rank {names}, connecting to them, is on a node out of reach"
