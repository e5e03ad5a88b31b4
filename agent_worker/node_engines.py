"""The engines this node has, from the two places an engine may come from: the agent
file, which names engines installed by other means (reported as not managed), and
llmgw's own installer, which reports every version it installs, how far it has got,
and why one failed. Only ``installed`` entries run shards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from agent_worker.engines.install import EngineInstaller
from agent_worker.engines.probe import FoundEngine, ProbeConfig, probe_engines
from protocol.engines import EngineInstall, WantedEngine, chosen_install


class NodeEngines:
    def __init__(self, probe_config: ProbeConfig, installer: EngineInstaller | None) -> None:
        self.probe_config = probe_config
        self.installer = installer
        self._named: list[EngineInstall] = []
        self._lock = threading.Lock()
        self._said_lock = threading.Lock()  # taken before _lock and the installer's
        self._last_said: list[EngineInstall] | None = None
        # Until the first probe the engines the agent file names are not known: a register
        # sent before says so, and nothing is told, so no restart reads as "gained sglang".
        self._probed = False

    @property
    def probed(self) -> bool:
        """Whether the engines the agent file names have been looked at since start."""
        with self._lock:
            return self._probed

    def probe(self) -> None:
        """Look again at the engines the agent file names (none is run)."""
        named = [_named(found) for found in probe_engines(self.probe_config).values()]
        with self._lock:
            self._named = named
            self._probed = True

    def want(self, engines: list[WantedEngine]) -> None:
        if self.installer is not None:
            self.installer.want(engines)

    def shard_ended(self) -> None:
        """A shard stopped: the engine version it pinned, if nothing wants it any more, is
        removed by a pass now rather than at the next ten-minute one."""
        if self.installer is not None:
            self.installer.wake()

    def statuses(self) -> list[EngineInstall]:
        """Every engine version here with its status: llmgw's installs, then the named."""
        managed = self.installer.statuses() if self.installer is not None else []
        with self._lock:
            return [*managed, *self._named]

    def tell_if_changed(self, tell: Callable[[list[EngineInstall]], None]) -> bool:
        """Hand the statuses to ``tell`` when they differ from what was last said.

        Read, compared and told under one lock: two threads reading at once must not tell
        in the other order, or a late "installing" would stand over "installed" until the
        next change.
        """
        with self._said_lock:
            if not self.probed:
                return False  # half the list; the first after the probe says it whole
            statuses = self.statuses()
            if statuses == self._last_said:
                return False
            self._last_said = statuses
            tell(statuses)
        return True

    def said_in_register(
        self, forget_unsent: Callable[[], None]
    ) -> tuple[bool, list[EngineInstall]]:
        """Whether the engines were probed, and the statuses for a register, which says
        them anew: one told earlier and not yet sent is forgotten (``forget_unsent``), or
        it would follow and undo it. Before the first probe the control plane keeps what
        it knew, and the first list told after the probe is told whatever it says."""
        with self._said_lock:
            probed = self.probed
            statuses = self.statuses()
            self._last_said = statuses if probed else None
            forget_unsent()
        return probed, statuses

    def find(self, engine: str, version: str = "") -> str | None:
        """The executable for ``engine`` at ``version`` ("" any): llmgw's install first,
        since the catalog named it, then the newest version."""
        best = chosen_install(self.statuses(), engine, version)
        return best.path if best is not None else None

    def names(self) -> list[str]:
        return sorted({install.engine for install in self.statuses() if install.installed})


def _named(found: FoundEngine) -> EngineInstall:
    where = "named in the agent file" if found.found_by == "configured" else found.found_by
    return EngineInstall(
        engine=found.engine, version=found.version, path=found.path, detail=where, managed=False
    )
