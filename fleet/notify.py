"""Tell open pages that the fleet changed, through the channel layer (Redis).

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

log = logging.getLogger("llmgw.fleet.notify")

PAGES_GROUP = "llmgw-pages"
MESSAGE_TYPE = "fleet.changed"

# What the kinds mean to pages: node, replica, shard (a transition), placement, catalog
# (a decision or an apply), progress (a download moved on), usage (heartbeats were written).
KINDS = ("node", "replica", "shard", "placement", "catalog", "progress", "usage")


def fleet_changed(kind: str, subject: str) -> None:
    """Tell every page that ``subject`` (a node id, replica id, shard id…) changed."""
    _send(kind, [str(subject)])


def fleet_changed_on_commit(kind: str, subject: str) -> None:
    """Tell pages once the current transaction commits, so a page that re-reads sees it."""
    transaction.on_commit(lambda: fleet_changed(kind, subject))


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
