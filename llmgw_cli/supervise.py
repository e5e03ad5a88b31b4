"""What ``llmgw up`` does when one of its processes dies: restart it, with backoff.

A child that exits is started again after 1 s, then 2, 4 … up to 30 s between tries;
a child that stayed up a minute starts the count again. One that keeps dying right
after it starts (5 times within a minute) is reported with its last output lines and
left down, so the rest keeps serving instead of the whole machine flapping with it.

Nothing here stops an engine: engines belong to the agent, and outlive it on purpose.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from agent_worker.supervision.logrotate import last_lines, rotate_if_large
from core.files import size_or_zero

# How many output lines a child that is given up on is reported with, read across this
# many rotated files at most.
LAST_LINES = 20
LOG_KEEP_READ = 2
# How often log files are checked against LLMGW_LOG_MAX_BYTES.
ROTATE_EVERY = 10.0


@dataclass(frozen=True)
class RestartPolicy:
    first_delay: float = 1.0
    max_delay: float = 30.0
    # A child up this long had recovered: its next failure starts from first_delay.
    reset_after: float = 60.0
    give_up_after: int = 5
    give_up_window: float = 60.0


class Child:
    """One process ``llmgw up`` keeps running: how to start it and how to tell it died."""

    name: str
    log_path: Path

    def start(self) -> None:
        raise NotImplementedError

    def exit_reason(self) -> str | None:
        """Why the child is not running (``exited with code 1``), or None while it runs."""
        raise NotImplementedError

    def pid(self) -> int | None:
        raise NotImplementedError

    def stop(self, grace: float) -> None:
        raise NotImplementedError


class ProcessChild(Child):
    """A command run in its own process group, its output appended to a log file."""

    def __init__(
        self, name: str, argv: list[str], log_path: Path, env: dict[str, str], cwd: Path,
        pass_fds: tuple[int, ...] = (),
    ) -> None:  # fmt: skip
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        # Descriptors the child inherits, each start (the control plane's listening socket).
        self.pass_fds = pass_fds
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        # The child writes to the file itself: if `llmgw up` dies, nothing it runs is left
        # writing into a pipe that nobody reads.
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # Own process group: a terminal's Ctrl-C reaches `llmgw up` alone, which stops
            # the children in order; and a dead child's leftovers can be killed as a group.
            self.process = subprocess.Popen(
                self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=fd,
                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=self.pass_fds,
            )  # fmt: skip
        finally:
            os.close(fd)

    def exit_reason(self) -> str | None:
        if self.process is None:
            return "not started"
        code = self.process.poll()
        if code is None:
            return None
        # Whatever the dead child left behind in its group (Celery's embedded beat, a
        # pool worker) must not run beside its replacement. Engines have sessions of their own.
        signal_group(self.process.pid, signal.SIGKILL)
        return describe_exit(code)

    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def stop(self, grace: float) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        signal_group(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            print(f"{self.name} did not stop in {grace:.0f}s; killing it", flush=True)
        signal_group(self.process.pid, signal.SIGKILL)
        self.process.wait()


class ServiceChild(Child):
    """A server that daemonizes itself (the embedded PostgreSQL and Redis): watched by pid."""

    def __init__(
        self, name: str, start: Callable[[], None], read_pid: Callable[[], int | None],
        stop: Callable[[], None], log_path: Path,
    ) -> None:  # fmt: skip
        self.name = name
        self._start = start
        self._read_pid = read_pid
        self._stop = stop
        self.log_path = log_path

    def start(self) -> None:
        self._start()

    def exit_reason(self) -> str | None:
        pid = self._read_pid()
        if pid is None:
            return "not running (no pid file)"
        return None if pid_alive(pid) else f"not running (pid {pid} is gone)"

    def pid(self) -> int | None:
        return self._read_pid()

    def stop(self, grace: float) -> None:
        self._stop()


@dataclass
class Supervised:
    """A child and its restart bookkeeping."""

    child: Child
    policy: RestartPolicy
    started_at: float = 0.0
    restart_at: float | None = None  # when a dead child is due to start again
    delay: float = 0.0
    failures: deque[float] = field(default_factory=deque)
    given_up: bool = False
    restarts: int = 0

    @property
    def name(self) -> str:
        return self.child.name


class ChildSupervisor:
    """Start children in order, restart the ones that die, stop them all in reverse."""

    def __init__(
        self, children: list[Child], policy: RestartPolicy | None = None,
        on_change: Callable[[], None] | None = None, clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] | None = None, owner: str = "llmgw up",
    ) -> None:  # fmt: skip
        self.policy = policy or RestartPolicy()
        self.owner = owner
        self.entries = [Supervised(child, self.policy) for child in children]
        self.on_change = on_change or (lambda: None)
        self.clock = clock
        self.say = say or (lambda line: print(line, flush=True))

    def start_all(self) -> None:
        for entry in self.entries:
            if self._start(entry):
                self.say(f"started {entry.name} (pid {entry.child.pid()})")
        self.on_change()

    def check(self) -> bool:
        """Notice deaths and start what is due; True when any child changed."""
        changed = False
        now = self.clock()
        for entry in self.entries:
            if entry.given_up:
                continue
            if entry.restart_at is not None:
                if now >= entry.restart_at:
                    entry.restart_at = None
                    entry.restarts += 1
                    if self._start(entry):
                        self.say(f"restarted {entry.name} (pid {entry.child.pid()})")
                    changed = True
                continue
            reason = entry.child.exit_reason()
            if reason is not None:
                self._died(entry, reason, now)
                changed = True
        if changed:
            self.on_change()
        return changed

    def _start(self, entry: Supervised) -> bool:
        entry.started_at = self.clock()
        try:
            entry.child.start()
        except Exception as exc:  # a start that raises is a failure like an exit
            self._died(entry, f"failed to start ({exc})", self.clock())
            return False
        return True

    def _died(self, entry: Supervised, reason: str, now: float) -> None:
        policy = self.policy
        if now - entry.started_at >= policy.reset_after:
            entry.delay = 0.0
        entry.failures.append(now)
        while entry.failures and now - entry.failures[0] > policy.give_up_window:
            entry.failures.popleft()
        if len(entry.failures) >= policy.give_up_after:
            entry.given_up = True
            entry.restart_at = None
            last = last_lines(entry.child.log_path, LAST_LINES, keep=LOG_KEEP_READ)
            self.say(
                f"{entry.name} {reason}; it failed {len(entry.failures)} times within "
                f"{policy.give_up_window:.0f}s, so it stays down while the rest keeps serving "
                f"(fix it, then restart {self.owner}). Its last output ({entry.child.log_path}):\n"
                + "".join(f"  | {line}\n" for line in last)
            )
            return
        entry.delay = (
            policy.first_delay if entry.delay == 0 else min(policy.max_delay, entry.delay * 2)
        )
        entry.restart_at = now + entry.delay
        self.say(f"{entry.name} {reason}; restarting it in {entry.delay:g}s")

    def stop_all(self, grace: float, which: Callable[[Child], bool] = lambda _c: True) -> None:
        """Stop children, last started first (the agent before the control plane)."""
        for entry in reversed(self.entries):
            if which(entry.child) and entry.restart_at is None and not entry.given_up:
                entry.child.stop(grace)

    def pids(self) -> dict[str, int | None]:
        """Each child's pid while it runs; None while it waits for a restart or is given up."""
        return {
            entry.name: None
            if entry.given_up or entry.restart_at is not None
            else entry.child.pid()
            for entry in self.entries
        }


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (dead, not yet reaped) does not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def rotate_logs(children: list[Child], max_bytes: int, keep: int) -> None:
    """Keep each child's log file in bounds (copy, then truncate: the child holds it open)."""
    for child in children:
        try:
            rotate_if_large(child.log_path, max_bytes, keep)
        except OSError as exc:
            print(f"could not rotate {child.log_path}: {exc}", flush=True)


