"""The supervisor's loop: one round of work per shard per call, and how a shard ends.

``Supervisor`` (``agent_worker.supervisor``) adds the commands on top. In the agent each
shard gets a thread that calls the round every ``poll_interval``; tests call ``step()``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path

from agent_worker.logbuffer import LogBuffer
from agent_worker.supervision.engine_user import EngineUser
from agent_worker.supervision.health import HealthProbe, port_open
from agent_worker.supervision.logrotate import rotate_if_large
from agent_worker.supervision.logtail import read_log_lines
from agent_worker.supervision.process import ShardProcess
from agent_worker.supervision.shard import PortWait, ShardRun, ShardTransition, StatusSequence
from agent_worker.supervision.shard_files import SHARED_FILES, ShardFiles
from agent_worker.supervision.statedir import StateDir, check_shard_id
from protocol.shard import ShardSpec, ShardState

log = logging.getLogger("agent_worker.supervisor")

OUTPUT_TAIL_LINES = 40
# Finished shards are remembered so a redelivered start_shard is answered, not obeyed.
_REMEMBERED = 4096


class ShardLoop:
    """Watch shards: launch in order, check health, notice exits, report transitions."""

    def __init__(
        self,
        state_dir: Path,
        log_dir: Path,
        on_transition: Callable[[ShardTransition], None],
        *,
        logs: LogBuffer | None = None,
        # A starting engine is asked for /health this often: at 2 s the wait between its
        # loading the model and being found ready cost a first `make run` 1 s on average.
        health_interval: float = 1.0,
        health_timeout: float = 2.0,
        poll_interval: float = 0.5,
        settle: float = 10.0,
        teardown_grace: float = 5.0,
        background: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sequence: StatusSequence | None = None,
        files_dir: Path | None = None,
        engine_user: EngineUser | None = None,
    ) -> None:
        self.logs = logs if logs is not None else LogBuffer()
        self._state = StateDir(state_dir)
        # Who engines run as (None: the agent's own user), and each shard's own directory,
        # for the secrets it reads: beside the state files, or where the engine user reaches.
        self._engine_user = engine_user
        if files_dir is None:
            shared = engine_user is not None
            files_dir = SHARED_FILES if shared else Path(state_dir).parent / "shard-files"
        self._files = ShardFiles(files_dir, shared=engine_user is not None)
        self._log_dir = Path(log_dir)
        self._log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._on_transition = on_transition
        self._health_interval = health_interval
        self._poll_interval = poll_interval
        self._settle = settle
        self._teardown_grace = teardown_grace
        self._background = background
        self._clock = clock
        self._sequence = sequence or StatusSequence()
        self._probe = HealthProbe(health_timeout)
        self._lock = threading.Lock()  # guards _runs, _ended, _problems; taken after run.lock
        self._runs: dict[str, ShardRun] = {}
        self._ended: OrderedDict[str, ShardTransition] = OrderedDict()
        self._problems: list[str] = []
        self._outbox: deque[ShardTransition] = deque()
        self._emit_lock = threading.RLock()
        self._closing = threading.Event()

    def step(self) -> bool:
        """Do one round of supervision over every shard; say whether anything happened."""
        did = False
        for run in self._live_runs():
            did = self._step_run(run) or did
        self._drain()
        return did

    def rotate_logs(self, max_bytes: int, keep: int) -> list[str]:
        """Rotate the log of every live shard that grew past ``max_bytes``; name those rotated.

        Copy and truncate (``logrotate``): the engine keeps its descriptor, and its tail
        picks up what the rotation took before it was read.
        """
        rotated = []
        for run in self._live_runs():
            if rotate_if_large(run.tail.path, max_bytes, keep):
                rotated.append(run.shard_id)
        return rotated

    def read_log(self, shard_id: str, lines: int, keep: int) -> list[str] | None:
        """The last lines of a shard's log files; None when there is no such file here."""
        try:
            path = self._log_path(shard_id)
        except ValueError:  # not a shard id: nothing on disk is named by it
            return None
        if not path.exists():
            return None
        return read_log_lines(path, lines, keep)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop watching. Engines keep running for the next agent to adopt."""
        self._closing.set()
        deadline = time.monotonic() + timeout
        for run in self._live_runs():
            if run.thread is not None and run.thread is not threading.current_thread():
                run.thread.join(max(0.0, deadline - time.monotonic()))
        self._probe.close()

    def _step_run(self, run: ShardRun) -> bool:
        with run.lock:
            if run.finished:
                return False
            did = run.tail.pump()
            if run.doomed is not None:
                state, reason = run.doomed
                self._finish(run, state, reason)
                return True
            for index, proc in enumerate(run.processes):
                ended = proc.poll()
                if ended is not None:
                    reason = f"{run.role(index)}{proc.name} (pid {proc.pid}) {ended.describe()}"
                    self._finish(run, "failed", reason, exit_code=ended.code)
                    return True
            if run.launching:
                return self._advance_launch(run) or did
            if run.state == "starting":
                return self._check_ready(run) or did
            return did

    def _advance_launch(self, run: ShardRun) -> bool:
        """Start the next commands, stopping at one whose port is not listening yet."""
        did = False
        while True:
            if run.waiting:
                wait = run.waiting[0]
                left = wait.deadline - self._clock()
                if port_open(wait.host, wait.port, timeout=min(0.5, max(left, 0.05))):
                    run.waiting.pop(0)
                    run.tail.note(f"{wait.name}: {wait.host}:{wait.port} accepts connections")
                    continue
                if self._clock() < wait.deadline:
                    return did
                reason = (
                    f"{wait.name}: nothing accepted connections on {wait.host}:{wait.port} "
                    f"within {wait.timeout:g}s"
                )
                self._finish(run, "failed", reason)
                return True
            if len(run.processes) == len(run.commands):
                run.launching = False
                run.alive_since = run.next_health_at = self._clock()
                return True
            command = run.commands[len(run.processes)]
            try:
                user = self._engine_user
                group = user.shard_gid(run.shard_id) if user is not None else None
                flags = self._files.write_secrets(run.shard_id, command.secret_files, group)
                proc = ShardProcess.launch(command, run.tail.path, flags, user, group)
            except OSError as err:
                name = command.name or (command.argv[0] if command.argv else "?")
                self._finish(run, "failed", f"could not start {name}: {err}")
                return True
            run.processes.append(proc)
            did = True
            try:
                self._state.write(run.record())
            except OSError as err:
                # An engine no state file describes would be killed as unidentified later.
                self._finish(run, "failed", f"cannot record pid {proc.pid} in its state: {err}")
                return True
            run.tail.note(f"started {proc.name} (pid {proc.pid})")
            if run.state == "pending":
                started = f"started {proc.name} (pid {proc.pid})"
                self._queue(run.transition("starting", started, seq=self._sequence.next()))
            if command.wait_for_port is not None:
                host, port = command.wait_for_port
                timeout = command.wait_timeout
                deadline = self._clock() + timeout
                run.waiting.append(PortWait(proc.name, host, port, timeout, deadline))

    def _check_ready(self, run: ShardRun) -> bool:
        now = self._clock()
        if run.ready_when_listening:
            if now < run.next_health_at:
                return False
            run.next_health_at = now + self._health_interval
            said = self._listening(run.spec)
            if said:
                self._become_ready(run, said)
            return bool(said)
        if not run.serves_http:
            assert run.alive_since is not None
            if now - run.alive_since < self._settle:
                return False
            self._become_ready(run, f"alive for {self._settle:g}s (a worker rank serves no HTTP)")
            return True
        if now < run.next_health_at:
            return False
        run.next_health_at = now + self._health_interval
        spec = run.spec
        ready, run.detail = self._probe.check(spec.host, spec.port, run.health_path, spec.api_key)
        if ready:
            self._become_ready(run, run.detail)
        return ready

    def _listening(self, spec: ShardSpec) -> str:
        """Why a worker rank that listens is ready, or "" while its port does not accept."""
        if port_open(spec.host, spec.port, timeout=1.0):
            return f"accepts connections on {spec.host}:{spec.port} (a worker rank)"
        return ""

    def _become_ready(self, run: ShardRun, reason: str) -> None:
        # An engine may retitle itself while it loads; record what adoption will see.
        if any([proc.refresh_cmdline() for proc in run.processes]):
            try:
                self._state.write(run.record())
            except OSError as err:
                log.warning("shard %s: cannot update its state file: %s", run.shard_id, err)
        log.info("shard %s ready: %s", run.shard_id, reason)
        self._queue(run.transition("ready", reason, seq=self._sequence.next()))

    def _teardown(self, run: ShardRun, grace: float) -> list[str]:
        """Stop every group of the shard, the engine first; name those that needed SIGKILL."""
        killed = []
        for proc in reversed(run.processes):
            if proc.terminate(grace):
                killed.append(f"{proc.name} (pid {proc.pid})")
        return killed

    def _finish(
        self,
        run: ShardRun,
        state: ShardState,
        reason: str,
        exit_code: int | None = None,
        teardown: bool = True,
    ) -> None:
        """End a shard: tear down what is left, forget its state file, report it once."""
        run.tail.flush()
        output = self.logs.read(run.shard_id, OUTPUT_TAIL_LINES) if state == "failed" else []
        if teardown:
            self._teardown(run, self._teardown_grace)
        run.finished = True
        transition = run.transition(state, reason, output, exit_code, seq=self._sequence.next())
        self._state.remove(run.shard_id)
        self._files.remove(run.shard_id)
        with self._lock:
            self._runs.pop(run.shard_id, None)
            self._remember(transition)
        run.tail.note(f"{state}: {reason}")
        run.tail.flush()
        level = logging.WARNING if state == "failed" else logging.INFO
        log.log(level, "shard %s %s: %s", run.shard_id, state, reason)
        self._queue(transition)

    def _live_runs(self) -> list[ShardRun]:
        with self._lock:
            return list(self._runs.values())

    def _remember(self, transition: ShardTransition) -> None:
        self._ended[transition.shard_id] = transition
        while len(self._ended) > _REMEMBERED:
            self._ended.popitem(last=False)

    def _watch(self, run: ShardRun) -> None:
        if not self._background or run.finished:
            return
        run.thread = threading.Thread(
            target=self._watch_loop, args=(run,), name=f"shard-{run.shard_id}", daemon=True
        )
        run.thread.start()

    def _watch_loop(self, run: ShardRun) -> None:
        while not self._closing.is_set() and not run.finished:
            try:
                self._step_run(run)
            except Exception:  # a bug in one step must not leave the shard unwatched
                log.exception("supervising shard %s", run.shard_id)
            self._drain()
            self._closing.wait(self._poll_interval)

    def _queue(self, transition: ShardTransition) -> None:
        # Queued under the shard's lock, so one shard's transitions leave in order.
        self._outbox.append(transition)

    def _drain(self) -> None:
        with self._emit_lock:
            while self._outbox:
                transition = self._outbox.popleft()
                try:
                    self._on_transition(transition)
                except Exception:
                    log.exception("reporting %s %s", transition.shard_id, transition.state)

    def _log_path(self, shard_id: str) -> Path:
        return self._log_dir / f"{check_shard_id(shard_id)}.log"

    def _check_open(self) -> None:
        if self._closing.is_set():
            raise RuntimeError("the supervisor has been shut down")
