"""Where an install may write and delete: only under its own directories, whatever it is told.

The agent runs as root and ``rmtree``s what it downloaded; a version or file name taken
from a command is joined into those paths. The control plane validates them, but a node
must not depend on that (a tampered catalog row, a forged command): every name is checked
here again, and every joined path is resolved and held to its root before any ``mkdir``
or ``rmtree``.
"""

from __future__ import annotations

from pathlib import Path

from agent_worker.engines.install.errors import InstallError
from protocol.engines import check_path_token


def path_token(what: str, value: str) -> str:
    """``value`` if it is one plain path component (``protocol.engines.PATH_TOKEN``)."""
    try:
        return check_path_token(what, value)
    except ValueError as exc:
        raise InstallError(f"{exc}; refused") from None


def inside(root: Path, *parts: str) -> Path:
    """``root`` joined with ``parts``: each one name (never ``..``, ``.`` or a ``/``), the
    whole resolving under ``root``, links followed; InstallError otherwise."""
    path = root.joinpath(*parts)
    plain = all(part not in ("", ".", "..") and "/" not in part and "\x00" not in part
                for part in parts)  # fmt: skip
    if not plain or not path.resolve().is_relative_to(root.resolve()):
        raise InstallError(f"{path} is not inside {root}; refused")
    return path
