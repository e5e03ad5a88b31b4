"""Commands from the control plane, as tasks on this node's queue. Each is thin: it
parses its typed argument and calls the runtime. Each is idempotent by shard id,
because the broker redelivers a task whose worker died.
"""

from __future__ import annotations

from celery import shared_task

from agent_worker.runtime import current
from protocol.shard import ShardSpec


@shared_task(name="agent.start_shard")
def start_shard_task(spec_json: str) -> str:
    return current().start_shard(ShardSpec.model_validate_json(spec_json))


@shared_task(name="agent.stop_shard")
def stop_shard_task(shard_id: str) -> str:
    current().stop_shard(shard_id)
    return "stopped"


@shared_task(name="agent.read_logs")
def read_logs_task(source: str = "agent", lines: int = 200) -> dict:
    runtime = current()
    return {"lines": runtime.read_logs(source, lines), "sources": runtime.logs.sources()}


@shared_task(name="agent.engine_check")
def engine_check_task(engine: str) -> dict:
    """Run the engine's version command: only ever on an operator's explicit request."""
    return current().engine_check(engine)
