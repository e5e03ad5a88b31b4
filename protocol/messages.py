"""Messages a node sends up its link to the control plane (DESIGN.md, "The link").

Every message is a JSON object with a ``type``; ``parse_message`` validates one and
raises ``MessageError`` naming the field at fault, so a malformed message is refused
with a reason and never reaches the node's row.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from protocol.engines import EngineInstall
from protocol.gpu_users import UnexpectedGpuUser
from protocol.inventory import Inventory, NodeUsage
from protocol.shard import ShardSpec, ShardState

PROTOCOL_VERSION = 1


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _engines_as_list(value: object) -> object:
    # Agents before per-version statuses sent {engine: {version, path, status}}.
    if isinstance(value, dict):
        return [{**dict(install or {}), "engine": name} for name, install in value.items()]
    return value


# Every engine version on the node, each with its status.
EngineList = Annotated[list[EngineInstall], BeforeValidator(_engines_as_list)]


class ReportedShard(_Message):
    """A shard the agent is running or watching, reported on every register."""

    spec: ShardSpec
    state: ShardState
    pid: int | None = None
    reason: str = ""
    seq: int = Field(default=0, ge=0, description="the sequence number of this state; 0 unknown")


class WeightFile(_Message):
    """Weights the node holds: a source key and where it lives."""

    source: str
    path: str
    size: int = Field(default=0, ge=0)
    fetched: bool = Field(default=False, description="llmgw fetched it, so llmgw may delete it")
    store: str = Field(
        default="",
        description="the shared store it lies on (a declared shared directory, or a network "
        'filesystem by type, source and device); "" is this node\'s own storage',
    )


class Register(_Message):
    """Sent on every connect: the whole inventory and everything the agent runs."""

    type: Literal["register"] = "register"
    protocol: int = PROTOCOL_VERSION
    agent_version: str = ""
    inventory: Inventory
    # False from an agent that has not yet looked at the engines its file names (it has
    # just started), or one too old to probe: its list then means "did not say", and the
    # control plane keeps what it knew.
    engines_probed: bool = False
    engines: EngineList = Field(default_factory=list)
    weights: list[WeightFile] = Field(default_factory=list)
    shards: list[ReportedShard] = Field(default_factory=list)
    problems: list[str] = Field(
        default_factory=list, description="e.g. a shard spec file the agent could not read"
    )
    log_sources: list[str] = Field(default_factory=list)
    unexpected_gpu_users: list[UnexpectedGpuUser] = Field(
        default_factory=list, description="GPU holders llmgw did not start and leaves alone"
    )


class Heartbeat(_Message):
    """Every 5 s: how busy the node is."""

    type: Literal["heartbeat"] = "heartbeat"
    usage: NodeUsage


class ShardStatus(_Message):
    """A shard's state transition, with the engine's output tail on failure."""

    type: Literal["shard_status"] = "shard_status"
    shard_id: str
    replica_id: str = ""
    state: ShardState
    reason: str = ""
    output_tail: list[str] = Field(default_factory=list)
    pid: int | None = None
    fingerprint: str = ""
    # Grows with every transition on the node, across agent restarts: a status queued
    # during an outage and sent after a register must not undo what the register said.
    seq: int = Field(default=0, ge=0, description="0 from an agent too old to number them")


class ShardProgress(_Message):
    """Download progress: rides beside the state, deliberately not a transition."""

    type: Literal["shard_progress"] = "shard_progress"
    shard_id: str
    bytes: int = Field(ge=0)
    total: int | None = Field(default=None, ge=0, description="absent when the server sent none")
    rate: float | None = Field(default=None, ge=0, description="bytes per second")


class Engines(_Message):
    """Sent when the installed engines change; ``probed`` makes an empty list mean "none"
    (without it the list says nothing, and the control plane keeps what it knew)."""

    type: Literal["engines"] = "engines"
    probed: bool = True
    engines: EngineList = Field(default_factory=list)


class Weights(_Message):
    """Sent when the weights held change; ``listed`` makes an empty list mean "holds none"."""

    type: Literal["weights"] = "weights"
    listed: bool = True
    weights: list[WeightFile] = Field(default_factory=list)


class CommandRefused(_Message):
    """Commands the agent dropped (unsigned, signed for another node, altered, expired or
    replayed): ``count`` of them since its last report, at most one a minute; the task and
    reason are the last one's."""

    type: Literal["command_refused"] = "command_refused"
    task: str = Field(max_length=200)
    reason: str = Field(max_length=2000)
    count: int = Field(default=1, ge=1)


AgentMessage = Annotated[
    Register | Heartbeat | ShardStatus | ShardProgress | Engines | Weights | CommandRefused,
    Field(discriminator="type"),
]
_adapter: TypeAdapter[AgentMessage] = TypeAdapter(AgentMessage)


class MessageError(ValueError):
    """A message that does not fit the protocol, described field by field."""


def parse_message(raw: str | bytes) -> AgentMessage:
    """Validate one message from the link, or raise MessageError saying what is wrong."""
    try:
        return _adapter.validate_json(raw)
    except ValidationError as exc:
        problems = []
        for error in exc.errors()[:5]:
            where = ".".join(str(part) for part in error["loc"]) or "message"
            problems.append(f"{where}: {error['msg']}")
        raise MessageError("; ".join(problems)) from None


def encode(message: BaseModel) -> str:
    return message.model_dump_json()


# Close codes the control plane uses to refuse a link, so the agent can log why.
CLOSE_NOT_LEADER = 4001
CLOSE_UNAUTHENTICATED = 4003
CLOSE_IDENTITY_MISMATCH = 4009
CLOSE_BAD_MESSAGE = 4400
