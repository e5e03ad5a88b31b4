"""The notices a committed change sends: to open pages, and to routers.

Pages hear through the channel layer (Redis).

Several daphne processes may serve pages, and a change may happen in a Celery worker or
in another daphne process, so process memory would reach only some browsers: every
message goes through the channel layer's group, which reaches every page socket.
Messages say what changed, never how it looks: each page socket re-renders only the
fragments a change touches, for its own user (operators see buttons, readers do not).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from audit.redis import redis_client
from core.redis_clients import channel_on
from protocol.routing import ROUTING_CHANNEL

log = logging.getLogger("llmgw.audit.notices")

PAGES_GROUP = "llmgw-pages"
MESSAGE_TYPE = "fleet.changed"

# What the kinds mean to pages: node, replica, shard (a transition), placement, catalog
# (a decision or an apply), progress (a download moved on), usage (heartbeats were written).
KINDS = ("node", "replica", "shard", "placement", "catalog", "progress", "usage")


def pages_changed(kind: str, subject: str) -> None:
    """Tell every page that ``subject`` (a node id, replica id, shard id…) changed."""
    _send(kind, [str(subject)])


def pages_changed_on_commit(kind: str, subject: str) -> None:
    """Tell pages once the current transaction commits, so a page that re-reads sees it."""
    transaction.on_commit(lambda: pages_changed(kind, subject))


def all_changed_on_commit(kind: str, subjects: Iterable[str]) -> None:
    """Tell pages, once the transaction commits, that every one of ``subjects`` changed:
    one message for them all."""
    changed = sorted(str(subject) for subject in subjects)
    if changed:
        transaction.on_commit(lambda: _send(kind, changed))


def usage_changed(node_ids: Iterable[str]) -> None:
    """Tell pages that these nodes' latest heartbeats were written: one message per batch."""
    subjects = sorted(node_ids)
    if subjects:
        _send("usage", subjects)


def _send(kind: str, subjects: list[str]) -> None:
    # Never raises: the change is committed already, and a page that missed a message
    # re-syncs when its socket reconnects. A lost message costs freshness, not truth.
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": MESSAGE_TYPE, "kind": kind, "subjects": subjects}
    try:
        async_to_sync(layer.group_send)(PAGES_GROUP, message)
    except Exception as exc:
        log.warning("could not tell pages about a %s change: %s", kind, exc)


def routers_reload_on_commit(kind: str = "replicas") -> None:
    """Tell every router to reload its table once the current transaction commits."""
    transaction.on_commit(lambda: publish_routing_change(kind))


def publish_routing_change(kind: str = "replicas") -> None:
    """Tell every router to reload now; never raises, since the change is committed anyway.

    Call it after commit so a router that reloads at once sees the change. A lost
    message costs at most one periodic refresh (10 s by default).
    """
    try:
        client = redis_client()
        client.publish(channel_on(client, ROUTING_CHANNEL), kind)
    except Exception as exc:
        log.warning("could not tell routers about a %s change: %s", kind, exc)
