"""What ``python -m bench.hostile_node`` set up, as the attack modules see it: every rank of
every ready replica (its host, address, port, process and where that process listens),
and the hosts an attacker may stand on.

Read once the replicas answer through the router, from the fleet's database (where it
lives, the services host) and from the engines' own command lines (``--host``): where a
process really listens is what an attacker connects to.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from bench import sim
from llmgw_cli.sim import hosts
from llmgw_cli.sim.state import Fleet


@dataclass(frozen=True)
class Rank:
    """One rank of a ready replica."""

    model: str
    replica: str
    shard: str  # its shard's id
    rank: int
    world_size: int
    engine: str
    node: str  # the node host it runs on
    address: str  # its node's address
    port: int
    pid: int | None
    listens_on: str  # the address its process binds (--host), else its node's

    @property
    def serves_http(self) -> bool:
        return self.rank == 0

    @property
    def is_rpc_worker(self) -> bool:
        """A llama.cpp rank above 0: ``rpc-server``, which answers anyone who connects."""
        return self.engine == "llama.cpp" and self.rank > 0


@dataclass(frozen=True)
class Scene:
    fleet: Fleet
    ranks: tuple[Rank, ...]
    router: str = hosts.ROUTER
    services: str = hosts.SERVICES

    def replica_nodes(self, replica: str) -> set[str]:
        return {r.node for r in self.ranks if r.replica == replica}

    def outsider(self, replica: str) -> str | None:
        """A node host holding no rank of ``replica``: another tenant's machine, as far
        as that replica is concerned."""
        inside = self.replica_nodes(replica)
        return next((n.name for n in self.fleet.nodes if n.name not in inside), None)

    @property
    def http_ranks(self) -> list[Rank]:
        return [r for r in self.ranks if r.serves_http]

    @property
    def rpc_workers(self) -> list[Rank]:
        return [r for r in self.ranks if r.is_rpc_worker]

    @property
    def multi_node(self) -> list[Rank]:
        return [r for r in self.ranks if r.world_size > 1]


def read_scene(fleet: Fleet, models: list[str]) -> Scene:
    """Every rank of the ready replicas of ``models``."""
    rows = sim.query(
        fleet,
        "SELECT r.model_name, r.id::text, s.id, s.rank, r.engine, s.node_id, n.address, s.port,"
        " s.pid,"
        " (SELECT count(*) FROM fleet_shard o WHERE o.replica_id = r.id)"
        " FROM fleet_replica r JOIN fleet_shard s ON s.replica_id = r.id"
        " JOIN fleet_node n ON n.id = s.node_id"
        " WHERE r.state = 'ready' AND r.model_name = ANY(%s) ORDER BY r.model_name, s.rank",
        (models,),
    )
    ranks = tuple(
        Rank(model, replica, shard, rank, int(world), engine, node, address, port, pid,
             listening_address(pid) or address)
        for model, replica, shard, rank, engine, node, address, port, pid, world in rows
    )  # fmt: skip
    return Scene(fleet, ranks)


def listening_address(pid: int | None) -> str:
    """The ``--host`` of the engine process ``pid``; "" when it has none or is gone."""
    try:
        argv = psutil.Process(pid).cmdline() if pid else []
    except psutil.Error:
        return ""
    for index, arg in enumerate(argv[:-1]):
        if arg == "--host":
            return argv[index + 1]
    return ""
