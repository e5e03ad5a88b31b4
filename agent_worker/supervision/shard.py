"""What the supervisor knows about one shard, and what it tells the rest of the agent."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from agent_worker.engines.command import LaunchCommand
from agent_worker.supervision.logtail import LogTail
from agent_worker.supervision.process import ShardProcess
from agent_worker.supervision.statedir import ShardRecord
from protocol.shard import ShardSpec, ShardState

FINAL_STATES: frozenset[ShardState] = frozenset({"failed", "stopped"})
# Room for 2**32 statuses per agent generation before the next generation's numbers.
GENERATION_SHIFT = 32


class StatusSequence:
    """Numbers every shard status this node sends: strictly growing, across agent restarts."""

    def __init__(self, generation: int = 0) -> None:
        self._next = (generation << GENERATION_SHIFT) + 1
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            value, self._next = self._next, self._next + 1
            return value


@dataclass(frozen=True)
class ShardTransition:
    """A shard changed state (or a redelivered command asked and this is where it stands)."""

    shard_id: str
    replica_id: str
    state: ShardState
    reason: str = ""
    output_tail: list[str] = field(default_factory=list)
    pid: int | None = None
    fingerprint: str = ""
    exit_code: int | None = None
    seq: int = 0  # the StatusSequence number of this state


@dataclass(frozen=True)
class RunningShard:
    """A live shard as the register message reports it."""

    spec: ShardSpec
    state: ShardState
    pid: int | None  # the engine's, i.e. the last command's once it has started
    pgids: list[int]  # every process group of the shard, sidecars first
    adopted: bool
    log_path: Path
    detail: str = ""  # the last health answer, e.g. "GET /health answered 503 Loading model"
    seq: int = 0


@dataclass
class PortWait:
    """A command that must be listening before the next one starts."""

    name: str
    host: str
    port: int
    timeout: float
    deadline: float


class ShardRun:
    """The supervisor's mutable record of one shard; guard every change with ``lock``."""

    def __init__(
        self,
        spec: ShardSpec,
        serves_http: bool,
        health_path: str,
        commands: list[LaunchCommand],
        command_count: int,
        tail: LogTail,
        processes: list[ShardProcess] | None = None,
    ) -> None:
        self.spec = spec
        self.serves_http = serves_http
        self.health_path = health_path
        self.commands = commands  # empty for an adopted shard: nothing is left to launch
        self.command_count = command_count
        self.tail = tail
        self.processes: list[ShardProcess] = processes or []
        self.lock = threading.RLock()
        self.state: ShardState = "pending"
        self.seq = 0  # of the state; written before the state, read after it (snapshot)
        self.detail = ""
        self.launching = bool(commands)
        self.waiting: list[PortWait] = []  # in order; the next command starts when empty
        self.ready_when_listening = False  # a worker rank ready once its port accepts
        self.alive_since: float | None = None
        self.next_health_at = 0.0
        self.stopping = False
        self.finished = False
        # An adopted shard found broken: (final state, reason), settled by the next step.
        self.doomed: tuple[ShardState, str] | None = None
        self.thread: threading.Thread | None = None

    @property
    def shard_id(self) -> str:
        return self.spec.shard_id

    @property
    def adopted(self) -> bool:
        return not self.commands

    def latest_pid(self) -> int | None:
        return self.processes[-1].pid if self.processes else None

    def engine_pgid(self) -> int | None:
        return self.processes[-1].pgid if self.processes else None

    def role(self, index: int) -> str:
        return "" if index == self.command_count - 1 else "sidecar "

    def record(self) -> ShardRecord:
        return ShardRecord(
            spec=self.spec,
            serves_http=self.serves_http,
            ready_when_listening=self.ready_when_listening,
            health_path=self.health_path,
            commands=self.command_count,
            processes=[proc.record for proc in self.processes],
            stopping=self.stopping,
        )

    def transition(
        self,
        state: ShardState,
        reason: str,
        output_tail: list[str] | None = None,
        exit_code: int | None = None,
        *,
        seq: int,
    ) -> ShardTransition:
        # seq first: a snapshot that sees the new state must not pair it with the old seq.
        self.seq = seq
        self.state = state
        return self.report(reason, output_tail, exit_code)

    def report(
        self, reason: str, output_tail: list[str] | None = None, exit_code: int | None = None
    ) -> ShardTransition:
        return ShardTransition(
            shard_id=self.shard_id,
            replica_id=self.spec.replica_id,
            state=self.state,
            reason=reason,
            output_tail=list(output_tail or []),
            pid=self.latest_pid(),
            fingerprint=self.spec.fingerprint,
            exit_code=exit_code,
            seq=self.seq,
        )

    def snapshot(self) -> RunningShard:
        # Read without the lock: running() must not wait out a health check in progress.
        processes = list(self.processes)
        state = self.state
        return RunningShard(
            spec=self.spec,
            state=state,
            seq=self.seq,
            pid=processes[-1].pid if processes else None,
            pgids=[proc.pgid for proc in processes],
            adopted=self.adopted,
            log_path=self.tail.path,
            detail=self.detail,
        )
