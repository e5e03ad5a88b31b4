"""Read what the control plane put on a node's queue in the real Redis broker."""

from __future__ import annotations

import base64
import json

import redis
from django.conf import settings


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def queued_commands(node_id: str) -> list[tuple[str, list]]:
    """(task name, args) of every command waiting on ``node-<id>``, oldest first."""
    raw = broker().lrange(f"node-{node_id}", 0, -1)
    commands = []
    for item in reversed(raw):
        message = json.loads(item)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        commands.append((message["headers"]["task"], args))
    return commands


def queued_signatures(node_id: str) -> list[dict]:
    """The signing kwargs (deadline, signature) of every queued command, oldest first."""
    raw = broker().lrange(f"node-{node_id}", 0, -1)
    return [json.loads(base64.b64decode(json.loads(item)["body"]))[1] for item in reversed(raw)]


def clear_queue(node_id: str) -> None:
    broker().delete(f"node-{node_id}")
