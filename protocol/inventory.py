"""What a node is (sent in `register`) and how busy it is (sent in every `heartbeat`).

Every model forbids unknown fields, so a malformed message is refused with the name of the
field that is wrong rather than half-read. Sizes are bytes, as ints; rates are Gb/s.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PortState = Literal["DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER", "UNKNOWN"]
FirewallStatus = Literal["", "nftables", "loopback", "off", "unavailable"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Cpu(_Strict):
    """The node's processor: what an engine build and a placement need to know."""

    model: str
    cores: int = Field(ge=1, description="logical CPUs")
    arch: str
    vector_extensions: list[str] = Field(
        default_factory=list, description='e.g. ["sse4_2", "avx", "avx2", "fma"] or ["neon"]'
    )


class Gpu(_Strict):
    """One NVIDIA GPU as NVML reports it, indexed in NVML's (PCI bus) order."""

    index: int = Field(ge=0)
    uuid: str
    name: str
    memory_total: int = Field(ge=0)
    memory_used: int = Field(ge=0)
    pci_bus_id: str = ""
    compute_capability: str = Field(default="", description='e.g. "8.0"; empty when unknown')
    nvlink_peers: list[int] = Field(
        default_factory=list,
        description="indices of GPUs reachable over an active NVLink; empty also means unknown",
    )


class AdapterPort(_Strict):
    """One port of an InfiniBand (or RoCE) adapter."""

    number: int = Field(ge=1)
    state: PortState
    rate_gbps: float | None = Field(default=None, ge=0, description="None when unreadable")
    link_layer: str = Field(default="", description='"InfiniBand" or "Ethernet" (RoCE)')


class FabricAdapter(_Strict):
    """An adapter found under /sys/class/infiniband, whether or not a fabric declares it."""

    name: str
    ports: list[AdapterPort] = Field(default_factory=list)
    interfaces: list[str] = Field(
        default_factory=list, description="network interfaces on the adapter that are up"
    )

    def active_ports(self) -> list[AdapterPort]:
        """Return the ports that can carry traffic: ACTIVE ones only."""
        return [port for port in self.ports if port.state == "ACTIVE"]


class UsableFabric(_Strict):
    """A declared fabric this node can really use: only adapters with an ACTIVE port."""

    name: str
    adapters: list[str] = Field(min_length=1)
    rate_gbps: float | None = Field(
        default=None, ge=0, description="the slowest active link, since a collective runs at it"
    )
    socket_ifname: str = Field(
        default="", description="an up network interface on a usable adapter (IPoIB / RoCE)"
    )
    socket_address: str = Field(
        default="", description="socket_ifname's address: where ranks meet over this fabric"
    )


class Filesystem(_Strict):
    """Space on the filesystem holding a directory the agent uses."""

    path: str = Field(description="the first directory the agent uses on this mount")
    mount: str
    total: int = Field(ge=0)
    free: int = Field(ge=0, description="available to the agent, not counting root's reserve")


class Inventory(_Strict):
    """Everything a node finds out about itself at start; configuration only overrides."""

    hostname: str = Field(min_length=1)
    address: str = Field(min_length=1)
    os: str
    kernel: str
    arch: str
    cpu: Cpu
    memory_total: int = Field(ge=0)
    gpus: list[Gpu] = Field(default_factory=list)
    nvidia_driver: str = Field(default="", description="empty when no NVIDIA driver answers")
    cuda_version: str = Field(default="", description='newest CUDA the driver supports, "12.4"')
    fabrics: list[UsableFabric] = Field(default_factory=list)
    adapters: list[FabricAdapter] = Field(default_factory=list)
    weights_dir: str = ""
    filesystems: list[Filesystem] = Field(default_factory=list)
    warnings: list[str] = Field(
        default_factory=list, description="things an operator should fix, in their words"
    )
    firewall: FirewallStatus = Field(
        default="",
        description="how the agent walls engine ports: nftables; loopback (engines listen on "
        "loopback, nothing to wall); off (the operator accepted them open); unavailable; "
        '"" an agent too old to wall them',
    )
    firewall_problem: str = Field(default="", description="why walls are unavailable")

    @property
    def engine_ports_open(self) -> str:
        """Why this node's engine ports answer the network, in an operator's words; "" when
        they are walled (or listen on loopback only)."""
        if self.firewall in ("nftables", "loopback"):
            return ""
        why = {
            "off": "LLMGW_AGENT_FIREWALL=off accepts the risk",
            "unavailable": self.firewall_problem or "the agent cannot change nftables",
            "": "this agent is too old to wall them; upgrade it",
        }[self.firewall]
        return f"engine ports open to the network: {why}"

    def weights_filesystem(self) -> Filesystem | None:
        """Return the filesystem the weights directory is on, if it was measured."""
        return next((fs for fs in self.filesystems if fs.path == self.weights_dir), None)


class ShardUsage(_Strict):
    """What one shard's process group uses, children included."""

    cpu_cores: float = Field(ge=0, description="CPU seconds per second over the interval")
    rss: int = Field(ge=0, description="summed resident memory; pages shared by forks count twice")


class NodeUsage(_Strict):
    """A heartbeat's measurements, taken over the interval since the previous one."""

    cpu_percent: float = Field(ge=0, le=100, description="busy share of all cores together")
    load: tuple[float, float, float] = Field(description="1, 5 and 15 minute load averages")
    memory_total: int = Field(ge=0, description="re-read every time so a resized VM is noticed")
    memory_used: int = Field(ge=0, description="total minus available")
    memory_available: int = Field(ge=0)
    gpu_memory_used: dict[int, int] = Field(
        default_factory=dict, description="bytes by GPU index; a GPU that did not answer is absent"
    )
    filesystems: list[Filesystem] = Field(default_factory=list)
    shards: dict[str, ShardUsage] = Field(
        default_factory=dict, description="by shard id; a shard with no live process is absent"
    )
