"""The weights this node holds, and telling the control plane when that changes: what
llmgw fetched (the weights store) and the model files found in the look directories, as
one listing.

The periodic probe, the register, a collect and a prefetch all list and tell under one
lock: a collect and a prefetch finishing together must not leave the control plane with
the older listing while the agent thinks it told the newer one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from agent_worker.link import AgentLink
from agent_worker.weights import WeightFetchError, WeightSourceError, WeightStore, fingerprint
from agent_worker.weights.look import LookDirs, list_look_dirs
from protocol import messages

log = logging.getLogger("llmgw.agent")


class NodeWeights:
    """What the node holds of weights, and what it last told the control plane of it."""

    def __init__(self, store: WeightStore, look_dirs: LookDirs, link: AgentLink) -> None:
        self.store = store
        self.look_dirs = look_dirs
        self.link = link
        self._lock = threading.Lock()
        self._fingerprint = ""

    def for_register(self) -> list[messages.WeightFile]:
        """The listing a register carries; it replaces any listing still queued."""
        with self._lock:
            # The register says them anew: a listing queued earlier would follow and undo it.
            self.link.forget("weights")
            return self._list()[0]

    def tell_if_changed(self) -> bool:
        """Send a weights message when what the node holds changed since it last said.

        Sent under the lock that made it, so listings reach the link in the order made.
        """
        with self._lock:
            held, before = self._list()
            if self._fingerprint == before:
                return False
            self.link.send_latest("weights", messages.Weights(weights=held))
        return True

    def collect(self, keep: Iterable[str]) -> list[str]:
        """Delete fetched weights no source in ``keep`` names; say what is held after."""
        deleted = self.store.reclaim_unused_weights(set(keep))
        for path in deleted:
            log.info("deleted unused weights %s", path)
        self.tell_if_changed()
        return [str(path) for path in deleted]

    def prefetch(self, source: str, sha256: str = "") -> dict:
        """Fetch ``source`` into the weights directory in a thread of its own; the weights
        message says when it is here. Only a URL is fetched: a path or a hub id is not."""
        try:
            resolved = self.store.resolve(source)
        except WeightSourceError as exc:
            return {"fetching": False, "reason": str(exc)}
        if resolved.kind != "fetched" or resolved.path is None:
            return {"fetching": False, "reason": f"{source} is not a URL llmgw fetches"}
        if resolved.path.exists():
            return {"fetching": False, "reason": f"{source} is already here"}

        def fetch() -> None:
            try:
                self.store.fetch(source, sha256)
            except WeightFetchError as exc:
                log.error("fetching %s ahead of need failed: %s", source, exc)
                return
            log.info("fetched %s ahead of need", source)
            self.tell_if_changed()

        log.info("fetching %s ahead of need, as the control plane asked", source)
        threading.Thread(target=fetch, name="llmgw-prefetch", daemon=True).start()
        return {"fetching": True, "reason": ""}

    def _list(self) -> tuple[list[messages.WeightFile], str]:
        """What the node holds, and the fingerprint it replaced; call under _lock."""
        held = self.store.list_weights() + list_look_dirs(self.look_dirs)
        before, self._fingerprint = self._fingerprint, fingerprint(held)
        return [messages.WeightFile(**weight) for weight in held], before
