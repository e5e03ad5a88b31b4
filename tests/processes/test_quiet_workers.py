"""Celery workers that say nothing to one another: a real agent and a real reconciler on
one Redis subscribe to no event or remote-control channel and publish no worker event.

Gossip, mingle, worker heartbeats and remote control go to every worker through the
broker, a cost that grows with the square of the fleet (``bench/broker_load.py``).
"""

from __future__ import annotations

import threading
import time

import pytest
import redis
from django.conf import settings

from tests.processes.support import agent, free_port, reconciler, wait_until

pytestmark = pytest.mark.process

# kombu's names for Celery's event exchange and remote-control mailbox on Redis.
CHATTER = ("celeryev", "pidbox")
WATCHED_SECONDS = 5  # worker heartbeats go out every 2 s


def subscriptions(client: redis.Redis) -> int:
    """Channels and patterns subscribed to by the clients of this test's Redis database
    (kombu listens to a fanout exchange, the event bus or a mailbox, through (p)subscribe).
    Other databases are other xdist workers', whose tests may run routers that listen."""
    db = str(client.connection_pool.connection_kwargs.get("db", 0))
    return sum(
        int(c["sub"]) + int(c["psub"]) for c in client.client_list() if str(c.get("db")) == db
    )


def published_chatter(client: redis.Redis, seconds: float) -> list[str]:
    """Every PUBLISH to an event or mailbox channel seen by MONITOR for ``seconds``."""
    seen: list[str] = []
    stop = time.monotonic() + seconds

    def watch() -> None:
        with client.monitor() as monitor:
            for command in monitor.listen():
                text = command["command"]
                if text.upper().startswith("PUBLISH") and any(w in text for w in CHATTER):
                    seen.append(text[:120])
                if time.monotonic() > stop:
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # MONITOR only returns when a command arrives: keep one arriving.
    while watcher.is_alive() and time.monotonic() < stop + 2:
        client.ping()
        time.sleep(0.2)
    return seen


def test_agent_and_reconciler_workers_neither_gossip_nor_take_remote_control(processes, tmp_path):
    client = redis.Redis.from_url(settings.REDIS_URL)
    closed = f"ws://127.0.0.1:{free_port()}"  # the agent's link has nowhere to go: no matter
    worker = agent("quiet-node", closed, "no-token", tmp_path, tmp_path).start()
    processes.append(worker)
    processes.append(reconciler("reconciler-quiet", tmp_path).start())
    for process in processes:
        wait_until(lambda p=process: " ready." in p.output(), 90, f"{process.name} to be ready")

    assert subscriptions(client) == 0
    assert published_chatter(client, WATCHED_SECONDS) == []
