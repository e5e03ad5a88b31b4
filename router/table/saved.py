"""The router's last good routing table on disk, to start from when the database is down.

After each load from the database the table (the snapshot model's JSON) and keys are
written here, but only when they differ from what the file holds: whole or not at all
(``core.files.write_atomically``: a private temporary file, fsync, rename over the old
one). A load that changes nothing only sets the file's modification time, without an
fsync, so the file still says when the database last vouched for it: that is where a
saved table's age runs from.

The file holds the engines' secrets (and the keys' SHA-256 hashes): it is mode 0600,
in a directory created 0700. A file that cannot be used (cut short, another version,
another shape) is ignored with a warning naming it; the next load replaces it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.files import write_atomically
from protocol.routing import RoutingSnapshot
from router.table.keys import KeyCache

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


@dataclass(frozen=True)
class SavedTable:
    """A routing snapshot and key list as the database gave them, and when."""

    table: RoutingSnapshot
    keys: list[dict[str, Any]] | None
    loaded_at: float  # the last load from the database that found this content
    saved_at: float  # when this content was written


class TableFile:
    """One saved-table file: ``save`` after every database load, ``read`` at start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: str | None = None  # digest of the content the file holds
        self._last_problem = ""

    def save(self, table: RoutingSnapshot, keys: list[dict[str, Any]] | None,
             loaded_at: float) -> bool:  # fmt: skip
        """Keep this load; return whether the file was (re)written. Never raises OSError:
        a disk problem must not stop the router from serving what it just loaded."""
        content = {"table": table.model_dump(mode="json"), "keys": keys}
        digest = _digest(content)
        try:
            if self._written is None:
                self._written = self._digest_on_disk()
            if digest == self._written:
                try:
                    os.utime(self.path, (loaded_at, loaded_at))
                    return False
                except FileNotFoundError:
                    pass  # deleted behind our back: write it again
            self._replace({"version": FORMAT_VERSION, "saved_at": time.time(),
                           "loaded_at": loaded_at, **content})  # fmt: skip
        except OSError as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if problem != self._last_problem:  # once per problem, not every refresh
                logger.warning(
                    "routing table not saved to %s (%s); a router started while the "
                    "database is down will have no table to serve", self.path, problem,
                )  # fmt: skip
            self._last_problem = problem
            self._written = None
            return False
        self._written = digest
        self._last_problem = ""
        return True

    def read(self) -> SavedTable | None:
        """The saved table, or None when there is none or it cannot be used (warned)."""
        try:
            text = self.path.read_text()
            confirmed_at = self.path.stat().st_mtime
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._unusable(f"cannot read it: {exc}")
        try:
            document = json.loads(text)
        except ValueError as exc:
            return self._unusable(f"not JSON: {exc}")
        if not isinstance(document, dict):
            return self._unusable("not a saved routing table (not a JSON object)")
        version = document.get("version")
        if version != FORMAT_VERSION:
            return self._unusable(f"version {version}, this router reads {FORMAT_VERSION}")
        try:
            saved = SavedTable(
                table=RoutingSnapshot.model_validate(document["table"]), keys=document["keys"],
                loaded_at=max(float(document["loaded_at"]), confirmed_at),
                saved_at=float(document["saved_at"]),
            )  # fmt: skip
            # What the router will build from the keys, so a bad one fails here, not later.
            KeyCache().replace(saved.keys)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return self._unusable(f"not a saved routing table ({type(exc).__name__}: {exc})")
        return saved

    def _unusable(self, why: str) -> SavedTable | None:
        """None, having said why the saved table is not used."""
        logger.warning(
            "ignoring the saved routing table %s: %s; the next load from the database "
            "replaces it", self.path, why,
        )  # fmt: skip
        return None

    def _digest_on_disk(self) -> str | None:
        """What the file holds, so a restarted router does not rewrite an unchanged table."""
        try:
            document = json.loads(self.path.read_text())
            return _digest({"table": document["table"], "keys": document["keys"]})
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _replace(self, document: dict[str, Any]) -> None:
        directory = self.path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # an existing one is left be
        write_atomically(self.path, json.dumps(document, separators=(",", ":")),
                         modified_at=document["loaded_at"])  # fmt: skip


def _digest(content: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
