"""What a node is told to run: one rank of one replica, complete enough to restart from.

The agent writes this spec to its state directory before launch, so an agent that
restarts can describe a running engine back to the control plane (adoption).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ShardState = Literal["pending", "fetching", "starting", "ready", "failed", "stopped"]
LaunchMode = Literal["native", "ray", "mp"]


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
    epoch: int = Field(default=0, ge=0, description="the leader's epoch that issued this spec")
