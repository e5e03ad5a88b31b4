"""Turning a start_shard command into running processes: resolve the weights (fetching a
URL once, with progress), validate the profile, then hand the commands to the supervisor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from agent_worker.engines import get_adapter
from agent_worker.supervisor import ShardTransition, Supervisor
from agent_worker.weights import FetchCancelled, WeightFetchError, WeightSourceError, WeightStore
from protocol import messages
from protocol.shard import ShardSpec, ShardState

log = logging.getLogger("llmgw.agent.launcher")


class ShardLauncher:
    """Start shards; a shard whose weights are downloading is tracked here until launch."""

    def __init__(
        self,
        node_id: str,
        supervisor: Supervisor,
        weights: WeightStore,
        engine_paths: Callable[[], dict[str, str]],
        report: Callable[[ShardTransition], None],
        send: Callable[[messages.ShardProgress], None],
    ) -> None:
        self.node_id = node_id
        self.supervisor = supervisor
        self.weights = weights
        self.engine_paths = engine_paths
        self.report = report
        self.send = send
        self.fetching: dict[str, threading.Event] = {}
        self.fetching_specs: dict[str, ShardSpec] = {}
        self._lock = threading.Lock()

    def start(self, spec: ShardSpec) -> ShardState:
        with self._lock:
            if spec.shard_id in self.fetching:
                return "fetching"
        try:
            resolved = self.weights.resolve(spec.source)
        except WeightSourceError as exc:
            return self._refuse(spec, str(exc))
        if resolved.model_path and not spec.model_path:
            spec = spec.model_copy(update={"model_path": resolved.model_path})
        problems = self.problems(spec, check_file=resolved.kind == "local")
        if problems:
            return self._refuse(spec, "; ".join(problems))
        if resolved.kind == "fetched" and resolved.path and not resolved.path.exists():
            return self._fetch_then_launch(spec)
        return self._launch(spec)

    def downloading(self) -> list[ShardSpec]:
        """Shards waiting for their weights: the register must report them too."""
        with self._lock:
            return list(self.fetching_specs.values())

    def stop(self, shard_id: str) -> bool:
        """Cancel a download in progress; True if there was one."""
        with self._lock:
            cancel = self.fetching.pop(shard_id, None)
            self.fetching_specs.pop(shard_id, None)
        if cancel is None:
            return False
        cancel.set()
        return True

    def problems(self, spec: ShardSpec, check_file: bool) -> list[str]:
        """Everything wrong with a spec, found in milliseconds, before anything loads."""
        problems = get_adapter(spec.engine).validate(spec)
        engine_paths = self.engine_paths()
        if spec.engine not in engine_paths:
            problems.append(
                f"engine {spec.engine} is not installed on {self.node_id}; "
                f"found: {', '.join(sorted(engine_paths)) or 'none'}"
            )
        if check_file and spec.model_path and not Path(spec.model_path).exists():
            problems.append(f"model file {spec.model_path} is not on this node")
        return problems

    def _launch(self, spec: ShardSpec) -> ShardState:
        adapter = get_adapter(spec.engine)
        commands = adapter.commands(spec, self.engine_paths()[spec.engine])
        return self.supervisor.start(
            spec, commands, adapter.serves_http(spec.rank), adapter.health_path
        )

    def _fetch_then_launch(self, spec: ShardSpec) -> ShardState:
        cancel = threading.Event()
        with self._lock:
            self.fetching[spec.shard_id] = cancel
            self.fetching_specs[spec.shard_id] = spec
        self._transition(spec, "fetching", f"fetching {spec.source}")
        thread = threading.Thread(
            target=self._fetch, args=(spec, cancel), name=f"fetch-{spec.shard_id[:8]}", daemon=True
        )
        thread.start()
        return "fetching"

    def _fetch(self, spec: ShardSpec, cancel: threading.Event) -> None:
        def progress(done: int, total: int | None, rate: float | None) -> None:
            self.send(
                messages.ShardProgress(shard_id=spec.shard_id, bytes=done, total=total, rate=rate)
            )

        try:
            path = self.weights.fetch(spec.source, spec.sha256, on_progress=progress, cancel=cancel)
        except FetchCancelled:
            self._transition(spec, "stopped", "stopped while its weights were downloading")
            return
        except WeightFetchError as exc:
            self._forget(spec.shard_id)
            self._refuse(spec, f"fetching {spec.source} failed: {exc}")
            return
        if not self._forget(spec.shard_id):
            return  # stopped while the download finished
        self._launch(spec.model_copy(update={"model_path": str(path)}))

    def _forget(self, shard_id: str) -> bool:
        with self._lock:
            self.fetching_specs.pop(shard_id, None)
            return self.fetching.pop(shard_id, None) is not None

    def _refuse(self, spec: ShardSpec, reason: str) -> ShardState:
        log.error("refusing shard %s: %s", spec.shard_id, reason)
        self._transition(spec, "failed", reason)
        return "failed"

    def _transition(self, spec: ShardSpec, state: ShardState, reason: str) -> None:
        self.report(
            ShardTransition(
                shard_id=spec.shard_id,
                replica_id=spec.replica_id,
                state=state,
                reason=reason,
                fingerprint=spec.fingerprint,
            )
        )
