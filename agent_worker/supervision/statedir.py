"""One file per shard under the agent's state directory: the spec and what was launched.

Written before anything is launched and again after each process starts, so an agent
that restarts (or was killed) can find, verify and describe every engine it left
running. Files are replaced atomically and readable only by the agent: a spec holds
the replica's API key. ``recorded_shards`` is the one reader for everything outside the
agent that looks at them (the benches, the process tests' cleanup).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.files import TEMPORARY_PREFIX as _TMP_PREFIX
from core.files import write_atomically
from protocol.shard import ShardSpec

_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SUFFIX = ".json"
# The state directory's name in the agent directory (``AgentConfig.state_dir``).
STATE_DIR_NAME = "shards"


class StateFileError(Exception):
    """A state file that cannot be read as one; the message names the file and the fix."""


def check_shard_id(shard_id: str) -> str:
    """Return ``shard_id`` if it is safe as a file name, else raise ValueError saying why."""
    if not isinstance(shard_id, str) or not _SAFE_ID.fullmatch(shard_id) or ".." in shard_id:
        raise ValueError(
            f"shard id {shard_id!r} is not a safe file name: use 1-128 letters, digits, "
            "'.', '_' or '-', starting with a letter or digit and without '..'"
        )
    return shard_id


class ProcessRecord(BaseModel):
    """One launched process, described well enough to recognise it after a restart."""

    model_config = ConfigDict(extra="forbid")

    name: str
    pid: int = Field(gt=1)
    pgid: int = Field(gt=1)
    create_time: float
    cmdline: list[str] = Field(description="as /proc showed it just after launch")
    argv: list[str] = Field(description="as the adapter asked for it")


class ShardRecord(BaseModel):
    """What the state file of one shard holds."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    spec: ShardSpec
    serves_http: bool
    ready_when_listening: bool = False
    health_path: str = "/health"
    commands: int = Field(ge=1, description="how many commands the shard has in all")
    processes: list[ProcessRecord] = Field(default_factory=list)
    stopping: bool = False

    @property
    def serving(self) -> ProcessRecord | None:
        """The process that serves: the last one launched (workers and helpers go first)."""
        return self.processes[-1] if self.processes else None


class StateDir:
    """The directory of shard state files."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)

    def file_for(self, shard_id: str) -> Path:
        return self.path / f"{check_shard_id(shard_id)}{SUFFIX}"

    def write(self, record: ShardRecord) -> None:
        """Replace the shard's file atomically: a reader sees the old one or the new one."""
        write_atomically(self.file_for(record.spec.shard_id), record.model_dump_json(indent=1))

    def read(self, path: Path) -> ShardRecord:
        """Read one state file, raising StateFileError naming it if it is not one."""
        return read_state_file(path)

    def remove(self, shard_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.file_for(shard_id).unlink()

    def exists(self, shard_id: str) -> bool:
        return self.file_for(shard_id).exists()

    def files(self) -> list[Path]:
        """Every state file, oldest name first; leftovers of interrupted writes are removed."""
        found = []
        for entry in sorted(self.path.iterdir()):
            if entry.name.startswith(_TMP_PREFIX):
                # A write that never reached os.replace: the previous version still stands.
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
            elif entry.name.endswith(SUFFIX) and entry.is_file():
                found.append(entry)
        return found


def read_state_file(path: Path) -> ShardRecord:
    """Read one state file, raising StateFileError naming it if it is not one."""
    fix = "it is left in place; remove it once its engine has been dealt with"
    stem = path.name.removesuffix(SUFFIX)
    try:
        check_shard_id(stem)
    except ValueError as err:
        raise StateFileError(f"state file {path} has an unsafe name ({err}); {fix}") from None
    try:
        record = ShardRecord.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError) as err:
        summary = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise StateFileError(f"state file {path} is not readable: {summary}; {fix}") from None
    if record.spec.shard_id != stem:
        raise StateFileError(
            f"state file {path} describes shard {record.spec.shard_id!r}, not {stem!r}; {fix}"
        )
    return record


def recorded_shards(agent_dir: Path) -> dict[str, ShardRecord]:
    """Shard id -> its record, for every state file in the agent directory ``agent_dir``
    that reads as one: what an agent there runs, or left running, as it recorded it.

    For readers outside the agent (benches, tests, cleanups), which may look while the
    agent writes or after it is gone: nothing is created or removed, and a file that does
    not read as a state file (another shard's, an interrupted write) is left out.
    """
    directory = Path(agent_dir) / STATE_DIR_NAME
    try:
        entries = sorted(directory.iterdir())
    except OSError:  # no agent ran there, or it is not ours to read
        return {}
    found = {}
    for entry in entries:
        if not entry.name.endswith(SUFFIX) or entry.name.startswith(_TMP_PREFIX):
            continue
        with contextlib.suppress(StateFileError):
            record = read_state_file(entry)
            found[record.spec.shard_id] = record
    return found
