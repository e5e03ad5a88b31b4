"""One download of one URL: written beside its target, resumed with a Range request,
checked, and renamed into place only when whole.

A partial file under the model's name would be found by the next scan, reported as
present and handed to an engine that fails on it; hence ``<target>.partial``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from agent_worker.weights import outbound
from agent_worker.weights.access import restrict
from agent_worker.weights.names import PARTIAL_SUFFIX
from agent_worker.weights.sidecar import write_sidecar
from core.files import fsync_directory, size_or_zero

log = logging.getLogger("llmgw.agent.weights")

ProgressCallback = Callable[[int, int | None, float | None], None]
"""Called with (bytes so far, total or None when the server sent none, bytes per second)."""

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED_RANGE = re.compile(r"bytes \*/(\d+)")


class WeightFetchError(RuntimeError):
    """A fetch that failed, naming the source and what to do about it."""


class ChecksumMismatch(WeightFetchError):
    """The file fetched is not the one the catalog's sha256 describes."""


class FetchCancelled(WeightFetchError):
    """Everyone waiting on a fetch gave up; the partial stays for the next try to resume."""


class _Aborted(Exception):
    """Raised inside the download when its flight's abort is set."""


class _Restart(Exception):
    """The partial file cannot be continued; the download starts from byte zero."""


@dataclass(frozen=True)
class FetchSettings:
    """How downloads run; tests shrink the interval and the backoff."""

    # Once a second is enough to tell a moving download from a wedged one.
    progress_interval: float = 1.0
    attempts: int = outbound.ATTEMPTS
    backoff: float = outbound.BACKOFF
    clock: Callable[[], float] = time.monotonic


def partial_path(target: Path) -> Path:
    """Return where ``target`` is written until it is whole."""
    return target.with_name(target.name + PARTIAL_SUFFIX)


class Flight:
    """One download in progress and everyone waiting on it.

    Watchers are keyed by source, not by shard: eight shards starting together want
    the same file, produce one download, and all eight see its progress.
    """

    def __init__(self, source: str, target: Path, sha256: str, settings: FetchSettings) -> None:
        self.source = source
        self.target = target
        self.sha256 = sha256
        self.settings = settings
        self.abort = threading.Event()
        self.done = threading.Event()
        self.path: Path | None = None
        self.error: WeightFetchError | None = None
        self.waiting = 0
        self._lock = threading.Lock()
        self._watchers: list[ProgressCallback] = []
        self._last: tuple[int, int | None, float | None] | None = None
        self._mark: tuple[float, int] = (settings.clock(), 0)

    def expect(self, sha256: str) -> None:
        """Add a caller's expected digest; two different ones cannot both be right."""
        if not sha256:
            return
        if self.sha256 and self.sha256 != sha256:
            raise WeightFetchError(
                f"{self.source} is expected with sha256 {self.sha256} by one shard and "
                f"{sha256} by another; correct the catalog so both agree"
            )
        self.sha256 = sha256

    def watch(self, callback: ProgressCallback | None) -> None:
        """Add a watcher, telling it at once how far the download has got."""
        if callback is None:
            return
        with self._lock:
            self._watchers.append(callback)
            last = self._last
        if last is not None:
            _call(callback, last, self.source)

    def unwatch(self, callback: ProgressCallback | None) -> None:
        with self._lock:
            if callback in self._watchers:
                self._watchers.remove(callback)

    def begin(self, have: int) -> None:
        """Start measuring the rate from here (a new request, maybe after a pause)."""
        with self._lock:
            self._mark = (self.settings.clock(), have)

    def progress(self, have: int, total: int | None, *, final: bool = False) -> None:
        """Tell watchers how far the download has got, at most once per interval."""
        now = self.settings.clock()
        with self._lock:
            then, before = self._mark
            if not final and now - then < self.settings.progress_interval:
                return
            rate = (have - before) / (now - then) if now > then and have >= before else None
            self._mark = (now, have)
            self._last = (have, total, rate)
            watchers = list(self._watchers)
        for callback in watchers:
            _call(callback, (have, total, rate), self.source)

    def finish(self, path: Path | None, error: WeightFetchError | None) -> None:
        self.path, self.error = path, error
        self.done.set()


def _call(
    callback: ProgressCallback, report: tuple[int, int | None, float | None], source: str
) -> None:
    try:
        callback(*report)
    except Exception:
        # A watcher that breaks must not break the download seven other shards wait on.
        log.exception("a progress watcher of %s failed", source)


def download(flight: Flight) -> Path:
    """Fetch ``flight``'s source to its target, resuming whatever partial file is there."""
    return _Download(flight).run()


