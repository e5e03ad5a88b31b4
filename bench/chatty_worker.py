"""The baseline of bench/broker_load.py (``celery -A bench.chatty_worker``): a plain
Celery worker with the agent's broker and pool settings and Celery's defaults for the
rest (gossip, mingle, worker heartbeats, remote control), as the agent ran before it was
made quiet. It starts no agent runtime.
"""

from __future__ import annotations

import os

from celery import Celery

from core.redis_urls import parse_redis_url

app = Celery("chatty_worker")
app.conf.update(
    **parse_redis_url(os.environ["LLMGW_AGENT_BROKER"], "LLMGW_AGENT_BROKER").celery_config(),
    worker_pool="threads",
    worker_concurrency=4,
    broker_connection_retry_on_startup=True,
)
