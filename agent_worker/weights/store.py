"""The weights directory of one node: what a source resolves to, fetching it once however
many shards ask, what the directory holds, and taking back only what llmgw put there."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_worker.weights.fetch import (
    FetchCancelled,
    FetchSettings,
    Flight,
    ProgressCallback,
    WeightFetchError,
    _Aborted,
    download,
)
from agent_worker.weights.look import holds_a_model
from agent_worker.weights.names import (
    PARTIAL_SUFFIX,
    SIDECAR_SUFFIX,
    SourceKind,
    WeightSourceError,
    cache_name,
    normalize_sha256,
    parse_cache_name,
    source_hash,
    source_kind,
)
from agent_worker.weights.sidecar import read_source, sidecar_path

log = logging.getLogger("llmgw.agent.weights")

# How often a caller with a cancel event looks at it while waiting on a download.
_CANCEL_POLL = 0.1


@dataclass(frozen=True)
class Resolved:
    """Where a source's weights are on this node.

    ``local``: ``path`` is the source itself, used as is. ``fetched``: ``path`` is the
    cache path the URL is (or will be) fetched to. ``hub``: ``path`` is None and the
    engine resolves the source itself.
    """

    kind: SourceKind
    source: str
    path: Path | None

    @property
    def model_path(self) -> str:
        """The value for ShardSpec.model_path: empty for a hub id."""
        return str(self.path) if self.path is not None else ""


class WeightStore:
    """Fetch, list and reclaim the weights under one directory."""

    def __init__(self, weights_dir: Path, settings: FetchSettings | None = None) -> None:
        self.weights_dir = Path(os.path.abspath(weights_dir))
        self.settings = settings or FetchSettings()
        self._lock = threading.Lock()
        self._flights: dict[str, Flight] = {}
        self._closed = False

    # -- where a source lives -----------------------------------------------------------

    def resolve(self, source: str) -> Resolved:
        """Say what kind of source this is and where its weights are; no I/O."""
        kind = source_kind(source)
        if kind == "local":
            return Resolved("local", source, Path(source))
        if kind == "fetched":
            return Resolved("fetched", source, self.path_for(source))
        return Resolved("hub", source, None)

    def path_for(self, source: str) -> Path:
        """Return the cache path of a URL source: its hash and checked basename, in the dir."""
        if source_kind(source) != "fetched":
            raise WeightSourceError(f"weights source {source!r} is not a URL; nothing to fetch")
        path = self.weights_dir / cache_name(source)
        if path.parent != self.weights_dir:  # the name is checked; this is the invariant
            raise WeightSourceError(f"weights source {source} would leave {self.weights_dir}")
        return path

    def is_fetched(self, path: Path | str) -> bool:
        """Say whether llmgw fetched ``path``, and so may delete it: a regular file directly in
        the weights directory, under a cache name matching the source recorded beside it."""
        path = Path(os.path.abspath(path))
        if path.parent != self.weights_dir or parse_cache_name(path.name) is None:
            return False
        if path.is_symlink() or not path.is_file():
            return False
        source = read_source(path)
        if source is None:
            return False
        try:
            return cache_name(source) == path.name
        except WeightSourceError:
            return False

    # -- fetching -----------------------------------------------------------------------

    def ensure(
        self,
        source: str,
        sha256: str = "",
        on_progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> Resolved:
        """Resolve a source, fetching it first when it is a URL not yet here."""
        resolved = self.resolve(source)
        if resolved.kind == "fetched":
            self.fetch(source, sha256, on_progress, cancel)
        return resolved

    def fetch(
        self,
        source: str,
        sha256: str = "",
        on_progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> Path:
        """Return the cache path of a URL source, downloading it first unless it is here.

        Concurrent calls for one source share one download and all see its progress.
        Raises WeightFetchError (ChecksumMismatch, FetchCancelled) naming the source.
        """
        target = self.path_for(source)
        sha256 = normalize_sha256(sha256)
        if target.exists():  # present means nothing is fetched: no request at all
            return target
        while True:
            flight = self._join(source, target, sha256, on_progress)
            if flight is None:
                return target
            try:
                self._wait(flight, cancel)
            finally:
                flight.unwatch(on_progress)
            if flight.path is not None:
                return flight.path
            assert flight.error is not None
            if isinstance(flight.error, FetchCancelled) and not (cancel and cancel.is_set()):
                continue  # the others gave up just as this caller arrived: start afresh
            # A copy per caller: one exception raised in several threads would share a traceback.
            raise copy.copy(flight.error) from flight.error

    def active(self) -> dict[str, int]:
        """Return the downloads in progress: source -> callers waiting on it."""
        with self._lock:
            return {source: flight.waiting for source, flight in self._flights.items()}

    def close(self) -> None:
        """Stop every download; their partial files stay for the next agent to resume."""
        with self._lock:
            self._closed = True
            for flight in self._flights.values():
                flight.abort.set()

    def _join(
        self, source: str, target: Path, sha256: str, on_progress: ProgressCallback | None
    ) -> Flight | None:
        with self._lock:
            if target.exists():
                return None
            if self._closed:  # the agent is stopping: a new download would outlive it
                raise FetchCancelled(f"fetching {source}: the agent is stopping")
            flight = self._flights.get(source)
            if flight is None:
                self.weights_dir.mkdir(parents=True, exist_ok=True)
                flight = Flight(source, target, sha256, self.settings)
                self._flights[source] = flight
                threading.Thread(
                    target=self._work,
                    args=(flight,),
                    name=f"llmgw-fetch-{target.name[:16]}",
                    daemon=True,
                ).start()
            else:
                flight.expect(sha256)
                flight.abort.clear()  # a caller arrived: the download is wanted after all
            flight.waiting += 1
        flight.watch(on_progress)
        return flight

    def _wait(self, flight: Flight, cancel: threading.Event | None) -> None:
        while not flight.done.wait(_CANCEL_POLL if cancel is not None else None):
            if cancel is not None and cancel.is_set():
                with self._lock:
                    flight.waiting -= 1
                    if flight.waiting == 0:
                        flight.abort.set()  # nobody else wants it: stop, keep the partial
                raise FetchCancelled(f"fetching {flight.source} was cancelled")
        with self._lock:
            flight.waiting -= 1

    def _work(self, flight: Flight) -> None:
        while True:
            path: Path | None = None
            error: WeightFetchError | None = None
            try:
                path = download(flight)
            except _Aborted:
                with self._lock:
                    if not flight.abort.is_set():
                        continue  # somebody joined while it stopped: resume for them
                error = FetchCancelled(f"fetching {flight.source} was cancelled")
            except WeightFetchError as exc:
                error = exc
            except OSError as exc:
                error = WeightFetchError(
                    f"fetching {flight.source} into {self.weights_dir} failed: "
                    f"{exc.strerror or exc}; free space or fix permissions there, then retry"
                )
            except Exception as exc:
                log.exception("fetching %s failed unexpectedly", flight.source)
                error = WeightFetchError(f"fetching {flight.source} failed: {exc!r}")
            with self._lock:
                self._flights.pop(flight.source, None)
                flight.finish(path, error)
            if error is not None and not isinstance(error, FetchCancelled):
                log.error("%s", error)
            return

    # -- what the directory holds -------------------------------------------------------

    def list_weights(self) -> list[dict[str, Any]]:
        """List the weights here as WeightFile fields (source, path, size, fetched).

        A fetched file carries its URL as source; an operator's own file, or directory
        holding a model (the look directories' rule: ``holds_a_model``), carries its path.
        A ``.partial`` is never weights, nor a directory holding only part of a model: a
        half-finished copy looks like weights and would send placement to the wrong node.
        """
        weights: list[dict[str, Any]] = []
        for entry in self._entries():
            name = entry.name
            if name.startswith(".") or name.endswith((PARTIAL_SUFFIX, SIDECAR_SUFFIX)):
                continue
            path = self.weights_dir / name
            try:
                if self.is_fetched(path):
                    source = read_source(path) or str(path)
                    weights.append(_weight(source, path, entry.stat().st_size, fetched=True))
                elif entry.is_file():
                    size = entry.stat().st_size
                    if size:
                        weights.append(_weight(str(path), path, size, fetched=False))
                elif entry.is_dir() and holds_a_model(path):
                    weights.append(_weight(str(path), path, _tree_size(path), fetched=False))
            except OSError:
                continue  # gone while listing (reclaimed, or moved by an operator)
        return weights

    def fingerprint(self) -> str:
        """Return a short digest of the listing: send a weights message only when it changes."""
        return fingerprint(self.list_weights())

    def reclaim_unused_weights(self, keep: Iterable[str]) -> list[Path]:
        """Delete fetched files whose source is not in ``keep``; return what was deleted.

        Only files under a cache name with a matching record are touched (and leftover
        partials and records of such names); an operator's own file never is, nor a
        symlink, wherever it points. ``keep`` must hold the sources of every model this
        node may still serve, running shards included.
        """
        keep = set(keep)
        kept_hashes = {source_hash(source) for source in keep}
        deleted: list[Path] = []
        # Under the lock, so no download starts for a file being deleted.
        with self._lock:
            busy = {source_hash(source) for source in self._flights}
            for entry in self._entries():
                path = self.weights_dir / entry.name
                base = entry.name.removesuffix(PARTIAL_SUFFIX).removesuffix(SIDECAR_SUFFIX)
                digest = parse_cache_name(base)
                if digest is None or digest in busy:
                    continue
                if entry.is_symlink():
                    log.warning("not deleting %s: llmgw never fetches a symlink", path)
                    continue
                if entry.name.endswith(PARTIAL_SUFFIX):
                    if digest not in kept_hashes:
                        _unlink(path, deleted)
                elif entry.name.endswith(SIDECAR_SUFFIX):
                    owner = self.weights_dir / base
                    orphan = not owner.exists() and not owner.is_symlink()
                    if orphan and read_source(owner) not in keep:
                        _unlink(path, deleted)
                elif (
                    self.is_fetched(path)
                    and read_source(path) not in keep
                    and _unlink(path, deleted)
                ):
                    sidecar_path(path).unlink(missing_ok=True)
        for path in deleted:
            log.info("reclaimed %s: no model needs it", path)
        return deleted

    def _entries(self) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(self.weights_dir) as entries:
                return sorted(entries, key=lambda entry: entry.name)
        except FileNotFoundError:
            return []


def fingerprint(weights: list[dict[str, Any]]) -> str:
    """Return a short digest of paths, sizes and sources, independent of their order."""
    rows = sorted(
        (w["path"], w["size"], w["source"], w["fetched"], w.get("store", "")) for w in weights
    )
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def _weight(source: str, path: Path, size: int, *, fetched: bool) -> dict[str, Any]:
    return {"source": source, "path": str(path), "size": size, "fetched": fetched}


def _tree_size(directory: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
            except OSError:
                continue
    return total


def _unlink(path: Path, deleted: list[Path]) -> bool:
    try:
        path.unlink()
    except OSError as exc:
        log.warning("could not delete %s: %s", path, exc.strerror or exc)
        return False
    deleted.append(path)
    return True
