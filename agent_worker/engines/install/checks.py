"""Proof that an installed engine runs: every shared library found (``ldd``), then
``--version`` answering in time. A binary that is there and cannot start looks healthy
to everything else; the history's node that lacked libgomp1 did exactly that."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from agent_worker.engines.install.errors import InstallError


def check_libraries(binary: Path, ldd: str = "ldd") -> None:
    """Name every library the dynamic loader cannot find: ``libgomp.so.1 not found``."""
    try:
        done = subprocess.run([ldd, str(binary)], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return  # no ldd here: --version will still tell
    except subprocess.TimeoutExpired:
        raise InstallError(f"ldd {binary.name} did not finish within 30 s") from None
    output = done.stdout + done.stderr
    if "not a dynamic executable" in output:
        return  # a static binary or a script: nothing to look up
    missing = [line.split("=>")[0].strip() for line in output.splitlines()
               if "=> not found" in line]  # fmt: skip
    if missing:
        raise InstallError(", ".join(f"{name} not found" for name in missing))


def check_version(binary: Path, timeout: float) -> str:
    """Run ``BINARY --version`` in its own process group; return its last output line."""
    what = f"{binary.name} --version"
    code, out = run_bounded([str(binary), "--version"], what, timeout, cwd=binary.parent)
    lines = [line for line in out.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if code < 0:
        raise InstallError(f"{what} was killed by signal {signal.Signals(-code).name}")
    if code != 0:
        raise InstallError(f"{what} exited with code {code}" + (f": {last}" if last else ""))
    return last


def run_bounded(
    command: list[str],
    what: str,
    timeout: float,
    cwd: Path | str = "/",
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run ``command`` in a session of its own, killed whole past ``timeout``; return its
    exit code (negative: the signal) and its output, stdout and stderr together."""
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                   start_new_session=True)  # fmt: skip
    except OSError as exc:
        raise InstallError(f"{what}: cannot run {command[0]}: {exc}") from None
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise InstallError(f"{what} did not finish within {_duration(timeout)}") from None
    return process.returncode, out.decode("utf-8", "replace")


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 120 else f"{seconds:g} s"
