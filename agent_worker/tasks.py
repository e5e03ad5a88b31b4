"""Commands from the control plane, as tasks on this node's queue. Each is thin: it
checks the command was signed for this node and is not one obeyed already (its id),
parses its typed argument and calls the runtime. Each is idempotent by shard id too.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import shared_task
from pydantic import ValidationError

from agent_worker.runtime import current
from protocol.commands import (
    COLLECT_WEIGHTS,
    CONVERGE_ENGINES,
    DRAIN,
    ENGINE_CALLERS,
    ENGINE_CHECK,
    FETCH_WEIGHTS,
    LEADER_EPOCH,
    READ_LOGS,
    START_SHARD,
    STOP_SHARD,
)
from protocol.engines import WantedEngine
from protocol.shard import ShardSpec
from protocol.signing import (
    ArrivedLate,
    BadSignature,
    SealError,
    open_sealed,
    refuse_at_sight,
    verify,
)

log = logging.getLogger("llmgw.agent.commands")


# A certificate agent learns the key its commands are signed with from its link's answer;
# a command sent as soon as the node shows connected can arrive a moment before that.
KEY_WAIT = 10.0


def _command_key() -> str:
    link = current().link
    until = time.monotonic() + KEY_WAIT
    while not link.command_key and time.monotonic() < until:
        time.sleep(0.05)
    return link.command_key


def _checked(task: str, args: list[Any], deadline: float, signature: str, command_id: str) -> bool:
    runtime = current()
    guard = runtime.commands
    try:
        try:
            refuse_at_sight(task, deadline, signature, command_id)  # no key needed: no wait
        except ArrivedLate:
            if not runtime.link.command_key:
                return _dropped_before_the_key(task)
            raise
        key = _command_key()
        if not key:
            return _dropped_before_the_key(task)
        guard.key_in_hand()
        verify(key, task, args, deadline, signature, command_id)
        if not guard.first_time(command_id, deadline):
            raise BadSignature(f"{task} {command_id} was obeyed already: this is a replay")
    except BadSignature as exc:
        log.error("refusing a command %s: %s", task, exc)
        # Said where operators look too (counted, at most a report a minute): whoever
        # put it on this queue was not llmgw, or put it there again.
        guard.refused(task, str(exc))
        return False
    return True


def _dropped_before_the_key(task: str) -> bool:
    """A command this agent cannot check yet: it has not linked since it started (a
    power-on, a restart while the control plane is away). Most are llmgw's own, queued
    before the node went away, and the control plane sends what still stands again once
    it links (the engines, the drain, the callers, stops, the epoch): dropped, not refused,
    so no Event a command on the node page, and said once in the agent log."""
    current().commands.dropped_before_key(task)
    return False


# After each command's own arguments, its signed envelope as keywords: the deadline, the
# signature and the command's id.


@shared_task(name=START_SHARD)
def start_shard_task(spec_json: str, *, deadline=0.0, signature="", command_id="") -> str:
    if not _checked(START_SHARD, [spec_json], deadline, signature, command_id):
        return "refused"
    try:
        spec = _opened(ShardSpec.model_validate_json(spec_json))
    except SealError as exc:
        log.error("refusing a command %s: its replica's secret: %s", START_SHARD, exc)
        current().commands.refused(START_SHARD, f"its replica's secret: {exc}")
        return "refused"
    return current().start_shard(spec)


def _opened(spec: ShardSpec) -> ShardSpec:
    """``spec`` with its replica's secret opened: it travels on the broker sealed for this
    node, to its certificate or under its command key."""
    if not spec.sealed_api_key:
        return spec
    link = current().link
    private_key = link.identity.private_key if link.identity is not None else None
    secret = open_sealed(spec.sealed_api_key, spec.shard_id, private_key=private_key,
                         command_key=link.command_key)  # fmt: skip
    return spec.model_copy(update={"api_key": secret, "sealed_api_key": ""})


@shared_task(name=STOP_SHARD)
def stop_shard_task(
    shard_id: str, epoch: int = 0, *, deadline=0.0, signature="", command_id=""
) -> str:
    if not _checked(STOP_SHARD, [shard_id, epoch], deadline, signature, command_id):
        return "refused"
    return "stopped" if current().stop_shard(shard_id, epoch) else "ignored"


@shared_task(name=LEADER_EPOCH)
def leader_epoch_task(epoch: int, *, deadline=0.0, signature="", command_id="") -> str:
    if not _checked(LEADER_EPOCH, [epoch], deadline, signature, command_id):
        return "refused"
    return "learned" if current().learn_epoch(epoch) else "older"


@shared_task(name=READ_LOGS)
def read_logs_task(
    source: str = "agent", lines: int = 200, *, deadline=0.0, signature="", command_id=""
) -> dict:
    if not _checked(READ_LOGS, [source, lines], deadline, signature, command_id):
        return {"lines": [], "sources": [], "refused": True}
    runtime = current()
    return {"lines": runtime.read_logs(source, lines), "sources": runtime.logs.sources()}


@shared_task(name=ENGINE_CHECK)
def engine_check_task(engine: str, *, deadline=0.0, signature="", command_id="") -> dict:
    """Run the engine's version command: only ever on an operator's explicit request."""
    if not _checked(ENGINE_CHECK, [engine], deadline, signature, command_id):
        return {"ok": False, "output": "refused: the command was not signed for this node"}
    return current().engine_check(engine)


@shared_task(name=COLLECT_WEIGHTS)
def collect_weights_task(keep: list[str], *, deadline=0.0, signature="", command_id="") -> dict:
    """Delete weights llmgw fetched that no model in ``keep`` (nor any shard here) uses."""
    if not _checked(COLLECT_WEIGHTS, [keep], deadline, signature, command_id):
        return {"deleted": [], "refused": True}
    return {"deleted": current().collect_weights(keep)}


@shared_task(name=CONVERGE_ENGINES)
def converge_engines_task(engines: list[dict], *, deadline=0.0, signature="", command_id="") -> str:
    """Have exactly these engine versions; the install runs beside heartbeats and shards."""
    if not _checked(CONVERGE_ENGINES, [engines], deadline, signature, command_id):
        return "refused"
    current().converge_engines([wanted for engine in engines if (wanted := _wanted(engine))])
    return "converging"


def _wanted(engine: dict) -> WantedEngine | None:
    """One engine version as the command names it; None (and said why) when no node could
    install it safely, such as a version that is not one directory name."""
    try:
        return WantedEngine.model_validate(engine)
    except ValidationError as exc:
        named = f"{engine.get('name')} {engine.get('version')}" if isinstance(engine, dict) else ""
        log.error("refusing engine %s: %s", named or repr(engine)[:200], exc)
        return None


@shared_task(name=DRAIN)
def drain_task(draining: bool = True, *, deadline=0.0, signature="", command_id="") -> str:
    if not _checked(DRAIN, [draining], deadline, signature, command_id):
        return "refused"
    current().drain(draining)
    return "draining" if draining else "taking shards"


@shared_task(name=ENGINE_CALLERS)
def engine_callers_task(addresses: list[str], *, deadline=0.0, signature="", command_id="") -> str:
    """The routers' and control planes' addresses, which engines' HTTP ports admit."""
    if not _checked(ENGINE_CALLERS, [addresses], deadline, signature, command_id):
        return "refused"
    refused = current().engine_callers([str(a) for a in addresses])
    return f"walled; refused {', '.join(refused)}" if refused else "walled"


@shared_task(name=FETCH_WEIGHTS)
def fetch_weights_task(
    source: str, sha256: str = "", *, deadline=0.0, signature="", command_id=""
) -> dict:
    """Start fetching a model's weights ahead of need; answers at once, fetches beside."""
    if not _checked(FETCH_WEIGHTS, [source, sha256], deadline, signature, command_id):
        return {"fetching": False, "reason": "refused: the command was not signed for this node"}
    return current().prefetch(source, sha256)
