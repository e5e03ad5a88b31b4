"""The OS packages a build needs, from the node's own apt.

What dpkg already has is not asked for again, so an agent that may not install (not
root) runs whatever its node already holds, and says in one line what it lacks. The
rest is installed after an `apt-get update`: a fresh image has no package lists, and
`install` alone finds nothing there.

A new machine runs cloud-init and unattended-upgrades, which hold apt's locks for
minutes; `DPkg::Lock::Timeout` covers dpkg's lock, not the one `apt-get update` takes on
its lists. So a held lock is waited for (up to ``lock_wait`` for the update and the
install together), reported as waiting, and only any other failure is a failure,
reported at once with apt's last lines.
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
from protocol.engines import check_package_names

LOCK_WORDS = ("could not get lock", "unable to lock", "is another process using it")
APT_LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock")
WAITING = "another apt-get is running"


def _is_root() -> bool:
    return os.geteuid() == 0


@dataclass(frozen=True)
class AptSettings:
    command: tuple[str, ...] = ("apt-get",)
    query: tuple[str, ...] = ("dpkg-query",)
    lock_paths: tuple[str, ...] = APT_LOCKS
    lock_wait: float = 600.0
    poll: float = 5.0
    timeout: float = 1800.0
    clock: Callable[[], float] = field(default=time.monotonic)
    sleep: Callable[[float], None] = field(default=time.sleep)
    is_root: Callable[[], bool] = field(default=_is_root)

    def available(self) -> bool:
        return shutil.which(self.command[0]) is not None


def install_packages(
    packages: list[str], settings: AptSettings, say: Callable[[str, str], None]
) -> None:
    """Install what dpkg lacks of ``packages``; ``say(status, detail)`` reports how it goes."""
    try:  # checked by the control plane too; a node does not take that on trust
        check_package_names(packages)
    except ValueError as exc:
        raise InstallError(f"this build's packages: {exc}; refused") from None
    missing = [package for package in packages if not dpkg_has(package, settings)]
    if not missing:
        return
    if not settings.is_root():
        listed = " ".join(missing)
        raise InstallError(
            f"this build needs {', '.join(missing)}, which the agent may not install (it "
            f"is not root): run `sudo apt-get install -y {listed}` on this node, or run "
            "the agent as root"
        )
    deadline = settings.clock() + settings.lock_wait
    # Not fatal alone: one unreachable third-party repository fails it, lists or not.
    update_failure = _run_apt(["update"], missing, settings, deadline, say)
    # "--": whatever follows is a package, never an option (-o would run any command).
    install = ["install", "-y", "--no-install-recommends", "--", *missing]
    failure = _run_apt(install, missing, settings, deadline, say)
    if failure is not None:
        if update_failure is not None:
            failure += f" (apt-get update had failed too: {update_failure})"
        raise InstallError(f"{' '.join([*settings.command, *install])} failed: {failure}")


def dpkg_has(package: str, settings: AptSettings) -> bool:
    """Say whether dpkg has ``package`` installed (not merely known, or removed)."""
    command = [*settings.query, "-W", "--showformat=${Status}", "--", package]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False  # apt will say what is wrong
    return done.returncode == 0 and done.stdout.split()[-1:] == ["installed"]


def _run_apt(
    arguments: list[str],
    packages: list[str],
    settings: AptSettings,
    deadline: float,
    say: Callable[[str, str], None],
) -> str | None:
    """Run apt-get with ``arguments`` once no other apt holds a lock, waiting until
    ``deadline`` at most; None on success, else apt's last lines."""
    command = [*settings.command, *arguments]
    while True:
        if held_lock(settings.lock_paths) is None:
            say("installing", f"apt-get {arguments[0]} {' '.join(packages)}")
            failure = _run(command, settings.timeout)
            if failure is None or not any(word in failure.lower() for word in LOCK_WORDS):
                return failure
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
