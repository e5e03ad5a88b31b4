"""Who engines run as: never root.

An agent running as root (apt, the firewall) starts every engine process, rpc-server
included, as a dedicated unprivileged user, ``llmgw-engine`` unless the agent file says
``engine_user:`` (``LLMGW_AGENT_ENGINE_USER``), created here at the agent's start when
missing, with its home under the agent's directory. Each shard's processes also take a
group of their own (``SHARD_GID_BASE`` + 24 bits of a hash of the shard's id), which
alone may enter the shard's own directory (the secrets it reads): the kernel lets one
process read another's memory or environment only when both ids match, so two shards of
the same user cannot read each other's either. Engines cannot read ``/etc/llmgw`` (0700),
the agent's state, logs or environment (root's), nor list the node's weights store; each
entry of the store is readable by a group of its own, which only the shards that name it
are given (``agent_worker/weights/access.py``), and those only read it.

An agent that is not root runs engines as its own user, as before; naming the agent's own
user in ``engine_user:`` does the same for a root agent (an accepted risk, logged).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agent_worker.weights.access import groups_for, restrict_store

log = logging.getLogger("llmgw.agent")

# Shard groups: nameless, far above any distribution's own and any user namespace's usual
# range; the weights' groups follow (agent_worker/weights/access.py).
SHARD_GID_BASE = 1_000_000_000

DEFAULT_ENGINE_USER = "llmgw-engine"
HOME_NAME = "engine-home"


class EngineUserError(Exception):
    """The engine user cannot be had; the message says how to make it."""


@dataclass(frozen=True)
class EngineUser:
    """The unprivileged user engines run as."""

    name: str
    uid: int
    gid: int
    home: Path
    weights_dir: Path | None = None  # the store: its entries' groups go to their shards

    def shard_gid(self, shard_id: str) -> int:
        """The group of shard ``shard_id``: one of 2**24, from its id, so two shards share
        one with odds of about one in 300,000 on a node of ten (ports would be unique on
        a node, but not on a machine that runs several agents: a simulated fleet)."""
        digest = hashlib.sha256(shard_id.encode()).digest()
        return SHARD_GID_BASE + int.from_bytes(digest[:3], "big")

    def weights_groups(self, argv: Iterable[str]) -> list[int]:
        """The groups of the store's entries ``argv`` names: what the process may read."""
        return groups_for(argv, self.weights_dir) if self.weights_dir is not None else []

    def environment(self) -> dict[str, str]:
        """What an engine's environment says of who runs it (the agent's says root)."""
        return {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name}


def engine_user(name: str, agent_dir: Path, weights_dir: Path | None = None) -> EngineUser | None:
    """The user engines run as (never root), created when missing; None when engines run as
    the agent's own user (an agent that is not root, or one told to keep them as its own).
    The agent's directory and ``weights_dir`` become searchable by it, not listable."""
    if os.geteuid() != 0:
        return None
    wanted = name or DEFAULT_ENGINE_USER
    if wanted == _own_name():
        log.warning(
            "engines run as %s, the agent's own user, as engine_user: says: an engine that is "
            "compromised holds what the agent holds (its key, every replica's secret)",
            wanted,
        )
        return None
    home = agent_dir / HOME_NAME
    try:
        entry = pwd.getpwnam(wanted)
    except KeyError:
        entry = _create(wanted, home)
    if entry.pw_uid == 0:
        raise EngineUserError(f"engine_user {wanted!r} is root (uid 0); name an unprivileged user")
    # The home engines are given is this agent's, whatever /etc/passwd says (an existing
    # user's, or another agent's on the same machine).
    user = EngineUser(wanted, entry.pw_uid, entry.pw_gid, home, weights_dir)
    _prepare_home(user, agent_dir)
    if weights_dir is not None:
        # Engines reach the weights they are given by path, and list none: what else this
        # node holds is not theirs to browse, nor (each entry in a group of its own, which
        # only its shards get) to read.
        weights_dir.mkdir(parents=True, exist_ok=True)
        weights_dir.chmod(0o711)
        restrict_store(weights_dir)
    return user


def _own_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return ""


def _create(name: str, home: Path) -> pwd.struct_passwd:
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    shell = "/usr/sbin/nologin" if os.path.exists("/usr/sbin/nologin") else "/bin/false"
    argv = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", str(home),
            "--shell", shell, "--comment", "llmgw engines", name]  # fmt: skip
    fix = f"create it (useradd --system --user-group {name}) or name another in engine_user:"
    said = ""
    # Agents starting together on one machine (a simulated fleet) race for /etc/passwd's
    # lock: the loser tries again, and finds the user the winner made.
    for _attempt in range(20):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except OSError as exc:
            raise EngineUserError(f"cannot create the engine user {name!r} ({exc}); {fix}") from exc
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            if done.returncode == 0:
                log.info("created the engine user %s, home %s", name, home)
            return entry
        said = done.stderr.strip() or f"exit code {done.returncode}"
        time.sleep(0.5)
    raise EngineUserError(f"useradd {name} failed: {said}; {fix}")


def _prepare_home(user: EngineUser, agent_dir: Path) -> None:
    # Searchable, not listable: engines reach their home and the engines installed under
    # the agent's directory; its state and logs stay the agent's (0700 each).
    agent_dir.mkdir(parents=True, exist_ok=True)
    agent_dir.chmod(0o711)
    user.home.mkdir(mode=0o700, exist_ok=True)
    os.chown(user.home, user.uid, user.gid)


def unreachable_by_others(*paths: Path) -> list[Path]:
    """The first directory (or file) on each path that a user other than its owner may not
    enter (or run): where an engine user could not reach what it must run or read."""
    found = []
    for path in paths:
        path = Path(os.path.realpath(path))
        for step in [*reversed(path.parents), path]:
            try:
                mode = step.stat().st_mode
            except OSError:
                break  # not made yet: whoever makes it decides
            if not mode & 0o001:
                found.append(step)
                break
    return found
