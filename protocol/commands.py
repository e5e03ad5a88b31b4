"""Commands down to a node: Celery task names and their typed arguments (DESIGN.md, "The
link"). The control plane builds one of these and sends ``task`` with ``args()``; the
agent's task of that name takes the same positional arguments. Signatures are computed
over exactly those arguments, so a command's wire form is a list, never re-encoded.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from protocol.engines import WantedEngine
from protocol.shard import ShardSpec

START_SHARD = "agent.start_shard"
STOP_SHARD = "agent.stop_shard"
READ_LOGS = "agent.read_logs"
ENGINE_CHECK = "agent.engine_check"
COLLECT_WEIGHTS = "agent.collect_weights"
CONVERGE_ENGINES = "agent.converge_engines"
DRAIN = "agent.drain"
FETCH_WEIGHTS = "agent.fetch_weights"
LEADER_EPOCH = "agent.leader_epoch"
ENGINE_CALLERS = "agent.engine_callers"

# The last lines an agent keeps of each log source, so the most a read may ask for.
LOG_LINES_KEPT = 2000

# Where a node's commands live on the broker, named here because both ends must agree and
# a node's broker user (``fleet.pki.broker_users``) may touch these keys and no others.
# kombu's Redis transport keeps a queue as a list of that name (and one per priority step,
# the name, "\x06\x16" and the step), its bindings in ``_kombu.binding.<exchange>``, and
# messages taken but not acknowledged in the unacked hash, index and mutex, which default
# to keys every consumer shares; each node gets its own. Results (request/reply commands)
# go to ``celery-task-meta-<task id>``, key and channel, so a command's task id starts
# with its node's queue and a character no hostname holds.
KOMBU_PRIORITY_SEPARATOR = "\x06\x16"
RESULT_PREFIX = "celery-task-meta-"


def node_queue(node_id: str) -> str:
    return f"node-{node_id}"


def command_task_id(node_id: str, command_id: str) -> str:
    """The Celery task id of command ``command_id`` to ``node_id``."""
    return f"{node_queue(node_id)}:{command_id}"


def unacked_keys(node_id: str) -> dict[str, str]:
    """kombu's transport options naming the node's own unacknowledged-message keys."""
    queue = node_queue(node_id)
    return {
        "unacked_key": f"{queue}:unacked",
        "unacked_index_key": f"{queue}:unacked_index",
        "unacked_mutex_key": f"{queue}:unacked_mutex",
    }


def node_broker_keys(node_id: str) -> list[str]:
    """Every key a node's agent uses on the broker: exact names, and glob patterns (``?``,
    ``*``) that only its own keys match (a node id is a hostname: no glob character)."""
    queue = node_queue(node_id)
    return [
        queue,
        f"{queue}{KOMBU_PRIORITY_SEPARATOR}?",
        f"_kombu.binding.{queue}",
        f"_kombu.binding_permanent.{queue}",
        *unacked_keys(node_id).values(),
        f"{RESULT_PREFIX}{command_task_id(node_id, '*')}",
    ]


def node_result_channels(node_id: str) -> list[str]:
    """The pub/sub channels a node's agent publishes its results on (Celery's Redis result
    backend announces each stored result on a channel named as its key)."""
    return [f"{RESULT_PREFIX}{command_task_id(node_id, '*')}"]


class NodeCommand(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    task: ClassVar[str]

    def args(self) -> list[Any]:
        """The task's positional arguments, in the order the agent's task takes them."""
        return [getattr(self, name) for name in type(self).model_fields]


class StartShard(NodeCommand):
    task: ClassVar[str] = START_SHARD
    spec: ShardSpec

    def args(self) -> list[Any]:
        return [self.spec.model_dump_json()]


class StopShard(NodeCommand):
    """Fenced by the leader epoch it was sent under: a deposed leader's stop is refused."""

    task: ClassVar[str] = STOP_SHARD
    shard_id: str
    epoch: int = 0


class AnnounceEpoch(NodeCommand):
    """A new leader's epoch, told to every node as it takes the lease, so that a command
    the deposed leader still sends is refused even by a node the new one never commanded."""

    task: ClassVar[str] = LEADER_EPOCH
    epoch: int


class ReadLogs(NodeCommand):
    task: ClassVar[str] = READ_LOGS
    source: str = "agent"
    lines: int = Field(default=200, ge=1, le=LOG_LINES_KEPT)


class EngineCheck(NodeCommand):
    """Run ``ENGINE --version``: the one place an engine is run on purpose."""

    task: ClassVar[str] = ENGINE_CHECK
    engine: str


class CollectWeights(NodeCommand):
    """Delete fetched weights that no source in ``keep`` (nor any shard there) uses."""

    task: ClassVar[str] = COLLECT_WEIGHTS
    keep: list[str]


class ConvergeEngines(NodeCommand):
    """Have exactly these engine versions: install what is missing, remove what llmgw
    installed and nothing wants any more (and no shard runs on)."""

    task: ClassVar[str] = CONVERGE_ENGINES
    engines: list[WantedEngine]

    def args(self) -> list[Any]:
        return [[engine.model_dump(mode="json") for engine in self.engines]]


class Drain(NodeCommand):
    """Take no new shards (``draining``), or take them again; running shards stay."""

    task: ClassVar[str] = DRAIN
    draining: bool = True


class EngineCallers(NodeCommand):
    """The addresses (or networks) of the routers and control planes: the only sources
    besides loopback that this node's walls admit on its engines' HTTP ports."""

    task: ClassVar[str] = ENGINE_CALLERS
    addresses: list[str]


class FetchWeights(NodeCommand):
    """Fetch a model's weights ahead of need, with the fetcher shards use."""

    task: ClassVar[str] = FETCH_WEIGHTS
    source: str
    sha256: str = ""