class LogEcho:
    """Copy what the children append to their log files onto this terminal, prefixed."""

    def __init__(self, paths: list[Path], out: Callable[[str], None] | None = None) -> None:
        self.out = out or (lambda text: print(text, end="", flush=True))
        # What earlier runs left in the files is not news.
        self.offsets = {path: size_or_zero(path) for path in paths}
        self.partial: dict[Path, bytes] = {}

    def pump(self) -> None:
        for path, offset in self.offsets.items():
            size = size_or_zero(path)
            if size < offset:  # truncated by rotation: the new content starts at 0
                offset = 0
            if size == offset:
                continue
            try:
                with path.open("rb") as file:
                    file.seek(offset)
                    chunk = file.read()
            except OSError:
                continue
            self.offsets[path] = offset + len(chunk)
            lines = (self.partial.pop(path, b"") + chunk).split(b"\n")
            self.partial[path] = lines.pop()  # a line still being written
            prefix = f"{path.stem} | "
            text = "".join(f"{prefix}{line.decode(errors='replace')}\n" for line in lines)
            if text:
                self.out(text)


# prctl(2): orphaned descendants are re-parented to this process instead of PID 1.
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt the orphans of our children (daemonized servers, engines whose agent died).

    Where PID 1 reaps nothing (some containers), a killed daemon would otherwise stay a
    zombie that looks alive to anyone who checks its pid, and is never restarted.
    """
    import ctypes

    try:
        # The process's own symbols, libc's among them: find_library would run a subprocess.
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(ours: Callable[[], set[int]]) -> int:
    """Collect the exit status of adopted processes that died; our own children's stays
    for their Popen. Returns how many were reaped."""
    reaped = 0
    mine = ours()
    for process in psutil.Process().children():
        if process.pid in mine:
            continue
        with contextlib.suppress(psutil.Error, ChildProcessError):
            if process.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(process.pid, os.WNOHANG)
                reaped += 1
    return reaped


class StopRequest:
    """SIGINT or SIGTERM asks the loop to stop at its next tick, so children stop in order."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGINT, self._request)
        signal.signal(signal.SIGTERM, self._request)

    def _request(self, _signum, _frame) -> None:
        self.requested = True


