"""Where an install lies and what makes it llmgw's: the marker written last, the rename
that puts a finished install in place, and the test every removal passes first."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agent_worker.engines.install.errors import InstallError
from protocol.engines import WantedEngine

MARKER = ".llmgw-install.json"
# The executable each archive engine's release holds, found wherever it lies in it.
ARCHIVE_BINARIES = {"llama.cpp": "llama-server"}


def find_binary(staged: Path, engine: str, archive: str) -> Path:
    name = ARCHIVE_BINARIES.get(engine)
    if name is None:
        raise InstallError(f"llmgw installs {', '.join(ARCHIVE_BINARIES)} from archives, "
                           f"not {engine}")  # fmt: skip
    found = sorted(
        (p for p in staged.rglob(name) if p.is_file() and not p.is_symlink()),
        key=lambda p: len(p.parts),
    )
    if not found:
        raise InstallError(f"{archive} holds no {name}")
    binary = found[0]
    binary.chmod(binary.stat().st_mode | 0o111)
    return binary


def write_marker(
    directory: Path, engine: WantedEngine, binary: Path, build: str, sha256: str = ""
) -> None:
    record = {"engine": engine.name, "version": engine.version, "build": build,
              "sha256": sha256, "binary": str(binary)}  # fmt: skip
    (directory / MARKER).write_text(json.dumps(record, indent=2) + "\n")


def put_in_place(staged: Path, final: Path) -> None:
    """Rename ``staged`` to ``final``; an old (broken) install is moved aside first, so
    there is never a half directory at ``final``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    aside = None
    if final.exists():
        aside = staged.with_name(staged.name + "-old")
        final.rename(aside)
    staged.rename(final)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def is_ours(directory: Path, root: Path) -> bool:
    """A real directory, two levels under root, holding llmgw's marker: never a link."""
    if directory.is_symlink() or directory.parent.is_symlink() or not directory.is_dir():
        return False
    resolved, top = directory.resolve(), root.resolve()
    return resolved.parent.parent == top and (directory / MARKER).is_file()
