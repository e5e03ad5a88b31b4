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
    try:
        process = subprocess.Popen(
            [str(binary), "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, cwd=binary.parent,
        )  # fmt: skip
    except OSError as exc:
        raise InstallError(f"{binary.name} cannot be run: {exc}") from None
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise InstallError(f"{binary.name} did not answer --version within {timeout:g} s") from None
    lines = [line for line in out.decode("utf-8", "replace").splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if process.returncode < 0:
        name = signal.Signals(-process.returncode).name
        raise InstallError(f"{binary.name} --version was killed by signal {name}")
    if process.returncode != 0:
        raise InstallError(
            f"{binary.name} --version exited with code {process.returncode}"
            + (f": {last}" if last else "")
        )
    return last
