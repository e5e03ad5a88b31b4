"""Who may reach each port of a shard (docs/security.md, "Engine ports: who may reach them").

Every shard holds two ports, its own and the next (``allocate_port`` steps by 2):

- the port of a rank that serves HTTP admits the routers and control planes (``callers``);
- a llama.cpp worker's port is ``rpc-server``'s: only rank 0 connects to it, so only rank
  0's addresses are admitted; any other worker port (vLLM and SGLang workers) admits the
  replica's other ranks;
- the next port is the rendezvous (rank 0's, for vLLM and SGLang: torch, Ray's head):
  the replica's other ranks only, and nobody at all for a replica on one node.

Loopback is always let through by the table itself. The ports an engine picks at run time
(NCCL's and Gloo's sockets, Ray's workers) are not the shard's and are not walled here:
with a fabric that has an address they are on that fabric (NCCL_SOCKET_IFNAME).
"""

from __future__ import annotations

from agent_worker.engines.base import EngineAdapter
from agent_worker.engines.validation import parse_rendezvous
from agent_worker.walls.rules import Opening, ShardWall
from protocol.shard import ShardSpec

MAX_PORT = 65535


def shard_wall(spec: ShardSpec, adapter: EngineAdapter, callers: list[str] | None) -> ShardWall:
    """The wall of one shard; ``callers`` None leaves its HTTP port open (a control plane
    too old to name the routers: walling it would cut every router off)."""
    ranks = rank_addresses(spec)
    others = tuple(a for rank, addresses in enumerate(ranks) if rank != spec.rank
                   for a in addresses)  # fmt: skip
    openings = []
    if adapter.serves_http(spec.rank):
        if callers is not None:
            openings.append(Opening((spec.port,), tuple(callers), "routers and control planes"))
    elif adapter.listening_side == "workers":
        first = tuple(ranks[0]) if ranks else ()
        openings.append(Opening((spec.port,), first, "rank 0 (rpc-server)"))
    else:
        openings.append(Opening((spec.port,), others, "the replica's other ranks"))
    if spec.port < MAX_PORT:
        openings.append(Opening((spec.port + 1,), others, "rendezvous: the other ranks"))
    return ShardWall(spec.shard_id, tuple(openings))


def rank_addresses(spec: ShardSpec) -> list[list[str]]:
    """Every rank's addresses: as the spec lists them, or (from a control plane before
    ``ranks``) its meeting points: rank 0's rendezvous host and each worker's."""
    if spec.ranks or spec.world_size == 1:
        return [list(addresses) for addresses in spec.ranks]
    hosts = []
    for point in [spec.rendezvous, *spec.workers]:
        try:
            hosts.append([parse_rendezvous(point)[0]])
        except ValueError:
            hosts.append([])
    return hosts
