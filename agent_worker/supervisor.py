"""Run, watch, stop and adopt the engine processes of this node's shards.

The supervisor knows nothing of Celery or the link: tasks call into it, and it reports
every state change through ``on_transition``. Engines outlive it — ``shutdown`` stops
watching and leaves them running, and the next agent's ``adopt_all`` takes them over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from agent_worker.engines.command import LaunchCommand, Listener
from agent_worker.logbuffer import LogBuffer
from agent_worker.supervision.adoption import Verdict, judge
from agent_worker.supervision.gpu_holders import GpuSweep, sweep_gpu_holders
from agent_worker.supervision.health import port_open
from agent_worker.supervision.logtail import LogTail
from agent_worker.supervision.loop import ShardLoop
from agent_worker.supervision.shard import PortWait, RunningShard, ShardRun, ShardTransition
from agent_worker.supervision.statedir import ShardRecord, StateFileError, check_shard_id
from protocol.shard import ShardSpec, ShardState

__all__ = ["LogBuffer", "RunningShard", "ShardTransition", "Supervisor"]

log = logging.getLogger(__name__)

# How long adoption waits for the health checks of what it adopts, run all at once: the
# register waits on adoption, and a node that has not registered within 15 s is unreachable.
ADOPTION_CHECK_WAIT = 3.0


class Supervisor(ShardLoop):
    """Engine processes of this node, by shard id.

    Construct with ``Supervisor(state_dir, log_dir, on_transition)``; the intervals,
    settle period, clock and ``background`` (threads, or ``step()`` by hand) are
    keyword arguments of :class:`ShardLoop`.
    """

    # -- commands ---------------------------------------------------------------------

    def start(
        self,
        spec: ShardSpec,
        commands: list[LaunchCommand],
        serves_http: bool,
        health_path: str = "/health",
        *,
        start_after: Sequence[Listener] = (),
        ready_when_listening: bool = False,
    ) -> ShardState:
        """Launch a shard's commands in order and return its state.

        The first command waits until every port in ``start_after`` accepts connections
        (the other ranks its engine connects to), bounded by the startup timeout. A rank
        that serves no HTTP is ready once alive a while, or with ``ready_when_listening``
        once its own port accepts. A start for a shard that is already known — running,
        failed or stopped — launches nothing and reports where it stands: the broker
        redelivers tasks.
        """
        shard_id = check_shard_id(spec.shard_id)
        if not commands:
            raise ValueError(f"shard {shard_id}: the engine adapter gave no command to run")
        if not health_path.startswith("/"):
            raise ValueError(f"shard {shard_id}: health path {health_path!r} must start with /")
        self._check_open()
        known = self._known(shard_id)
        if known is None and self._state.exists(shard_id):
            return self._refuse_over_unreadable_state(spec)
        if known is None:
            with self._lock:
                known = self._runs.get(shard_id) or self._ended.get(shard_id)
                if known is None:
                    tail = LogTail(self._log_path(shard_id), self.logs, shard_id)
                    run = ShardRun(
                        spec, serves_http, health_path, list(commands), len(commands), tail
                    )
                    run.ready_when_listening = ready_when_listening
                    self._runs[shard_id] = run
        if known is not None:
            return self._answer_again(known, spec)
        with run.lock:
            try:
                self._state.write(run.record())  # the spec is on disk before anything runs
            except OSError as err:
                with self._lock:
                    del self._runs[shard_id]
                raise OSError(f"shard {shard_id}: cannot write its state file: {err}") from err
            listens = serves_http or ready_when_listening
            if listens and port_open(spec.host, spec.port, timeout=0.2):
                self._finish(run, "failed", f"port {spec.port} on {spec.host} is already in use")
            else:
                self._wait_for(run, start_after)
                self._advance_launch(run)
            state = run.state
        self._watch(run)
        self._drain()
        return state

    def _wait_for(self, run: ShardRun, listeners: Sequence[Listener]) -> None:
        # A rank started before the ranks it connects to listen has nothing to connect to.
        timeout = float(run.spec.startup_timeout)
        deadline = self._clock() + timeout
        for listener in listeners:
            host, port = listener.host, listener.port
            run.waiting.append(PortWait(listener.name, host, port, timeout, deadline))
            run.tail.note(f"waiting for {listener.name} on {host}:{port} before starting")

    def stop(self, shard_id: str, grace: float = 10.0) -> None:
        """SIGTERM each process group (the engine first, then sidecars), SIGKILL after grace.

        A stop is always answered with the shard's final state, even for a shard this
        node does not know (``stopped``): the control plane waits for that answer.
        """
        check_shard_id(shard_id)
        run = self._runs.get(shard_id)
        if run is None:
            run = self._known_on_disk(shard_id)
        if run is None or run.finished:
            self._answer_stopped(shard_id)
            return
        with run.lock:
            if run.finished:
                self._answer_stopped(shard_id)
                return
            run.stopping = True
            try:
                self._state.write(run.record())
            except OSError as err:
                log.warning("shard %s: cannot mark its state file as stopping: %s", shard_id, err)
            killed = self._teardown(run, grace)
            reason = "stopped"
            if killed:
                reason += f"; {', '.join(killed)} ignored SIGTERM for {grace:g}s and got SIGKILL"
            self._finish(run, "stopped", reason, teardown=False)
        self._drain()

    def _answer_stopped(self, shard_id: str) -> None:
        with self._lock:
            ended = self._ended.get(shard_id)
            if ended is None:  # remembered, so a start redelivered after this is ignored
                seq = self._sequence.next()
                ended = ShardTransition(
                    shard_id, "", "stopped", "not running on this node", seq=seq
                )
                self._remember(ended)
        self._queue(ended)
        self._drain()

    def adopt_all(self, check_within: float = ADOPTION_CHECK_WAIT) -> list[RunningShard]:
        """Take over every engine a previous agent left running; call once at agent start.

        An engine that answers its health check within ``check_within`` seconds (all are
        checked at once) is adopted ``ready``; the others ``starting``, and their health
        checks go on in the background. Shards whose processes are gone are reported once
        and forgotten; unreadable state files are left in place and listed in ``problems``.
        """
        self._check_open()
        records = []
        for path in self._state.files():
            if path.name.removesuffix(".json") not in self._runs:
                record = self._read_state_file(path)
                if record is not None:
                    records.append(record)
        judged = [(record, judge(record)) for record in records]
        answers = self._answers_at_adoption_together(judged, check_within)
        adopted = []
        for (record, verdict), answered in zip(judged, answers, strict=True):
            run = self._adopt(record, verdict, answered)
            if run is not None and run.doomed is None:
                adopted.append(run.snapshot())
        self._drain()
        return adopted

    def kill_unidentified_gpu_processes(
        self, gpu_pids: Iterable[int], grace: float = 5.0
    ) -> GpuSweep:
        """Kill the engine user's engines holding GPUs no shard here accounts for; report the rest.

        A process holding GPUs that nothing can describe is worse than none: placement
        hands those GPUs out again. Call after ``adopt_all``. Who is killed and who is
        only reported is :func:`sweep_gpu_holders`'s to say.
        """
        ours = [proc for run in self._live_runs() for proc in run.processes]
        pgids, leaders = {proc.pgid for proc in ours}, {proc.pid for proc in ours}
        user = self._engine_user
        return sweep_gpu_holders(gpu_pids, pgids, leaders, grace, user.uid if user else None)

    # -- what is running --------------------------------------------------------------

    def running(self) -> list[RunningShard]:
        """Every live shard, for the register message."""
        runs = sorted(self._live_runs(), key=lambda run: run.shard_id)
        return [run.snapshot() for run in runs if not run.finished and run.doomed is None]

    def pids(self) -> dict[str, int]:
        """The engine's process group of every live shard, for usage sampling."""
        pgids = {run.shard_id: run.engine_pgid() for run in self._live_runs()}
        return {shard_id: pgid for shard_id, pgid in pgids.items() if pgid is not None}

    def state_of(self, shard_id: str) -> ShardState | None:
        known = self._known(shard_id)
        if isinstance(known, ShardRun):
            return known.state
        return None if known is None else known.state

    @property
    def problems(self) -> list[str]:
        """State files that could not be read, in words fit to send to the control plane."""
        with self._lock:
            return list(self._problems)

    # -- the loop ---------------------------------------------------------------------

    def _read_state_file(self, path: Path) -> ShardRecord | None:
        try:
            return self._state.read(path)
        except StateFileError as err:
            log.error("%s", err)
            with self._lock:
                if str(err) not in self._problems:
                    self._problems.append(str(err))
            return None

    def _adopt_file(self, path: Path) -> ShardRun | None:
        record = self._read_state_file(path)
        return None if record is None else self._adopt(record)

    def _adopt(
        self, record: ShardRecord, verdict: Verdict | None = None, answered: str | None = None
    ) -> ShardRun | None:
        spec = record.spec
        verdict = verdict or judge(record)
        tail = LogTail(self._log_path(spec.shard_id), self.logs, spec.shard_id)
        run = ShardRun(
            spec, record.serves_http, record.health_path, [], record.commands, tail, verdict.live
        )
        run.ready_when_listening = record.ready_when_listening
        run.seq = self._sequence.next()
        # Health-checked before anyone hears of it: a ready engine reported as starting
        # would leave every router until the next check, so an agent restart would be an
        # outage of what it serves.
        if answered is None:
            answered = self._answers_at_adoption(spec, record, verdict) if verdict.adoptable else ""
        run.state = "ready" if answered else "starting"
        with self._lock:
            if spec.shard_id in self._runs:
                return None
            self._runs[spec.shard_id] = run
        with run.lock:
            if verdict.ending is not None:
                run.doomed = verdict.ending
                if not verdict.live:  # nothing to tear down: settle it now
                    self._step_run(run)
                    return run
            else:
                pids = ", ".join(str(proc.pid) for proc in run.processes)
                run.tail.note(f"adopted pid {pids}; earlier output is in {tail.path}")
                run.alive_since = run.next_health_at = self._clock()
                adopted = f"adopted pid {run.latest_pid()} after an agent restart"
                if answered:
                    log.info("shard %s ready: %s; %s", run.shard_id, adopted, answered)
                self._queue(run.report(f"{adopted}; {answered}" if answered else adopted))
        self._watch(run)
        return run

    def _answers_at_adoption_together(
        self, judged: list[tuple[ShardRecord, Verdict]], within: float
    ) -> list[str]:
        """``_answers_at_adoption`` for each shard, checked all at once; "" for those that
        cannot be adopted or did not answer within ``within`` seconds."""
        answers: dict[int, str] = {}

        def check(index: int, record: ShardRecord, verdict: Verdict) -> None:
            try:
                answers[index] = self._answers_at_adoption(record.spec, record, verdict)
            except Exception:  # its health checks decide, as for one that did not answer
                log.exception("checking adopted shard %s", record.spec.shard_id)

        # Daemon threads: a check still hanging when the wait ends is left to its timeout.
        checks = [
            threading.Thread(
                target=check,
                args=(index, record, verdict),
                daemon=True,
                name=f"adopt-{record.spec.shard_id}",
            )
            for index, (record, verdict) in enumerate(judged)
            if verdict.adoptable
        ]
        for thread in checks:
            thread.start()
        deadline = time.monotonic() + within
        for thread in checks:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [answers.get(index, "") for index in range(len(judged))]

    def _answers_at_adoption(self, spec: ShardSpec, record: ShardRecord, verdict: Verdict) -> str:
        """Why an adopted shard is ready now, or "" when its health checks must decide."""
        if record.ready_when_listening:
            return self._listening(spec)
        if not record.serves_http:
            started = max(proc.record.create_time for proc in verdict.live)
            alive = time.time() - started
            return (
                f"alive for {alive:.0f}s (a worker rank serves no HTTP)"
                if alive >= self._settle
                else ""
            )
        ready, said = self._probe.check(spec.host, spec.port, record.health_path, spec.api_key)
        return said if ready else ""

    def _known(self, shard_id: str) -> ShardRun | ShardTransition | None:
        with self._lock:
            found: ShardRun | ShardTransition | None = self._runs.get(shard_id)
            if found is None:
                found = self._ended.get(shard_id)
        if found is None:
            found = self._known_on_disk(shard_id)
        return found

    def _known_on_disk(self, shard_id: str) -> ShardRun | None:
        # A command can arrive before adopt_all ran; the state file is still the truth.
        path = self._state.file_for(shard_id)
        return self._adopt_file(path) if path.exists() else None

    def _refuse_over_unreadable_state(self, spec: ShardSpec) -> ShardState:
        # Its engine may still run; writing over the only description of it would orphan it.
        path = self._state.file_for(spec.shard_id)
        reason = f"state file {path} exists but cannot be read; remove it to start this shard"
        self._queue(
            ShardTransition(
                spec.shard_id,
                spec.replica_id,
                "failed",
                reason,
                fingerprint=spec.fingerprint,
                seq=self._sequence.next(),
            )  # fmt: skip
        )
        self._drain()
        return "failed"

    def _answer_again(self, known: ShardRun | ShardTransition, spec: ShardSpec) -> ShardState:
        if isinstance(known, ShardRun):
            with known.lock:
                if not known.finished:
                    self._queue(known.report(f"start ignored: the shard is already {known.state}"))
                    state = known.state
                else:
                    ended = self._ended.get(spec.shard_id)
                    state = known.state if ended is None else ended.state
                    if ended is not None:
                        self._queue(ended)
        else:
            filled = replace(
                known,
                replica_id=known.replica_id or spec.replica_id,
                fingerprint=known.fingerprint or spec.fingerprint,
            )
            state = filled.state
            self._queue(filled)
        self._drain()
        return state
