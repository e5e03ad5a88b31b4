"""Start, recognise and signal the process groups that make up a shard.

Every command runs in a session of its own (``start_new_session=True``) so that nothing
done to the agent — Celery's warm shutdown, kill -9, a crash — reaches an engine, and
so that a whole engine (vLLM's worker children included) is stopped by signalling
one group.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from agent_worker.engines.command import LaunchCommand
from agent_worker.supervision.engine_user import EngineUser
from agent_worker.supervision.statedir import ProcessRecord

log = logging.getLogger(__name__)

# psutil derives create_time from boot time, which the kernel may restate by a little
# after a clock step; a pid reused within this window with the same cmdline is fiction.
CREATE_TIME_TOLERANCE = 1.0
# After SIGKILL a process in uninterruptible sleep (a GPU driver tearing down) can take a
# while; past this we stop waiting and say so rather than hang the caller.
KILL_WAIT = 10.0
_POLL = 0.05

# What an engine may take from the agent's environment (see engine_environment).
_ENGINE_ENV_NAMES = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR"}
    | {"LD_LIBRARY_PATH", "HF_HOME", "XDG_CACHE_HOME"}
    # a hub id is fetched by the engine itself, through the site's proxy and CA bundle
    | {"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"}
    | {"http_proxy", "https_proxy", "no_proxy", "all_proxy"}
    | {"SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"}
)
_ENGINE_ENV_PREFIXES = (
    "LC_",
    "CUDA_",
    "NCCL_",
    "NVIDIA_",
    "ROCM_",
    "ROCR_",
    "HIP_",
    "HSA_",
    "HF_HUB_",
    "TRANSFORMERS_",
    "OMP_",
    "OPENBLAS_",
    "MKL_",
    # An operator's (or a test run's) labels for every engine this agent starts: a way
    # to find them with ps or /proc/*/environ that survives the agent.
    "LLMGW_LABEL_",
)
_CREDENTIAL_WORDS = ("TOKEN", "SECRET", "PASSWORD")


@dataclass(frozen=True)
class Exit:
    """How a process ended; ``code`` is None when it was not our child to wait for."""

    code: int | None

    def describe(self) -> str:
        if self.code is None:
            return "exited (its exit code is unknown: this agent adopted it)"
        if self.code < 0:
            try:
                name = signal.Signals(-self.code).name
            except ValueError:
                name = f"signal {-self.code}"
            return f"was killed by {name}"
        return f"exited with code {self.code}"


class ShardProcess:
    """One process of a shard: launched here (a child) or adopted (watched by polling)."""

    def __init__(self, record: ProcessRecord, popen: subprocess.Popen[bytes] | None) -> None:
        self.record = record
        self._popen = popen

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def pid(self) -> int:
        return self.record.pid

    @property
    def pgid(self) -> int:
        return self.record.pgid

    @property
    def adopted(self) -> bool:
        return self._popen is None

    @classmethod
    def launch(
        cls,
        command: LaunchCommand,
        log_path: Path,
        secret_flags: list[str] | None = None,
        user: EngineUser | None = None,
        group: int | None = None,
    ) -> ShardProcess:
        """Start ``command`` in a new session with its output appended to ``log_path``.

        ``secret_flags`` (the flags naming its secret files) go after its argv; its secret
        environment joins its environment. With ``user``, it runs as that user and as
        ``group`` (the shard's own), with no other group than those of the weights it
        names. Raises OSError when the executable cannot be run.
        """
        argv = [*command.argv, *(secret_flags or [])]
        # The engine user's HOME and names, where the agent's say root; a profile's own
        # env (HOME is an engine admin's to set) still wins.
        own = user.environment() if user is not None else {}
        env = engine_environment(os.environ, {**own, **command.env, **command.secret_env})
        who: dict[str, Any] = {}
        if user is not None:
            who = {"user": user.uid, "group": group if group is not None else user.gid}
            # The groups of the weights it names, to read them; no other.
            who["extra_groups"] = user.weights_groups(argv)
        # The engine writes to the file itself: a pipe into the agent would die with the
        # agent and take the engine down with SIGPIPE.
        with open(log_path, "ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
                **who,
            )
        create_time, cmdline = 0.0, argv
        with contextlib.suppress(psutil.Error):
            handle = psutil.Process(popen.pid)
            create_time = handle.create_time()
            cmdline = handle.cmdline() or argv  # a process that already exited shows none
        record = ProcessRecord(
            name=command.name or Path(argv[0]).name,
            pid=popen.pid,
            pgid=popen.pid,
            create_time=create_time,
            cmdline=cmdline,
            argv=argv,
        )
        return cls(record, popen)

    @classmethod
    def adopt(cls, record: ProcessRecord) -> ShardProcess:
        return cls(record, None)

    def poll(self) -> Exit | None:
        """Return how the process ended, or None while it runs."""
        if self._popen is not None:
            code = self._popen.poll()
            return None if code is None else Exit(code)
        return None if still_running(self.record) else Exit(None)

    def refresh_cmdline(self) -> bool:
        """Record the command line the process shows now; say whether it changed."""
        try:
            cmdline = psutil.Process(self.pid).cmdline()
        except psutil.Error:
            return False
        if not cmdline or cmdline == self.record.cmdline or not self._group_is_ours():
            return False
        self.record = self.record.model_copy(update={"cmdline": cmdline})
        return True

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the process group; say whether anyone was there to receive it."""
        if not self._group_is_ours():
            return False
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            log.warning("not allowed to signal process group %d (%s)", self.pgid, self.name)
            return False
        return True

    def terminate(self, grace: float) -> bool:
        """SIGTERM the group, SIGKILL what is left after ``grace``; say whether it took SIGKILL.

        Descendants that moved to a session of their own go the same way: they are listed
        first, because once their parent dies nothing links them to the shard any more.
        """
        elsewhere = self._descendants_elsewhere()
        killed = terminate_group(self.pgid, grace, reap=self.poll, is_ours=self._group_is_ours)
        return terminate_processes(elsewhere, grace) or killed

    def _descendants_elsewhere(self) -> list[psutil.Process]:
        if self.poll() is not None or not self._group_is_ours():
            return []
        try:
            descendants = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []
        found = []
        for proc in descendants:
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(proc.pid) != self.pgid:
                    found.append(proc)
        return found

    def _group_is_ours(self) -> bool:
        # While any member lives the kernel will not hand the group's id to a new process,
        # so a missing leader means whatever still carries the id is ours. A live process
        # with the leader's pid but another start time means the id was reused: hands off.
        try:
            leader = psutil.Process(self.pgid)
            return abs(leader.create_time() - self.record.create_time) <= CREATE_TIME_TOLERANCE
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False


def engine_environment(
    agent_env: Mapping[str, str], command_env: Mapping[str, str]
) -> dict[str, str]:
    """Return the environment an engine starts with: what it needs of the agent's, then its own.

    The agent's environment holds the node token that signs its commands, the broker's
    URL and, under ``llmgw up``, the control plane's database, Redis and secret key; an
    engine runs whatever code its profile names and must see none of them. So only the
    system's basics, GPU and collective-library knobs, model caches and thread-pool
    settings pass, and never a name that looks like a credential. ``command_env`` (the
    profile's env and llmgw's GPU choice) is added whole: someone set it on purpose.
    """
    env = {
        name: value
        for name, value in agent_env.items()
        if (name in _ENGINE_ENV_NAMES or name.startswith(_ENGINE_ENV_PREFIXES))
        and not any(word in name.upper() for word in _CREDENTIAL_WORDS)
    }
    env.update(command_env)
    return env


def identify(record: ProcessRecord) -> str | None:
    """Return None if ``record.pid`` is still the process described, else what differs."""
    try:
        proc = psutil.Process(record.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return f"{record.name} (pid {record.pid}) is gone"
        if abs(proc.create_time() - record.create_time) > CREATE_TIME_TOLERANCE:
            return f"pid {record.pid} now belongs to another process (its start time differs)"
        cmdline = proc.cmdline()
    except psutil.NoSuchProcess:
        return f"{record.name} (pid {record.pid}) is gone"
    except psutil.Error as err:
        return f"pid {record.pid} cannot be inspected: {err}"
    if cmdline not in (record.cmdline, record.argv):
        return f"pid {record.pid} now belongs to another process (its command line differs)"
    return None


def still_running(record: ProcessRecord) -> bool:
    """Say whether a process already identified is still there (its title may change)."""
    try:
        proc = psutil.Process(record.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(proc.create_time() - record.create_time) <= CREATE_TIME_TOLERANCE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # cannot look: assume it is, rather than fail a healthy shard


def group_alive(pgid: int) -> bool:
    """Say whether any process of the group is still running (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    # killpg also succeeds for a group of zombies nobody has reaped yet, which happens to
    # orphans wherever pid 1 does not reap; ask each member.
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def terminate_processes(procs: list[psutil.Process], grace: float) -> bool:
    """SIGTERM each process, SIGKILL those left after ``grace``; say whether any took SIGKILL."""

    def running() -> list[psutil.Process]:
        left = []
        for proc in procs:
            with contextlib.suppress(psutil.Error):  # psutil checks it is still the same one
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(proc)
        return left

    def wait_gone(deadline: float) -> list[psutil.Process]:
        while (left := running()) and time.monotonic() < deadline:
            time.sleep(_POLL)
        return left

    for proc in running():
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    stubborn = wait_gone(time.monotonic() + max(0.0, grace))
    for proc in stubborn:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    wait_gone(time.monotonic() + KILL_WAIT)
    return bool(stubborn)


def terminate_group(
    pgid: int,
    grace: float,
    reap: Callable[[], object] | None = None,
    is_ours: Callable[[], bool] | None = None,
) -> bool:
    """SIGTERM group ``pgid``, wait up to ``grace`` for it to empty, then SIGKILL it.

    ``reap`` is called while waiting so an exited child of ours does not linger as a
    zombie; ``is_ours`` is asked before each signal. Return whether SIGKILL was needed.
    """

    def ours() -> bool:
        return is_ours is None or is_ours()

    def wait_empty(deadline: float) -> bool:
        while True:
            if reap is not None:
                reap()
            if not ours() or not group_alive(pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)

    if not ours():
        return False
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("not allowed to signal process group %d", pgid)
        return False
    if wait_empty(time.monotonic() + max(0.0, grace)):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    if not wait_empty(time.monotonic() + KILL_WAIT):
        log.warning("process group %d still has members %.0fs after SIGKILL", pgid, KILL_WAIT)
    return True
