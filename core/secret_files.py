"""The home directory and the secrets in it: readable by the user llmgw runs as, no one else.

A secret is 0600 from the moment its name exists: written to a private temporary file
opened O_EXCL with mode 0600 (whatever the umask), then hard-linked into place, so a
reader never sees it half written and an existing secret is never replaced. Of two
processes creating the same secret at once, the first to link wins and both use its.

Imports only the standard library: settings reads its secret key through this.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

log = logging.getLogger("llmgw.site")

# pgserver runs the embedded PostgreSQL as this user when llmgw runs as root. It switches
# only the user id (subprocess' user=), so the server keeps root's group: a home that
# root's group may search (0710) is all the server needs to reach its data directory.
POSTGRES_SYSTEM_USER = "pgserver"
POSTGRES_DIR = "postgres"  # the embedded PostgreSQL's data directory, under the home

_narrowed: set[Path] = set()


def write_secret_file(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text``, mode 0600; return False (writing nothing) if it exists."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a umask that takes the owner's bits away would leave 0400
        with open(fd, "w", closefd=False) as file:
            file.write(text)
            file.flush()
            os.fsync(fd)
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        return True
    finally:
        os.close(fd)
        temporary.unlink(missing_ok=True)


def read_or_create_secret(path: Path, make: Callable[[], str]) -> str:
    """The secret kept in ``path``, created from ``make()`` on first use."""
    if not path.exists():
        write_secret_file(path, make())
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        # An earlier llmgw wrote secrets first and narrowed them after; one cut short between.
        log.warning("%s was readable by others (mode %04o); narrowed it to 0600", path, mode)
        path.chmod(0o600)
    return path.read_text().strip()


def metrics_token(home: Path, environ: Mapping[str, str] = os.environ) -> str:
    """LLMGW_METRICS_TOKEN, or the one kept in ``home``'s ``metrics-token`` (created on first
    use): /metrics, the control plane's and the router's, is never open to anyone by default
    (review finding 20). On one host both read the same file; Prometheus is given its text."""
    return environ.get("LLMGW_METRICS_TOKEN") or read_or_create_secret(
        ensure_private_dir(home) / "metrics-token", lambda: secrets.token_urlsafe(32)
    )


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` mode 0700, or narrow an existing one that others could read or enter.

    The one exception: run as root, a home holding the embedded PostgreSQL's data may be
    searched by its group (root's), which that server needs (allow_postgres_to_traverse).
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    allowed = stat.S_IXGRP if _runs_postgres_in_our_group(path, info) else 0
    wider = mode & 0o077 & ~allowed
    if wider:
        try:
            path.chmod(mode & ~wider)
            narrowed = True
        except PermissionError:  # another user's directory: say so, and carry on
            narrowed = False
        if path not in _narrowed:
            _narrowed.add(path)
            if narrowed:
                log.warning(
                    "%s was open to other users (mode %04o); narrowed it to %04o",
                    path, mode, mode & ~wider,
                )  # fmt: skip
            else:
                log.warning(
                    "%s is open to other users (mode %04o) and not ours to narrow; "
                    "run: chmod go-rwx %s", path, mode, path,
                )  # fmt: skip
    return path


def allow_postgres_to_traverse(path: Path) -> None:
    """As root, let the embedded PostgreSQL search ``path``: 0710, the group root's own.

    pgserver adds read and search for everyone to every parent of the data directory
    when it starts a server as root; this takes the home back to what the server needs.
    """
    if os.geteuid() != 0:
        return
    info = path.stat()
    if info.st_gid != os.getegid():
        os.chown(path, -1, os.getegid())
    if stat.S_IMODE(info.st_mode) != 0o710:
        path.chmod(0o710)


def _runs_postgres_in_our_group(path: Path, info: os.stat_result) -> bool:
    return os.geteuid() == 0 and info.st_gid == os.getegid() and (path / POSTGRES_DIR).is_dir()
