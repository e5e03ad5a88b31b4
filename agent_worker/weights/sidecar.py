"""The small file beside each fetched file that says where it came from."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from agent_worker.weights.names import SIDECAR_SUFFIX
from core.files import write_atomically


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
    write_atomically(sidecar_path(path), json.dumps(record))


def read_source(path: Path) -> str | None:
    """Return the source recorded beside ``path``, or None when there is no readable record."""
    try:
        record = json.loads(sidecar_path(path).read_text())
    except (OSError, ValueError):
        return None
    source = record.get("source") if isinstance(record, dict) else None
    return source if isinstance(source, str) and source else None
