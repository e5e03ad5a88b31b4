"""Turning a start_shard command into running processes: resolve the weights (fetching a
URL once, with progress), validate the profile, then hand the commands to the supervisor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from agent_worker.engines import get_adapter
from agent_worker.engines.validation import loader_env_problems
from agent_worker.supervision.shard import StatusSequence
from agent_worker.supervisor import ShardTransition, Supervisor
from agent_worker.walls import WallError, Walls
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
        find_engine: Callable[[str, str], str | None],
        report: Callable[[ShardTransition], None],
        send: Callable[[messages.ShardProgress], None],
        sequence: StatusSequence | None = None,
        allowed_env: Collection[str] = (),
        walls: Walls | None = None,
    ) -> None:
        self.node_id = node_id
        # The node's firewall: each shard's ports walled before its engine starts.
        self.walls = walls
        # The loader variables this node's own config lets a profile set (allow_env:).
        self.allowed_env = allowed_env
        self.supervisor = supervisor
        self.weights = weights
        # (engine, version; "" any) -> the executable to run it with, None if not here
        self.find_engine = find_engine
        self.report = report
        self.send = send
        self.sequence = sequence or StatusSequence()
        self._downloads: dict[str, Download] = {}
        self._lock = threading.Lock()

    def start(self, spec: ShardSpec) -> ShardState:
        with self._lock:
            if spec.shard_id in self._downloads:
                return "fetching"
        if not get_adapter(spec.engine).needs_weights(spec.rank):
            # A worker sent its tensors by rank 0 (rpc-server): nothing to fetch or hold.
            problems = self.problems(spec, check_file=False)
            return self.refuse(spec, "; ".join(problems)) if problems else self._launch(spec)
        try:
            resolved = self.weights.resolve(spec.source)
        except WeightSourceError as exc:
            return self.refuse(spec, str(exc))
        if resolved.model_path and not spec.model_path:
            spec = spec.model_copy(update={"model_path": resolved.model_path})
        try:
            spec, adapters_missing = self._resolve_adapters(spec)
        except WeightSourceError as exc:
            return self.refuse(spec, str(exc))
        problems = self.problems(spec, check_file=resolved.kind == "local")
        if problems:
            return self.refuse(spec, "; ".join(problems))
        missing = resolved.kind == "fetched" and resolved.path and not resolved.path.exists()
        if missing or adapters_missing:
            return self._fetch_then_launch(spec)
        return self._launch(spec)

    def _resolve_adapters(self, spec: ShardSpec) -> tuple[ShardSpec, bool]:
        """The spec with each adapter's place on this node (a hub id has none: the engine
        fetches it), and whether a URL's file is still to be fetched, like the weights."""
        adapters, missing = [], False
        for adapter in spec.adapters:
            resolved = self.weights.resolve(adapter.source)
            if resolved.kind == "fetched" and resolved.path and not resolved.path.exists():
                missing = True
            adapters.append(adapter.model_copy(update={"path": resolved.model_path}))
        if not adapters:
            return spec, False
        return spec.model_copy(update={"adapters": adapters}), missing

    def downloading(self) -> list[Download]:
        """Shards waiting for their weights: the register must report them too."""
        with self._lock:
            return list(self._downloads.values())

    def stop(self, shard_id: str) -> bool:
        """Cancel a download in progress; True if there was one (its end reports the stop)."""
        with self._lock:
            download = self._downloads.pop(shard_id, None)
        if download is None:
            return False
        download.cancel.set()
        return True

    def problems(self, spec: ShardSpec, check_file: bool) -> list[str]:
        """Everything wrong with a spec, found in milliseconds, before anything loads."""
        adapter = get_adapter(spec.engine)
        problems = adapter.validate(spec) + loader_env_problems(spec.env, self.allowed_env)
        binary = self.find_engine(spec.engine, spec.engine_version)
        if binary is None:
            wanted = f"{spec.engine} {spec.engine_version}".strip()
            problems.append(f"engine {wanted} is not installed on {self.node_id}")
        else:
            problems += adapter.binary_problems(spec, binary)
        if check_file and spec.model_path and not Path(spec.model_path).exists():
            problems.append(f"model file {spec.model_path} is not on this node")
        for lora in spec.adapters:  # a path source is used as is: it must be here now
            if lora.source.startswith("/") and not Path(lora.source).exists():
                problems.append(f"adapter {lora.name}'s file {lora.source} is not on this node")
        return problems

    def _launch(self, spec: ShardSpec) -> ShardState:
        adapter = get_adapter(spec.engine)
        path = self.find_engine(spec.engine, spec.engine_version)
        if path is None:  # removed between the check and now
            return self.refuse(spec, f"engine {spec.engine} is no longer installed here")
        commands = adapter.commands(spec, path)
        walls = self.walls if self.supervisor.state_of(spec.shard_id) is None else None
        if walls is not None:
            try:
                walls.wall(spec)
            except WallError as exc:
                return self.refuse(spec, f"its ports cannot be walled: {exc}")
        try:
            return self.supervisor.start(
                spec,
                commands,
                adapter.serves_http(spec.rank),
                adapter.health_path,
                start_after=adapter.start_after(spec),
                ready_when_listening=adapter.ready_when_listening(spec.rank),
            )
        except Exception:
            if walls is not None:  # nothing of it started: its wall goes (as on a failure)
                walls.unwall(spec.shard_id)
            raise

    def _fetch_then_launch(self, spec: ShardSpec) -> ShardState:
        cancel = threading.Event()
        seq = self.sequence.next()
        with self._lock:
            self._downloads[spec.shard_id] = Download(spec, cancel, seq)
        self._transition(spec, "fetching", f"fetching {spec.source}", seq=seq)
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
            path = spec.model_path
            if self.weights.resolve(spec.source).kind == "fetched":
                fetched = self.weights.fetch(
                    spec.source, spec.sha256, on_progress=progress, cancel=cancel
                )
                path = str(fetched)
            for adapter in spec.adapters:  # fetched like the weights, each once per node
                if self.weights.resolve(adapter.source).kind == "fetched":
                    self.weights.fetch(adapter.source, adapter.sha256, cancel=cancel)
        except FetchCancelled:
            self._transition(spec, "stopped", "stopped while its weights were downloading")
            return
        except WeightFetchError as exc:
            self._forget(spec.shard_id)
            self.refuse(spec, f"fetching {spec.source} failed: {exc}")
            return
        if not self._forget(spec.shard_id):
            # The stop came as the download finished: it is answered all the same.
            self._transition(spec, "stopped", "stopped as its weights finished downloading")
            return
        self._launch(spec.model_copy(update={"model_path": path}))

    def _forget(self, shard_id: str) -> bool:
        with self._lock:
            return self._downloads.pop(shard_id, None) is not None

    def refuse(self, spec: ShardSpec, reason: str) -> ShardState:
        log.error("refusing shard %s: %s", spec.shard_id, reason)
        self._transition(spec, "failed", reason)
        return "failed"

    def _transition(
        self, spec: ShardSpec, state: ShardState, reason: str, seq: int | None = None
    ) -> None:
        self.report(
            ShardTransition(
                shard_id=spec.shard_id,
                replica_id=spec.replica_id,
                state=state,
                reason=reason,
                fingerprint=spec.fingerprint,
                seq=seq or self.sequence.next(),
            )
        )


@dataclass(frozen=True)
class Download:
    """A shard whose weights are downloading, with the seq of its ``fetching`` status."""

    spec: ShardSpec
    cancel: threading.Event
    seq: int
