"""What each live page shows and which changes touch which of its fragments.

The views render a whole page from these contexts; the page sockets render the same
``page.html#fragment`` partials from the same contexts when a change touches them, so
what a push shows is exactly what a reload would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.template.loader import render_to_string
from django.utils import timezone

from fleet import history, selectors, traffic
from fleet.models import Node
from fleet.pages import mirror

# Kinds of change that alter what the models table shows.
MODEL_KINDS = frozenset({"replica", "shard", "placement", "catalog", "progress", "node"})


def cluster_context(key: str, fragments: Iterable[str]) -> dict[str, Any] | None:
    return selectors.cluster_overview()


def node_context(key: str, fragments: Iterable[str]) -> dict[str, Any] | None:
    detail = selectors.node_detail(key)
    if detail is None:
        return None
    if "history" in fragments:
        replica_ids = sorted({str(item["replica"].id) for item in detail["shards"]})
        detail["history"] = history.node_history(key, replica_ids)
    return detail


def model_context(key: str, fragments: Iterable[str]) -> dict[str, Any] | None:
    detail = selectors.model_detail(key)
    if detail is not None and "traffic" in fragments:
        detail["traffic"] = traffic.model_traffic(key)
    return detail


def mirror_context(key: str, fragments: Iterable[str]) -> dict[str, Any] | None:
    return mirror.mirror_detail(key)


def logs_context(key: str, fragments: Iterable[str]) -> dict[str, Any] | None:
    node = Node.objects.filter(id=key).first()
    if node is None:
        return None
    now = timezone.now()
    return {"node": node, "row": selectors.node_row(node, now), "now": now}


def _cluster_touched(key: str, kind: str, subjects: list[str]) -> set[str]:
    touched = set()
    if kind in ("node", "usage"):
        touched.add("nodes")
    if kind in MODEL_KINDS:
        touched.add("models")
    return touched


def _node_touched(key: str, kind: str, subjects: list[str]) -> set[str]:
    if kind == "usage":
        # The summary follows every heartbeat; the charts are throttled by the socket.
        return {"summary", "history"} if key in subjects else set()
    if kind == "node":
        return {"summary"} if key in subjects else set()
    if kind in ("replica", "shard", "progress"):
        return {"summary"}
    return set()


def _model_touched(key: str, kind: str, subjects: list[str]) -> set[str]:
    return {"profiles", "replicas"} if kind in MODEL_KINDS else set()


def _mirror_touched(key: str, kind: str, subjects: list[str]) -> set[str]:
    return {"holders"} if kind in MODEL_KINDS else set()


def _logs_touched(key: str, kind: str, subjects: list[str]) -> set[str]:
    return {"node-state"} if kind in ("node", "usage") and key in subjects else set()


@dataclass(frozen=True)
class Page:
    """A live page: its template, its fragments, and how to build their context."""

    template: str
    fragments: tuple[str, ...]
    context: Callable[[str, Iterable[str]], dict[str, Any] | None]
    touched: Callable[[str, str, list[str]], set[str]]
    # Fragments pushed at most this often (seconds), however often they are touched.
    slow: tuple[str, ...] = ()


PAGES: dict[str, Page] = {
    "cluster": Page("fleet/cluster.html", ("nodes", "models"), cluster_context, _cluster_touched),
    "node": Page(
        "fleet/node.html", ("summary", "history"), node_context, _node_touched, slow=("history",)
    ),
    # The traffic polls (every 10 s, as the routers' buckets fill), rather than being pushed.
    "model": Page(
        "fleet/model.html", ("profiles", "replicas", "traffic"), model_context, _model_touched
    ),
    "logs": Page("fleet/logs.html", ("node-state",), logs_context, _logs_touched),
    "mirror": Page("fleet/mirror.html", ("holders",), mirror_context, _mirror_touched),
}


def touched(page: str, key: str, kind: str, subjects: list[str]) -> set[str]:
    """The fragments of ``page`` (for ``key``) that a change of ``kind`` may alter."""
    return PAGES[page].touched(key, kind, subjects)


def render_fragments(page: str, key: str, can_operate: bool, fragments: Iterable[str]) -> str:
    """The named fragments of a page, as a websocket push (each carries its own id)."""
    spec = PAGES[page]
    names = [name for name in spec.fragments if name in set(fragments)]
    context = spec.context(key, names)
    if context is None:
        return render_to_string("fleet/gone.html", {"page": page, "key": key})
    context["can_operate"] = can_operate
    return "".join(render_to_string(f"{spec.template}#{name}", context) for name in names)
