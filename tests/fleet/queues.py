"""Read what the control plane put on a node's queue in the real Redis broker."""

from __future__ import annotations

import base64
import json

import redis
from django.conf import settings

from protocol.commands import CONVERGE_ENGINES, DRAIN, ENGINE_CALLERS, LEADER_EPOCH


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


# What every linked node is told besides its shards; most tests are about the shards.
ENGINE_ORDERS = (CONVERGE_ENGINES, DRAIN, LEADER_EPOCH, ENGINE_CALLERS)


def queued_commands(node_id: str, *, orders: bool = False) -> list[tuple[str, list]]:
    """(task name, args) of every command waiting on ``node-<id>``, oldest first; the
    engine and drain orders only when ``orders`` is set."""
    return [(task, args) for task, args, _kwargs in _queued(node_id, orders)]


def node_command_key(node_id: str) -> str:
    """The key the control plane signs this node's commands with now (its latest link's)."""
    from fleet.models import Node
    from fleet.pki.keys import command_key

    found = Node.objects.filter(id=node_id).values_list("key_generation", flat=True).first()
    return command_key(node_id, found or "")


def queued_signatures(node_id: str, *, orders: bool = False) -> list[dict]:
    """The signing kwargs (deadline, signature, command_id) of the same commands, oldest first."""
    return [kwargs for _task, _args, kwargs in _queued(node_id, orders)]


def _queued(node_id: str, orders: bool) -> list[tuple[str, list, dict]]:
    queued = []
    for item in reversed(broker().lrange(f"node-{node_id}", 0, -1)):
        message = json.loads(item)
        args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        task = message["headers"]["task"]
        if orders or task not in ENGINE_ORDERS:
            queued.append((task, args, kwargs))
    return queued


def clear_queue(node_id: str) -> None:
    broker().delete(f"node-{node_id}")