class _Download:
    def __init__(self, flight: Flight) -> None:
        self.flight = flight
        self.source = flight.source
        self.partial = partial_path(flight.target)
        self.validator = ""
        self.total: int | None = None
        self.hasher = hashlib.sha256()
        self.hashed = -1
        self.resumable = True

    def run(self) -> Path:
        settings = self.flight.settings
        failures = 0
        while True:
            self._check_abort()
            before = size_or_zero(self.partial)
            try:
                if self._attempt(before):
                    return self._install()
                problem = f"the body ended at byte {size_or_zero(self.partial)} of {self.total}"
            except _Restart as exc:
                log.warning("fetching %s: %s; starting over", self.source, exc)
                self.partial.unlink(missing_ok=True)
                problem = str(exc)
            except httpx.TransportError as exc:
                self._check_abort()
                problem = f"{type(exc).__name__}: {exc}"
                if not self.resumable:
                    self.partial.unlink(missing_ok=True)
            except outbound.OutboundError as exc:
                self._check_abort()
                raise WeightFetchError(
                    f"could not fetch {self.source}: {exc}; {size_or_zero(self.partial)} bytes "
                    "are kept for the next try to resume"
                ) from exc
            after = size_or_zero(self.partial)
            # Only breaks that get nowhere count: a flaky link that keeps moving is kept at.
            failures = 1 if after > before else failures + 1
            if failures > settings.attempts:
                raise WeightFetchError(
                    f"fetching {self.source} broke off {failures} times without progress "
                    f"(last: {problem}); {after} bytes are kept for the next try to resume"
                )
            log.warning(
                "fetching %s broke off at %d bytes (%s); resuming", self.source, after, problem
            )
            if not outbound.wait_before_retry(failures, settings.backoff, self.flight.abort):
                raise _Aborted

    def _check_abort(self) -> None:
        if self.flight.abort.is_set():
            raise _Aborted

    def _attempt(self, have: int) -> bool:
        """Make one request; True when the partial file now holds the whole file."""
        settings = self.flight.settings
        headers = {"Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
            # So a file replaced at the URL starts over instead of splicing two versions.
            if self.validator:
                headers["If-Range"] = self.validator
        with outbound.stream_get(
            self.source,
            headers,
            attempts=settings.attempts,
            backoff=settings.backoff,
            cancel=self.flight.abort,
        ) as response:
            offset = self._offset(response, have)
            self.validator = _validator(response) or self.validator
            if offset is None:
                if self.hashed != have:
                    self.hasher, self.hashed = _hash_file(self.partial), have
                return True
            self._receive(response, offset)
        return self.total is None or size_or_zero(self.partial) == self.total

    def _offset(self, response: httpx.Response, have: int) -> int | None:
        """Return where the body starts in the file, or None when the partial is whole."""
        status = response.status_code
        encoding = response.headers.get("content-encoding", "identity").lower()
        # Decoded bytes have no offsets a Range could name: such a fetch cannot resume.
        self.resumable = encoding in ("identity", "")
        if status == 206:
            match = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", "").strip())
            if not match or int(match.group(1)) != have:
                raise _Restart(
                    f"the server answered Range {have}- with Content-Range "
                    f"{response.headers.get('content-range')!r}"
                )
            self.total = None if match.group(3) == "*" else int(match.group(3))
            return have
        if status == 200:
            if have:
                log.info("fetching %s: the server ignored Range; starting over", self.source)
            length = response.headers.get("content-length", "")
            self.total = int(length) if length.isdigit() and self.resumable else None
            return 0
        if status == 416 and have:
            match = _UNSATISFIED_RANGE.fullmatch(response.headers.get("content-range", "").strip())
            if match and int(match.group(1)) == have:
                self.total = have
                return None
            raise _Restart(f"the server holds fewer bytes than the {have} already here")
        raise WeightFetchError(
            f"GET {self.source} answered {status} {response.reason_phrase}; check the "
            "model's source in the catalog (and that this node may reach it)"
        )

    def _receive(self, response: httpx.Response, offset: int) -> None:
        if not offset:
            self.hasher, self.hashed = hashlib.sha256(), 0
        elif self.hashed != offset:
            # Resuming a partial left by an earlier run: its bytes count toward the digest.
            self.hasher, self.hashed = _hash_file(self.partial), offset
        have = offset
        self.flight.begin(have)
        # As they arrive: a fixed chunk size would hold back the tail of a broken transfer.
        chunks = response.iter_raw() if self.resumable else response.iter_bytes()
        # The agent's alone until it is whole, then its group's (access.restrict).
        with open(self.partial, "ab" if offset else "wb", opener=_private) as out:
            try:
                for chunk in chunks:
                    self._check_abort()
                    out.write(chunk)
                    self.hasher.update(chunk)
                    have += len(chunk)
                    self.hashed = have
                    self.flight.progress(have, self.total)
            finally:
                out.flush()
                os.fsync(out.fileno())

    def _install(self) -> Path:
        target = self.flight.target
        digest = self.hasher.hexdigest()
        size = size_or_zero(self.partial)
        expected = self.flight.sha256
        if expected and digest != expected:
            self.partial.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"{self.source}: the file fetched has sha256 {digest}, not the expected "
                f"{expected}; it was deleted. Check the sha256 in the catalog, or whether "
                "the file at the URL was replaced"
            )
        # The record first: a file under its cache name always says where it came from.
        write_sidecar(target, self.source, digest, size)
        os.replace(self.partial, target)
        restrict(target)
        fsync_directory(target.parent)
        self.flight.progress(size, self.total, final=True)
        log.info("fetched %s to %s (%d bytes)", self.source, target, size)
        return target


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def _validator(response: httpx.Response) -> str:
    etag = response.headers.get("etag", "")
    if etag and not etag.startswith("W/"):  # If-Range takes only a strong validator
        return etag
    return response.headers.get("last-modified", "")


def _hash_file(path: Path) -> hashlib._Hash:
    hasher = hashlib.sha256()
    with open(path, "rb") as data:
        while block := data.read(1 << 20):
            hasher.update(block)
    return hasher
