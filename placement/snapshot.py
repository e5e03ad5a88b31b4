"""What placement is given: frozen facts about nodes, and what a replica asks for.

The caller (the reconciler) builds these from its own records; placement never
looks anything up, so a decision can be reproduced from the snapshot alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

CONNECTED = "connected"
UNREACHABLE = "unreachable"
LOST = "lost"
DRAINING = "draining"
# A node whose agent cannot keep its walls (no nftables, or no right to change them).
UNWALLED = "unavailable"

Strategy = Literal["pack", "spread"]


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU that no shard holds, with the NVLink peers NVML reported for it."""

    index: int
    memory_free: int
    # Indices of GPUs on the same node this one has an NVLink to. Empty on every
    # GPU of a node means the topology is unknown (or there is none), not "unlinked".
    nvlink_peers: frozenset[int] = frozenset()


@dataclass(frozen=True)
class FabricSnapshot:
    """A fabric as one node sees it: the adapters it really has on it, and their state.

    `adapters` are the adapters the node reports on it with an ACTIVE port;
    `inactive_adapters` are on it but carry no data (a port in INIT looks healthy
    to anything counting adapters and hangs the first all-reduce).
    """

    name: str
    rate_gbps: float
    adapters: tuple[str, ...]
    socket_ifname: str = ""
    inactive_adapters: tuple[str, ...] = ()
    socket_address: str = ""  # socket_ifname's address: where the ranks meet on this fabric

    @property
    def usable(self) -> bool:
        """Say whether a collective can run over this fabric from this node."""
        return bool(self.adapters)


@dataclass(frozen=True)
class NodeSnapshot:
    """A node's state and its free resources at one moment."""

    id: str
    state: str  # CONNECTED | UNREACHABLE | LOST | DRAINING
    pool: str = ""
    # Engine name -> the versions installed. None: the agent sent no list (an agent
    # older than engine probing), which never excludes a node; {}: it probed and has none.
    engines: Mapping[str, tuple[str, ...]] | None = None
    # (engine, version) -> the node's own words for a version not installed (yet), e.g.
    # "installing: downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MiB, 40%)".
    engine_progress: Mapping[tuple[str, str], str] = field(default_factory=dict)
    gpus: tuple[GpuSnapshot, ...] = ()  # only the GPUs no shard holds
    ram_free: int = 0
    disk_free: int = 0
    fabrics: tuple[FabricSnapshot, ...] = ()
    weights: frozenset[str] = frozenset()  # weight keys (model sources) the node holds
    # Weight keys a shard is fetching onto the node now: their disk is already
    # claimed, but they are not held yet, so they earn no preference.
    weights_fetching: frozenset[str] = frozenset()
    # Live replicas on the node per profile ("model/profile"): what spread spreads.
    replicas: Mapping[str, int] = field(default_factory=dict)
    # How its agent walls engine ports (protocol.inventory.Inventory.firewall), and why
    # it cannot when it is UNWALLED.
    firewall: str = ""
    firewall_problem: str = ""


@dataclass(frozen=True)
class PlacementRequest:
    """One replica to place: the same shape on each of `ranks` nodes."""

    replica_key: str
    model: str
    profile: str
    engine: str
    engine_version: str = ""  # "" accepts any installed version
    gpus_per_rank: int = 0
    gpu_memory: int = 0  # bytes that must be free on EACH GPU of a rank
    ranks: int = 1  # nodes per replica; each rank on a different node
    memory: int = 0  # host RAM per rank, bytes
    disk: int = 0  # bytes of weights a rank's node must fetch if it lacks them
    # False where only rank 0 opens the weights (llama.cpp's rpc-server workers are sent
    # their tensors): the other ranks' nodes need no disk for them.
    workers_read_weights: bool = True
    pool: str = ""  # "" places in any pool
    weights_key: str = ""
    strategy: Strategy = "pack"
    # Where memory and gpu_memory came from when the catalog did not declare them: the
    # estimate from the model's file, in words its refusals repeat. "" for declared sizes.
    memory_basis: str = ""
    gpu_memory_basis: str = ""
    # Why the replica must wait before any node is asked (the estimate is on its way and
    # nothing was declared in its stead); "" when it need not.
    waiting_for: str = ""

    @property
    def weights_on_rank_0_only(self) -> bool:
        """Whether only rank 0's node needs the weights (and room for them)."""
        return self.ranks > 1 and not self.workers_read_weights

    @property
    def spread_key(self) -> str:
        """The replicas spread apart from each other: those of one profile; "" for pack."""
        return f"{self.model}/{self.profile}" if self.strategy == "spread" else ""
