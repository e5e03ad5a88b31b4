"""The node agent's Celery app: ``celery -A agent_worker worker -Q node-$(hostname)``.

It imports no Django. Commands from the control plane arrive as tasks on the node's
queue; the agent's own runtime (discovery, the link, heartbeats, the supervisor)
lives in the worker process for its whole life, started by a bootstep.
"""

from __future__ import annotations

from celery.signals import after_setup_logger

from agent_worker.bootstep import AgentRuntimeStep
from agent_worker.config import celery_broker_config
from core.quiet_celery import QuietCelery, quiet_task_chatter

# Quiet: no gossip, mingle, worker heartbeats or remote control, whose broker traffic
# grows with the square of the fleet; an agent needs only its own queue.
app = QuietCelery("agent_worker")
app.conf.update(
    # broker_url, result_backend and, for rediss://, the TLS both verify the server with.
    **celery_broker_config(),
    # The supervisor, the link and the log buffers must share one process for the
    # worker's whole life; prefork would run tasks in children that have none of them.
    worker_pool="threads",
    worker_concurrency=4,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    accept_content=["json"],
    result_expires=300,
    # A worker that stops must not take long: the runtime stops in 5 s.
    worker_cancel_long_running_tasks_on_connection_loss=True,
)
app.steps["worker"].add(AgentRuntimeStep)
after_setup_logger.connect(quiet_task_chatter)


app.autodiscover_tasks(["agent_worker"], related_name="tasks", force=True)
