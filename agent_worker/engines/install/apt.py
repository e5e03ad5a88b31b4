"""The OS packages a build needs, from the node's own apt.

A new machine runs cloud-init and unattended-upgrades, which hold apt's locks for
minutes; `DPkg::Lock::Timeout` covers dpkg's lock, not the one `apt-get update` takes on
its lists. So a held lock is waited for (up to ``lock_wait``), reported as waiting, and
only any other failure is a failure, reported at once with apt's last lines.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent_worker.engines.install.errors import InstallError

LOCK_WORDS = ("could not get lock", "unable to lock", "is another process using it")
APT_LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock")
WAITING = "another apt-get is running"


@dataclass(frozen=True)
class AptSettings:
    command: tuple[str, ...] = ("apt-get",)
    lock_paths: tuple[str, ...] = APT_LOCKS
    lock_wait: float = 600.0
    poll: float = 5.0
    timeout: float = 1800.0
    clock: Callable[[], float] = field(default=time.monotonic)
    sleep: Callable[[float], None] = field(default=time.sleep)

    def available(self) -> bool:
        return shutil.which(self.command[0]) is not None


def install_packages(
    packages: list[str], settings: AptSettings, say: Callable[[str, str], None]
) -> None:
    """``apt-get install`` the packages; ``say(status, detail)`` reports how it goes."""
    if not packages:
        return
    command = [*settings.command, "install", "-y", "--no-install-recommends", *packages]
    deadline = settings.clock() + settings.lock_wait
    while True:
        if held_lock(settings.lock_paths) is None:
            say("installing", f"apt {' '.join(packages)}")
            failure = _run(command, settings.timeout)
            if failure is None:
                return
            if not any(word in failure.lower() for word in LOCK_WORDS):
                raise InstallError(f"{' '.join(command)} failed: {failure}")
        if settings.clock() >= deadline:
            raise InstallError(
                f"another apt-get held its lock for over {settings.lock_wait:g} s; "
                f"{' '.join(packages)} not installed"
            )
        say("waiting", WAITING)
        settings.sleep(settings.poll)


def held_lock(paths: tuple[str, ...]) -> str | None:
    """The first lock path another process holds (apt's fcntl locks), else None."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue  # absent, or not ours to open: apt itself will say
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return path
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return None


def _run(command: list[str], timeout: float) -> str | None:
    """None on success, else apt's last lines."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"did not finish within {timeout:g} s"
    except OSError as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return " / ".join(lines[-4:]) or f"exit code {done.returncode}"
