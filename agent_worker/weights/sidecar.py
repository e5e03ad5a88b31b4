"""The small file beside each fetched file that says where it came from."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import tempfile
from pathlib import Path

from agent_worker.weights.names import SIDECAR_SUFFIX


def sidecar_path(path: Path) -> Path:
    """Return where the record of ``path``'s source lives."""
    return path.with_name(path.name + SIDECAR_SUFFIX)


def write_sidecar(path: Path, source: str, sha256: str, size: int) -> None:
    """Record ``path``'s source atomically: a torn record would orphan the file it describes."""
    record = {
        "source": source,
        "sha256": sha256,
        "size": size,
        "fetched_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    # Hidden while being written, so a listing never reads half a record.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(record, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, sidecar_path(path))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_source(path: Path) -> str | None:
    """Return the source recorded beside ``path``, or None when there is no readable record."""
    try:
        record = json.loads(sidecar_path(path).read_text())
    except (OSError, ValueError):
        return None
    source = record.get("source") if isinstance(record, dict) else None
    return source if isinstance(source, str) and source else None
