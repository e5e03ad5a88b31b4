"""Converging a node on the engine versions the control plane names, one at a time, in a
thread of its own so that heartbeats and running shards never wait on an install.

An install is done in a fresh directory beside the install root and renamed to
``<root>/<engine>/<version>/`` only once its binary has found every library and answered
``--version``; the marker written just before the rename is what makes a directory an
install of llmgw's, and only such directories are ever removed. A failure leaves nothing
but its log line, keeps its reason as the version's status, and is tried again after one
minute, doubling to ten.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from agent_worker.engines.install.apt import AptSettings, install_packages
from agent_worker.engines.install.archive import unpack
from agent_worker.engines.install.builds import NodeTarget, choose_build
from agent_worker.engines.install.checks import check_libraries, check_version
from agent_worker.engines.install.errors import InstallError
from agent_worker.engines.install.layout import (
    MARKER,
    find_binary,
    is_ours,
    put_in_place,
    write_marker,
)
from agent_worker.engines.install.paths import inside, path_token
from agent_worker.engines.install.prebuilt import install_prebuilt_llama
from agent_worker.engines.install.python_env import PipSettings, install_python_engine
from agent_worker.engines.llama_cpp import RPC_SERVERS
from agent_worker.weights.fetch import FetchSettings, Flight, WeightFetchError, download
from core.humanize import format_bytes
from protocol.engines import (
    PIP_ENGINES,
    EngineBuild,
    EngineInstall,
    EngineStatusWord,
    WantedEngine,
)

log = logging.getLogger("llmgw.agent.engines")

# The executable a build may hold beside that one (under any of these names), and what it
# makes possible.
ARCHIVE_COMPANIONS = {"llama.cpp": (RPC_SERVERS, "replicas across nodes")}


@dataclass(frozen=True)
class InstallSettings:
    root: Path  # <root>/<engine>/<version>/
    staging: Path  # beside root, on the same filesystem, so the last step is a rename
    downloads: Path
    apt: AptSettings = field(default_factory=AptSettings)
    fetch: FetchSettings = field(default_factory=FetchSettings)
    pip: PipSettings = field(default_factory=PipSettings)
    version_timeout: float = 10.0
    recheck_interval: float = 600.0
    retry_first: float = 60.0
    retry_max: float = 600.0
    clock: Callable[[], float] = time.monotonic


@dataclass
class _Version:
    """One engine version: how it stands, and when it is next looked at."""

    install: EngineInstall
    failures: int = 0
    next_attempt: float = 0.0
    checked_at: float | None = None


class EngineInstaller:
    def __init__(
        self,
        settings: InstallSettings,
        target: NodeTarget,
        on_change: Callable[[], None] = lambda: None,
        in_use: Callable[[], set[tuple[str, str]]] = set,
    ) -> None:
        self.settings = settings
        self.target = target
        self.on_change = on_change
        self.in_use = in_use
        self._wanted: list[WantedEngine] | None = None  # None: not told yet, touch nothing
        self._versions: dict[tuple[str, str], _Version] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._flight: Flight | None = None
        self._thread: threading.Thread | None = None
        self._sweep_staging()
        for install in self._installed_on_disk():
            self._versions[(install.engine, install.version)] = _Version(install)

    # -- what the rest of the agent calls ----------------------------------------------

    def want(self, engines: list[WantedEngine]) -> None:
        with self._lock:
            self._wanted = list(engines)
            for engine in engines:
                if engine.key not in self._versions:
                    self._versions[engine.key] = _Version(
                        _status(engine, "installing", "waiting its turn")
                    )
        self._wake.set()
        self.on_change()

    def statuses(self) -> list[EngineInstall]:
        with self._lock:
            return [self._versions[key].install for key in sorted(self._versions)]

    def next_attempt_at(self, engine: str, version: str) -> float | None:
        with self._lock:
            known = self._versions.get((engine, version))
            return known.next_attempt if known and known.failures else None

    def wake(self) -> None:
        """Run a pass now: a shard ended, and what it pinned may be free to remove."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="llmgw-engines", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        self._stopping.set()
        self._wake.set()
        flight = self._flight
        if flight is not None:
            flight.abort.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the passes ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.converge_once()
            except Exception:
                log.exception("an engine install pass failed; trying again later")
            self._wake.wait(self._seconds_to_next())
            self._wake.clear()

    def _seconds_to_next(self) -> float:
        now = self.settings.clock()
        with self._lock:
            due = [v.next_attempt for v in self._versions.values() if v.failures]
            due += [
                (v.checked_at or now) + self.settings.recheck_interval
                for v in self._versions.values()
                if v.install.installed
            ]
        return max(1.0, min([*due, now + self.settings.recheck_interval]) - now)

    def converge_once(self) -> None:
        """Install what is wanted and missing, re-check what is due, remove what is not
        wanted; one version at a time, synchronously."""
        with self._lock:
            wanted = None if self._wanted is None else list(self._wanted)
        if wanted is None:
            return
        for engine in wanted:
            if self._stopping.is_set():
                return
            if engine.key not in self._wanted_now():
                continue  # dropped while an earlier version installed: never begun
            now = self.settings.clock()
            with self._lock:
                version = self._versions[engine.key]
                installed, checked = version.install.installed, version.checked_at
                waiting = version.failures and version.next_attempt > now
            if installed and version.install.managed:
                if checked is None or now - checked >= self.settings.recheck_interval:
                    self._recheck(engine, version)
            elif not installed and not waiting:
                self._install(engine)
        self._remove_unwanted(self._wanted_now())

    def _wanted_now(self) -> set[tuple[str, str]]:
        # Read again after the installs: a version the control plane dropped while it was
        # being installed is unwanted now, and must not stay to take shards.
        with self._lock:
            return {engine.key for engine in self._wanted or []}

    def _install(self, engine: WantedEngine) -> None:
        label = f"{engine.name} {engine.version}"
        log.info("installing %s", label)
        self._say(engine, "installing", "starting")
        try:
            path = self._install_one(engine)
        except InstallError as exc:
            self._failed(engine, str(exc))
            return
        except Exception as exc:
            log.exception("installing %s failed unexpectedly", label)
            self._failed(engine, f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self._versions[engine.key] = _Version(
                _status(engine, "installed", path=path), checked_at=self.settings.clock()
            )
        log.info("installed %s at %s", label, path)
        self.on_change()

    def _failed(self, engine: WantedEngine, reason: str) -> None:
        with self._lock:
            known = self._versions.get(engine.key)
            failures = (known.failures if known else 0) + 1
            delay = min(self.settings.retry_max, self.settings.retry_first * 2 ** (failures - 1))
            self._versions[engine.key] = _Version(
                _status(engine, "failed", reason), failures, self.settings.clock() + delay
            )
        log.error("installing %s %s failed: %s; trying again in %.0f s",
                  engine.name, engine.version, reason, delay)  # fmt: skip
        self.on_change()

    def _install_one(self, engine: WantedEngine) -> str:
        name = path_token("engine name", engine.name)
        final = inside(self.settings.root, name, path_token("engine version", engine.version))
        if final.is_symlink() or (final.exists() and not (final / MARKER).exists()):
            raise InstallError(f"{final} is there and not llmgw's; move it away to install")
        if engine.name in PIP_ENGINES:
            if final.exists():
                shutil.rmtree(final)  # a broken install of ours: made again at its path
            path = install_python_engine(
                engine.name, engine.version, final, self.settings.pip,
                lambda detail: self._say(engine, "installing", detail),
                self.settings.version_timeout,
            )  # fmt: skip
            write_marker(final, engine, Path(path).relative_to(final), build="pip")
            return path
        build = choose_build(engine, self.target)
        if not build.pip:
            return self._install_archive(engine, build, final)
        if final.exists():
            shutil.rmtree(final)  # a broken install of ours: made again at its path
        path = install_prebuilt_llama(
            build, engine.version, final, self.settings.pip,
            lambda detail: self._say(engine, "installing", detail),
            self.settings.version_timeout,
        )  # fmt: skip
        relative = Path(path).relative_to(final)
        write_marker(final, engine, relative, build=build.name, sha256=build.sha256)
        return path

    def _install_archive(self, engine: WantedEngine, build: EngineBuild, final: Path) -> str:
        filename = Path(unquote(urlparse(build.url).path)).name or f"{build.name}.tar.gz"
        downloads = inside(self.settings.downloads, f"{engine.name}-{engine.version}")
        inside(downloads, filename)
        self.settings.staging.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(dir=self.settings.staging, prefix=f"{engine.name}-"))
        try:
            downloads.mkdir(parents=True, exist_ok=True)
            archive = self._download(engine, build.url, build.sha256, downloads / filename)
            self._say(engine, "installing", f"unpacking {filename}")
            unpack(archive, staged)
            binary = find_binary(staged, engine.name, filename)
            if build.packages:
                if self.settings.apt.available():
                    say = lambda status, detail: self._say(engine, status, detail)  # noqa: E731
                    install_packages(build.packages, self.settings.apt, say)
                else:
                    log.warning("%s needs %s but this node has no apt; checking its libraries "
                                "as they are", filename, ", ".join(build.packages))  # fmt: skip
            self._say(engine, "installing", f"checking {binary.name}")
            check_libraries(binary)
            check_version(binary, self.settings.version_timeout)
            self._check_companions(engine, binary, filename)
            relative = binary.relative_to(staged)
            write_marker(staged, engine, relative, build=build.name, sha256=build.sha256)
            put_in_place(staged, final)
            return str(final / relative)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
            shutil.rmtree(downloads, ignore_errors=True)

    def _check_companions(self, engine: WantedEngine, binary: Path, archive: str) -> None:
        """Make the executable beside the engine's that widens what it can do runnable and
        check its libraries; say plainly what a build without it cannot do."""
        names, enables = ARCHIVE_COMPANIONS.get(engine.name, ((), ""))
        for name in names:
            companion = binary.parent / name
            if companion.is_file() and not companion.is_symlink():
                companion.chmod(companion.stat().st_mode | 0o111)
                check_libraries(companion)
                return
        if names:
            log.warning("%s %s: %s holds no %s beside %s; this build cannot run %s",
                        engine.name, engine.version, archive, " or ".join(names), binary.name,
                        enables)  # fmt: skip

    def _download(self, engine: WantedEngine, url: str, sha256: str, target: Path) -> Path:
        name = target.name

        def progress(done: int, total: int | None, _rate: float | None) -> None:
            if total:
                detail = f"downloading {name} ({format_bytes(total)}, {100 * done // total}%)"
            else:
                detail = f"downloading {name} ({format_bytes(done)} so far)"
            self._say(engine, "installing", detail)

        flight = Flight(url, target, sha256, self.settings.fetch)
        flight.watch(progress)
        self._flight = flight
        self._say(engine, "installing", f"downloading {name}")
        try:
            return download(flight)
        except WeightFetchError as exc:
            raise InstallError(f"{name}: {exc}") from None
        except OSError as exc:
            raise InstallError(f"downloading {name} failed: {exc}") from None
        except Exception:
            if flight.abort.is_set():
                raise InstallError(f"downloading {name} stopped: the agent is stopping") from None
            raise
        finally:
            self._flight = None

    def _recheck(self, engine: WantedEngine, version: _Version) -> None:
        binary = Path(version.install.path)
        try:
            if not binary.is_file():
                raise InstallError(f"{binary} is gone")
            check_libraries(binary)
            check_version(binary, self.settings.version_timeout)
        except InstallError as exc:
            log.error("%s %s no longer runs: %s; installing it again",
                      engine.name, engine.version, exc)  # fmt: skip
            self._failed(engine, str(exc))
            with self._lock:  # reinstall at once, not after a back-off
                self._versions[engine.key].next_attempt = 0.0
            self._install(engine)
            return
        with self._lock:
            version.checked_at = self.settings.clock()

    def _remove_unwanted(self, wanted: set[tuple[str, str]]) -> None:
        in_use = self.in_use()
        changed = False
        for install in self._installed_on_disk():
            key = (install.engine, install.version)
            if key in wanted or key in in_use:
                continue
            directory = self.settings.root / install.engine / install.version
            if not is_ours(directory, self.settings.root):
                continue
            shutil.rmtree(directory)
            log.info("removed %s %s: the catalog no longer names it", *key)
            with self._lock:
                self._versions.pop(key, None)
            changed = True
        with self._lock:  # versions dropped before they ever installed
            for key in [k for k, v in self._versions.items()
                        if k not in wanted and not v.install.installed]:  # fmt: skip
                self._versions.pop(key)
                changed = True
        if changed:
            self.on_change()

    # -- small parts ---------------------------------------------------------------------

    def _say(self, engine: WantedEngine, status: EngineStatusWord, detail: str) -> None:
        with self._lock:
            known = self._versions.get(engine.key)
            now = _status(engine, status, detail)
            if known is not None and known.install == now:
                return
            if known is None:
                self._versions[engine.key] = _Version(now)
            else:
                known.install = now
        self.on_change()

    def _installed_on_disk(self) -> list[EngineInstall]:
        found = []
        for marker in sorted(self.settings.root.glob(f"*/*/{MARKER}")):
            directory = marker.parent
            try:
                record = json.loads(marker.read_text())
                binary = directory / record["binary"]
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("%s: unreadable install marker; leaving it alone", marker)
                continue
            if not is_ours(directory, self.settings.root):
                continue
            found.append(
                EngineInstall(
                    engine=directory.parent.name, version=directory.name, path=str(binary),
                    status="installed" if binary.is_file() else "failed",
                    detail="" if binary.is_file() else f"{binary} is gone", managed=True,
                )
            )  # fmt: skip
        return found

    def _sweep_staging(self) -> None:
        # What a crash mid-install left: never a finished install, always safe to drop.
        for leftover in (self.settings.staging, self.settings.downloads):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)


def _status(
    engine: WantedEngine, status: EngineStatusWord, detail: str = "", path: str = ""
) -> EngineInstall:
    return EngineInstall(
        engine=engine.name, version=engine.version, path=path, status=status, detail=detail,
        managed=True,
    )  # fmt: skip
