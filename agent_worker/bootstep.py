"""Start the agent's runtime with the worker and stop it with the worker."""

from __future__ import annotations

import logging

from celery import bootsteps

from agent_worker.config import load_config
from agent_worker.runtime import AgentRuntime

log = logging.getLogger("llmgw.agent")


class AgentRuntimeStep(bootsteps.StartStopStep):
    """The worker's whole life: discovery, the link, heartbeats, the supervisor."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker, **kwargs) -> None:
        self.runtime: AgentRuntime | None = None

    def start(self, worker) -> None:
        self.runtime = AgentRuntime(load_config())
        self.runtime.start()
        log.info("agent %s started", self.runtime.node_id)

    def stop(self, worker) -> None:
        if self.runtime is not None:
            self.runtime.stop()
            log.info("agent %s stopped; engines keep running", self.runtime.node_id)
            self.runtime = None
