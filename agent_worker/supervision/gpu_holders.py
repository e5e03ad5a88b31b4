"""Sort the processes holding GPUs into ours, engines left behind, and other people's.

A GPU held by a process no shard describes is worse than none: placement hands it out
again. Only the agent's own leftovers are its to kill, though — an engine of a shard
whose state file was lost, say, run by the user engines run as (the engine user under a
root agent: never root's processes). A desktop's graphics, another
user's job, or some other program of the agent's user keeps running and is reported as
an unexpected GPU user, so an operator can see why the GPU is busy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import psutil

from agent_worker.supervision.process import group_alive, terminate_group, terminate_processes
from protocol.gpu_users import UnexpectedGpuUser

log = logging.getLogger(__name__)

CMDLINE_LIMIT = 200

_PYTHON = re.compile(r"python[0-9.]*")
# Interpreter options that take the next argument as their value.
_PYTHON_OPTIONS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}
# Titles engines give their worker processes (setproctitle), which replace the command line:
# vLLM's engine core and workers, SGLang's scheduler and detokenizer, and the Ray actor
# that hosts vLLM's GPU workers under launch_mode: ray.
_ENGINE_TITLES = ("VLLM::", "sglang::", "ray::RayWorkerWrapper")


@dataclass(frozen=True)
class GpuSweep:
    """What one sweep of the GPU holders did: the pids killed, and those left alone."""

    killed: list[int] = field(default_factory=list)
    unexpected: list[UnexpectedGpuUser] = field(default_factory=list)


@dataclass
class _Strays:
    """GPU holders no shard accounts for: engines of ours by kill target, and the rest."""

    groups: dict[int, list[int]] = field(default_factory=dict)  # pgid -> GPU pids in it
    alone: list[psutil.Process] = field(default_factory=list)  # engines in a stranger's group
    unexpected: list[UnexpectedGpuUser] = field(default_factory=list)


def looks_like_engine(cmdline: Sequence[str]) -> bool:
    """Say whether ``cmdline`` is an engine server llmgw starts, or one of its workers.

    The shapes are the adapters': ``llama-server``, ``vllm serve`` (run through its
    Python or not), ``python -m vllm.entrypoints...``, ``python -m sglang.launch_server``,
    and the titles vLLM, SGLang and vLLM's Ray workers give their processes.
    """
    if not cmdline:
        return False
    if " ".join(cmdline).startswith(_ENGINE_TITLES):
        return True
    args = list(cmdline)
    if _PYTHON.fullmatch(os.path.basename(args[0])):
        module, args = _python_target(args[1:])
        if module is not None:
            return module == "sglang.launch_server" or module.startswith("vllm.entrypoints")
        if not args:
            return False
    program = os.path.basename(args[0])
    return program == "llama-server" or (program == "vllm" and args[1:2] == ["serve"])


def sweep_gpu_holders(
    gpu_pids: Iterable[int],
    known_pgids: set[int],
    leaders: set[int],
    grace: float,
    engines_uid: int | None = None,
) -> GpuSweep:
    """Kill the engines of llmgw's engine user holding GPUs that no shard accounts for;
    report the others.

    ``engines_uid`` is the user engines run as: the engine user where the agent is root
    (agent_worker/engine_user.py), so no process of root's, another container's say, is
    ever killed; the agent's own user (the default) where engines run as that.

    ``known_pgids`` and ``leaders`` are the process groups and pids of the shards this
    agent runs; a holder in one of those groups, descended from one of those pids, or in
    the agent's own group is accounted for. An engine is killed with its process group
    when the group is an engine's (its leader is one, or gone), and alone otherwise, so a
    script that started it by hand is not taken along. An engine that survives SIGKILL
    still holds its GPUs and is reported as unexpected too.
    """
    owner = os.getuid() if engines_uid is None else engines_uid
    strays = _find_strays(gpu_pids, known_pgids, leaders, owner)
    killed: list[int] = []
    unexpected = list(strays.unexpected)
    for pgid, pids in strays.groups.items():
        what = ", ".join(_describe_pid(pid) for pid in pids)
        terminate_group(pgid, grace)
        if group_alive(pgid):
            log.error("could not kill process group %d (%s) holding a GPU", pgid, what)
            unexpected += [found for pid in pids if (found := describe_gpu_user(pid))]
            continue
        log.warning("killed process group %d (%s): it held a GPU no shard explains", pgid, what)
        killed += pids
    for proc in strays.alone:
        what = _describe_pid(proc.pid)
        terminate_processes([proc], grace)
        if _running(proc):
            log.error("could not kill %s holding a GPU", what)
            if (found := describe_gpu_user(proc.pid)) is not None:
                unexpected.append(found)
            continue
        log.warning("killed %s: it held a GPU no shard explains", what)
        killed.append(proc.pid)
    for user in unexpected:
        log.warning("pid %d of %s (%s) holds a GPU; left running", user.pid, user.user, user.name)
    return GpuSweep(killed=sorted(killed), unexpected=sorted(unexpected, key=lambda u: u.pid))


def _find_strays(
    gpu_pids: Iterable[int], known_pgids: set[int], leaders: set[int], owner: int
) -> _Strays:
    """Sort the GPU holders no shard accounts for into kill targets and unexpected users."""
    strays = _Strays()
    for pid in sorted(set(gpu_pids)):
        if pid <= 1 or pid == os.getpid():
            continue
        try:
            pgid = os.getpgid(pid)
            proc = psutil.Process(pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue  # gone since NVML listed it
        if pgid in known_pgids or pgid == os.getpgrp() or _descends_from(proc, leaders):
            continue
        if not (_owned_by(proc, owner) and _is_engine(proc)):
            if (found := describe_gpu_user(pid)) is not None:
                strays.unexpected.append(found)
        elif _group_is_engines(pgid):
            strays.groups.setdefault(pgid, []).append(pid)
        else:
            strays.alone.append(proc)
    return strays


def describe_gpu_user(pid: int) -> UnexpectedGpuUser | None:
    """Describe ``pid`` for the control plane; None if it is gone."""
    try:
        proc = psutil.Process(pid)
        name, user = proc.name(), proc.username()
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:
        name, user = "", ""
    cmdline = ""
    with contextlib.suppress(psutil.Error):
        cmdline = _truncate(" ".join(proc.cmdline()))
    return UnexpectedGpuUser(pid=pid, user=user, name=name, cmdline=cmdline)


def _python_target(args: list[str]) -> tuple[str | None, list[str]]:
    """Return the module run by ``-m`` (or None) and the arguments from the script on."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m":
            return (args[i + 1] if i + 1 < len(args) else ""), []
        if arg.startswith("-m") and not arg.startswith("--"):
            return arg[2:], []
        if arg in ("-c", "-"):
            return None, []  # code given inline or on stdin: nothing to recognise
        if not arg.startswith("-"):
            return None, args[i:]
        i += 2 if arg in _PYTHON_OPTIONS_WITH_VALUE else 1
    return None, []


