"""A Celery app whose workers say nothing to one another.

Every Celery worker by default gossips with every other (worker-heartbeat events every
2 s, mingle at start-up, a remote-control mailbox on a fanout exchange): through one
Redis that grows with the square of the fleet (measured: bytes out per node ×3.9 from 3
to 12 agents). llmgw's workers need none of it: commands come on each node's own queue
and replies through the result backend. The switches live in the app, not on the
command line, so the command stays ``celery -A agent_worker worker -Q node-$(hostname)``.
"""

from __future__ import annotations

import logging
from functools import cached_property
from typing import Any

from celery import Celery

# What `celery worker --without-gossip --without-mingle --without-heartbeat` would set.
SILENT_WORKER_OPTIONS = {"without_gossip": True, "without_mingle": True, "without_heartbeat": True}
# Loggers that write a line per task received, succeeded or scheduled.
TASK_CHATTER = ("celery.app.trace", "celery.worker.strategy", "celery.beat")


def quiet_task_chatter(**_kwargs: Any) -> None:
    """Tasks come every 2 s (the reconciler's beat) or often (the agents' log reads and
    checks): their "received"/"succeeded" lines would drown what matters. Connect it to
    Celery's ``after_setup_logger``."""
    for name in TASK_CHATTER:
        logging.getLogger(name).setLevel(logging.WARNING)


class QuietCelery(Celery):
    """Celery whose workers run without gossip, mingle, worker heartbeats, remote control
    and task events."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conf.update(worker_enable_remote_control=False, worker_send_task_events=False)

    @cached_property
    def Worker(self) -> type:  # noqa: N802 - Celery's own name for it
        base = super().Worker

        class QuietWorker(base):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **{**kwargs, **SILENT_WORKER_OPTIONS})

        return QuietWorker