def serve(
    supervisor: ChildSupervisor, processes: list[ProcessChild], echo: LogEcho, stop: StopRequest,
    environ: Mapping[str, str],
) -> None:  # fmt: skip
    """Until a stop is asked for: restart what died, echo output, reap orphans, rotate logs."""
    from agent_worker.config import log_rotation_from

    max_bytes, keep = log_rotation_from(environ)
    next_rotation = 0.0

    def ours() -> set[int]:
        return {pid for child in processes if (pid := child.pid()) is not None}

    while not stop.requested:
        supervisor.check()
        echo.pump()
        reap_orphans(ours)
        if time.monotonic() >= next_rotation:
            rotate_logs(processes, max_bytes, keep)
            next_rotation = time.monotonic() + ROTATE_EVERY
        time.sleep(0.2)


def supervise_main(argv: list[str]) -> int:
    """``llmgw supervise NAME [--log FILE] -- COMMAND...``: one process, the same rules.

    For a container whose engines must outlive its agent: this is the container's main
    process, so an agent that dies is restarted beside its engines instead of taking
    the container (and the engines) down with it.
    """
    import argparse

    from core.env import llmgw_home

    if "--" not in argv:
        print("usage: llmgw supervise NAME [--log FILE] -- COMMAND...", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="llmgw supervise")
    parser.add_argument("name")
    parser.add_argument("--log", type=Path, help="default: $LLMGW_HOME/logs/NAME.log")
    options = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        print("llmgw supervise: no command after --", file=sys.stderr)
        return 2
    log_path = options.log or llmgw_home() / "logs" / f"{options.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    child = ProcessChild(options.name, command, log_path, dict(os.environ), Path.cwd())
    supervisor = ChildSupervisor([child], owner="llmgw supervise")
    echo = LogEcho([log_path])
    stop = StopRequest()
    become_subreaper()
    supervisor.start_all()
    serve(supervisor, [child], echo, stop, os.environ)
    supervisor.stop_all(grace=10)
    echo.pump()
    return 0