def _is_engine(proc: psutil.Process) -> bool:
    # A vLLM worker started by multiprocessing shows only spawn_main; its parent says vllm.
    try:
        lineage = [proc, *proc.parents()]
    except psutil.Error:
        lineage = [proc]
    return any(looks_like_engine(_cmdline(member)) for member in lineage)


def _group_is_engines(pgid: int) -> bool:
    """Say whether group ``pgid`` is an engine's: its leader is one, or has gone."""
    try:
        leader = psutil.Process(pgid)
        if os.getpgid(pgid) != pgid:
            return False  # the group's id now names a process in another group
        return _is_engine(leader)
    except (ProcessLookupError, psutil.NoSuchProcess):
        return True  # an orphaned group: what is left are the engine's own workers
    except psutil.Error:
        return False


def _owned_by(proc: psutil.Process, uid: int) -> bool:
    try:
        return bool(proc.uids().real == uid)
    except psutil.Error:
        return False


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _descends_from(proc: psutil.Process, ancestors: set[int]) -> bool:
    # A daemon an engine started in a session of its own (Ray's, say) is still the shard's.
    try:
        return any(parent.pid in ancestors for parent in proc.parents())
    except psutil.Error:
        return False


def _describe_pid(pid: int) -> str:
    try:
        return f"pid {pid}: " + _truncate(" ".join(psutil.Process(pid).cmdline()))
    except psutil.Error:
        return f"pid {pid}"


def _truncate(text: str) -> str:
    return text if len(text) <= CMDLINE_LIMIT else text[: CMDLINE_LIMIT - 1] + "…"
