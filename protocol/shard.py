"""What a node is told to run: one rank of one replica, complete enough to restart from.

The agent writes this spec to its state directory before launch, so an agent that
restarts can describe a running engine back to the control plane (adoption).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from protocol.sources import HUB_ID

ShardState = Literal["pending", "fetching", "starting", "ready", "failed", "stopped"]
# The names a reader outside Django (a bench, a SQL query) compares with; fleet's
# ShardState holds the same ones (tests/fleet/test_transitions.py keeps them equal).
SHARD_READY: ShardState = "ready"
# Holds its node's GPUs and port: running, or on its way to running.
SHARD_LIVE: tuple[ShardState, ...] = ("pending", "fetching", "starting", "ready")
LaunchMode = Literal["native", "ray", "mp"]


# LoRA adapters served on their base model's replicas: what each engine can do with them,
# and how one travels to a node. One table for both sides, like ENGINE_RANKS below: the
# catalog refuses an adapter on a profile whose engine cannot serve it, and the agent's
# engine adapters build the flags. An adapter is asked for by its own model id,
# ``<model>:<adapter>`` (``adapter_id``), which is also the name vLLM serves it under;
# llama.cpp serves every adapter under the base model's name and is told which to apply
# per request (the router's ``lora`` field).

# Between a model's name and its adapter's in the adapter's model id.
ADAPTER_SEPARATOR: Final = ":"


def adapter_id(model: str, adapter: str) -> str:
    """The model id clients send for ``adapter`` of ``model``."""
    return f"{model}{ADAPTER_SEPARATOR}{adapter}"


@dataclass(frozen=True)
class EngineLoras:
    """What one engine does with LoRA adapters."""

    # Adapters named at start are loaded with the engine (llama.cpp: --lora, vLLM:
    # --lora-modules).
    at_start: bool
    # Adapters are loaded and unloaded while it runs (vLLM's /v1/load_lora_adapter).
    at_runtime: bool
    # The source must be a file on the node (llama.cpp reads a LoRA GGUF, no hub id).
    needs_file: bool
    # Why it cannot serve adapters at all; "" when it can.
    refused: str = ""

    def problem(self, source: str, max_loras: int) -> str:
        """Why it cannot serve an adapter from ``source`` with ``max_loras``; "" if it can."""
        if self.refused:
            return self.refused
        if self.needs_file and HUB_ID.match(source) and not source.startswith("/"):
            return (
                f"it loads a LoRA GGUF file and cannot fetch the hub id {source!r}; give a path "
                "or https:// URL of a .gguf adapter (llama.cpp's convert_lora_to_gguf.py makes one)"
            )
        if self.at_runtime and not max_loras:
            return (
                "its LoRA is off; set the profile's max_loras: to the adapters one replica "
                "holds at once (such as 4)"
            )
        return ""


ENGINE_LORAS: dict[str, EngineLoras] = {
    "llama.cpp": EngineLoras(at_start=True, at_runtime=False, needs_file=True),
    "vllm": EngineLoras(at_start=True, at_runtime=True, needs_file=False),
    "sglang": EngineLoras(
        at_start=False,
        at_runtime=False,
        needs_file=False,
        refused="llmgw does not yet give SGLang its LoRA flags (--enable-lora, --lora-paths); "
        "serve the adapter from a llama.cpp or vLLM profile, or list only those under its "
        "profiles:",
    ),  # fmt: skip
}

# vLLM's own default for --max-lora-rank: an adapter of a higher rank is refused at load.
VLLM_DEFAULT_MAX_LORA_RANK: Final = 16


def served_adapters(adapters: list[dict], profile: str, engine: str) -> list[dict]:
    """The adapters (a model's ``adapters:`` entries) that profile ``profile`` on ``engine``
    serves: those naming it, or naming no profile, when its engine serves adapters at all."""
    if loras_of(engine).refused:
        return []
    return [a for a in adapters if not a.get("profiles") or profile in a["profiles"]]


def start_specs(adapters: list[dict], engine: str) -> list[AdapterSpec]:
    """What a replica on ``engine`` loads at start of ``adapters``, in their order."""
    if not loras_of(engine).at_start:
        return []
    return [
        AdapterSpec(
            name=a["name"],
            source=a["source"],
            sha256=a.get("sha256", ""),
            scale=a.get("scale", 1.0),
        )  # fmt: skip
        for a in adapters
    ]


def loras_of(engine: str) -> EngineLoras:
    """The engine's row; an engine the table does not name serves no adapter."""
    return ENGINE_LORAS.get(
        engine,
        EngineLoras(False, False, False, refused=f"{engine} serves no LoRA adapter in llmgw"),
    )


class AdapterSpec(BaseModel):
    """One adapter a replica loads at start, as the node is told it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="the adapter's name in the catalog, unique in its model")
    source: str = Field(description="absolute path, https:// URL or hub id as the catalog says")
    sha256: str = Field(default="", description="hex SHA-256 of a URL source's file, if known")
    path: str = Field(default="", description="where it is on this node, once resolved or fetched")
    scale: float = Field(default=1.0, description="how strongly it is applied when asked for")


class FabricAssignment(BaseModel):
    """The fabric a multi-node rank talks over, as this node sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    adapters: list[str] = Field(default_factory=list, description="active adapters on this node")
    socket_ifname: str = ""
    address: str = Field(
        default="",
        description="this node's address on the fabric (socket_ifname's, IPoIB), where a "
        "rank that listens for the others binds; empty: the fabric has none, the node's own",
    )


class ShardSpec(BaseModel):
    """One rank of a replica: everything an engine adapter needs to build its commands."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shard_id: str
    replica_id: str
    model: str = Field(description="the name clients send; the engine serves it under this name")
    source: str = Field(description="absolute path, https:// URL or hub id as the catalog says")
    sha256: str = Field(default="", description="hex SHA-256 of a URL source's file, if known")
    model_path: str = Field(
        default="", description="where the weights are on this node, once resolved or fetched"
    )
    engine: str
    engine_version: str = ""
    profile: str = ""
    fingerprint: str = ""
    rank: int = Field(default=0, ge=0)
    world_size: int = Field(default=1, ge=1, description="nodes in the replica")
    gpus: list[int] = Field(default_factory=list, description="GPU indices on this node")
    tensor_parallel: int = Field(default=1, ge=1)
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    rendezvous: str = Field(default="", description="host:port of rank 0's rendezvous point")
    workers: list[str] = Field(
        default_factory=list,
        description="host:port of ranks 1.. in rank order, each on its engine port: where "
        "rank 0 connects when the workers listen (llama.cpp's RPC)",
    )
    ranks: list[list[str]] = Field(
        default_factory=list,
        description="every rank's addresses in rank order (its node's, then its fabric's "
        "where it has one): the only sources the node's walls admit on this rank's rpc and "
        "rendezvous ports; empty for one node",
    )
    callers: list[str] | None = Field(
        default=None,
        description="the addresses (or networks) of the routers and control planes when this "
        "was sent: the only sources besides loopback the node's walls admit on an HTTP port, "
        "until the node is told newer ones; None: a control plane too old to say",
    )
    fabric: FabricAssignment | None = None
    context: int = Field(default=0, ge=0)
    launch_mode: LaunchMode = "native"
    serves: list[str] = Field(
        default_factory=list,
        description="the kinds the profile's serves: names (protocol.serving); empty: the "
        "engine's default, chat",
    )
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    api_key: str = Field(default="", description="per-replica secret that only the router sends")
    sealed_api_key: str = Field(
        default="",
        description="api_key sealed for this node (protocol.signing.open_sealed), as it travels "
        "on the broker; the agent opens it into api_key before anything uses the spec",
    )
    startup_timeout: int = Field(default=600, ge=1, description="seconds")
    adapters: list[AdapterSpec] = Field(
        default_factory=list,
        description="LoRA adapters loaded at start, in order (llama.cpp's ids count from 0)",
    )
    max_loras: int = Field(
        default=0, ge=0, description="adapters one batch holds (vLLM's --max-loras); 0: LoRA "
        "off unless adapters are loaded at start"
    )  # fmt: skip
    max_lora_rank: int = Field(default=0, ge=0, description="vLLM's --max-lora-rank; 0: its own")
    epoch: int = Field(default=0, ge=0, description="the leader's epoch that issued this spec")


# How one engine's ranks across nodes stand to each other, for both sides: the agent's
# adapters start ranks by it (the side that connects starts once the other listens) and
# fetch weights only for the ranks that read them; the control plane stops ranks by it
# (the side that connects first, so that no rank is left talking to one already gone,
# ``fleet/planning/stop_order.py``) and placement counts disk only for the ranks that
# read the weights. One table, so that the two sides cannot disagree.

ListeningSide = Literal["rank0", "workers"]
T = TypeVar("T")


@dataclass(frozen=True)
class EngineRanks:
    """One engine's ranks across nodes."""

    # "rank0": the workers join rank 0's rendezvous (vLLM, SGLang); "workers": rank 0
    # connects to each worker (llama.cpp's RPC backend).
    listening_side: ListeningSide = "rank0"
    # False where a worker rank is sent its tensors by rank 0 (rpc-server) and never opens
    # the weights: it neither fetches them nor needs the disk for them.
    workers_read_weights: bool = True

    def reads_weights(self, rank: int) -> bool:
        """Say whether ``rank`` opens the weights (and so needs them on its node)."""
        return rank == 0 or self.workers_read_weights

    def connects(self, rank: int) -> bool:
        """Say whether ``rank`` is on the side that connects to the others."""
        return (rank == 0) == (self.listening_side == "workers")

    def stop_order(self, ranks: Sequence[tuple[int, T]]) -> tuple[list[T], list[T]]:
        """Split (rank, item) pairs into what stops first (the side that connects) and
        what stops once that has (the side it connects to)."""
        first = [item for rank, item in ranks if self.connects(rank)]
        then = [item for rank, item in ranks if not self.connects(rank)]
        return first, then


ENGINE_RANKS: dict[str, EngineRanks] = {
    "llama.cpp": EngineRanks(listening_side="workers", workers_read_weights=False),
    "vllm": EngineRanks(listening_side="rank0"),
    "sglang": EngineRanks(listening_side="rank0"),
}


def ranks_of(engine: str) -> EngineRanks:
    """The engine's ranks as the table has them; an engine it does not name is taken as
    vLLM's kind (rank 0 listens, every rank reads the weights), the cautious reading."""
    return ENGINE_RANKS.get(engine, EngineRanks())
