"""What each live page shows and which changes touch which of its fragments.

The views render a whole page from these contexts; the page sockets render the same
``page.html#fragment`` partials from the same contexts when a change touches them, so
what a push shows is exactly what a reload would.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from django.http import QueryDict
from django.template.loader import get_template, render_to_string
from django.urls import reverse
from django.utils import timezone

from fleet import history, selectors, traffic
from fleet.models import Node
from fleet.pages import mirror
from fleet.pages.audit_page import audit_context, audit_outline, may_show
from fleet.pages.node_filter import PER_PAGE, STATES, NodeFilter

# The cluster page's models table: each shows its replicas whole, so a catalog of hundreds
# is paged rather than drawn at once.
MODELS_PER_PAGE = 50
# Kinds of change that alter what the models table shows.
MODEL_KINDS = frozenset({"replica", "shard", "placement", "catalog", "progress", "node"})
# Said by ``touched`` of a page that shows a window of a long list: a change to rows it
# does not show may still move rows into it or change its counts, so the page's outline
# is read again and the window pushed only if that moved.
OUTLINE = "outline"
# Said by ``touched`` of such a page when a change alters only rows it shows (a heartbeat):
# those rows alone are pushed, each swapped in by its id, not the whole window.
ROWS = "rows"


def cluster_context(key: str, fragments: Iterable[str]) -> dict[str, Any] | None:
    """The cluster page for ``key``, its query string: the nodes its filter picks, a page
    of them at a time, and the models."""
    fragments = set(fragments)
    node_filter = NodeFilter.from_query(key)
    context: dict[str, Any] = {"now": timezone.now()}
    if "nodes" in fragments:
        context.update(selectors.node_window(node_filter.where(), node_filter.page, PER_PAGE))
        window = context["window"]
        node_filter = node_filter.on_page(node_filter.page, window["pages"])
        context["shown"] = frozenset(row["node"].id for row in context["nodes"])
        context.update(_node_links(node_filter, context["counts"], window))
    if "models" in fragments:
        context.update(_models_window(key, node_filter))
    context["node_filter"] = node_filter
    return context


def models_page(query: str) -> int:
    """The page of models a cluster page's query string asks for (``?models=2``); 1 if none."""
    asked = QueryDict(query).get("models", "")
    return int(asked) if asked.isdigit() and int(asked) >= 1 else 1


def cluster_query(node_filter: NodeFilter, page_of_models: int) -> str:
    """The cluster page's query string: the nodes' filter, and the page of models if not 1."""
    kept = f"models={page_of_models}" if page_of_models > 1 else ""
    return "&".join(part for part in (node_filter.query(), kept) if part)


def _models_window(key: str, node_filter: NodeFilter) -> dict[str, Any]:
    """A page of the catalog's models (``?models=2``), with links to the pages beside it;
    the nodes' filter is kept in them."""
    pages = selectors.model_pages(MODELS_PER_PAGE)
    page = min(models_page(key), pages)

    def href(page: int) -> str:
        query = cluster_query(node_filter, page)
        return f"{reverse('cluster')}?{query}" if query else reverse("cluster")

    return {
        "models": selectors.model_rows(page, pages, MODELS_PER_PAGE),
        "models_window": {
            "page": page,
            "pages": pages,
            "previous_href": href(page - 1) if page > 1 else "",
            "next_href": href(page + 1) if page < pages else "",
        },
    }


def cluster_rows(node_ids: Iterable[str]) -> list[dict[str, Any]]:
    """The contexts of these nodes' rows of the cluster page, one each."""
    now = timezone.now()
    return [{"row": row, "now": now} for row in selectors.node_rows(node_ids, now)]


def cluster_outline(key: str) -> Hashable:
    node_filter = NodeFilter.from_query(key)
    return selectors.node_outline(node_filter.where(), node_filter.page, PER_PAGE)


def _node_links(node_filter: NodeFilter, counts: dict[str, int], window: dict) -> dict[str, Any]:
    """The links of the nodes' window: each state's count, and the pages beside this one."""

    def href(query: str) -> str:
        return f"{reverse('cluster')}?{query}" if query else reverse("cluster")

    page, pages = window["page"], window["pages"]
    return {
        "state_counts": [
            {"state": state, "count": counts[state], "href": href(NodeFilter(state=state).query())}
            for state in STATES
            if counts[state]
        ],
        "previous_href": href(node_filter.query(page=page - 1)) if page > 1 else "",
        "next_href": href(node_filter.query(page=page + 1)) if page < pages else "",
        "first_href": href(node_filter.query(page=1)) if page > 2 else "",
        "last_href": href(node_filter.query(page=pages)) if page < pages - 1 else "",
        "clear_href": href(""),
    }


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
    if detail is not None and "profiles" in fragments:
        detail["adapters"] = selectors.adapter_rows(key)
    return detail


def mirror_context(key: str, fragments: Iterable[str]) -> dict[str, Any] | None:
    return mirror.mirror_detail(key)


def logs_context(key: str, fragments: Iterable[str]) -> dict[str, Any] | None:
    node = Node.objects.filter(id=key).first()
    if node is None:
        return None
    now = timezone.now()
    return {"node": node, "row": selectors.node_row(node, now), "now": now}


def _cluster_touched(key: str, kind: str, subjects: list[str], shown: frozenset[str]) -> set[str]:
    touched = set()
    if kind == "usage" and not shown.isdisjoint(subjects):
        touched.add(ROWS)  # a heartbeat changes only its own node's row
    elif kind == "node" and not shown.isdisjoint(subjects):
        touched.add("nodes")
    elif kind == "node":
        # Off this page, a node's state, drain, pool or arrival may still move rows into
        # the page or change the counts.
        touched.add(OUTLINE)
    if kind in MODEL_KINDS:
        touched.add("models")
    return touched


def _node_touched(key: str, kind: str, subjects: list[str], shown: frozenset[str]) -> set[str]:
    if kind == "usage":
        # The summary follows every heartbeat; the charts are throttled by the socket.
        return {"summary", "history"} if key in subjects else set()
    if kind == "node":
        return {"summary"} if key in subjects else set()
    if kind in ("replica", "shard", "progress"):
        return {"summary"}
    return set()


def _model_touched(key: str, kind: str, subjects: list[str], shown: frozenset[str]) -> set[str]:
    return {"profiles", "replicas"} if kind in MODEL_KINDS else set()


def _mirror_touched(key: str, kind: str, subjects: list[str], shown: frozenset[str]) -> set[str]:
    return {"holders"} if kind in MODEL_KINDS else set()


def _audit_touched(key: str, kind: str, subjects: list[str], shown: frozenset[str]) -> set[str]:
    # Whether the new Event is one its reader may read, and within the filter, is the
    # outline's to say: the newest such Event's id, one indexed row.
    return {OUTLINE} if may_show(key, kind) else set()


def _logs_touched(key: str, kind: str, subjects: list[str], shown: frozenset[str]) -> set[str]:
    return {"node-state"} if kind in ("node", "usage") and key in subjects else set()


@dataclass(frozen=True)
class Page:
    """A live page: its template, its fragments, and how to build their context."""

    template: str
    fragments: tuple[str, ...]
    context: Callable[[str, Iterable[str]], dict[str, Any] | None]
    # (key, kind, subjects, the subjects of the rows shown) -> the fragments to push.
    touched: Callable[[str, str, list[str], frozenset[str]], set[str]]
    # Fragments pushed at most this often (seconds), however often they are touched.
    slow: tuple[str, ...] = ()
    # A page that shows a window of a long list: the fragment holding it, and a cheap read
    # of what decides its rows (its context gives the same as "outline", with "shown").
    window: str = ""
    outline: Callable[[str], Hashable] | None = None
    # Its partial drawing one row of the window, and the contexts of the rows of these
    # subjects, one each (for ``ROWS``).
    row: str = ""
    rows: Callable[[Iterable[str]], list[dict[str, Any]]] | None = None


PAGES: dict[str, Page] = {
    "cluster": Page(
        "fleet/cluster.html",
        ("nodes", "models"),
        cluster_context,
        _cluster_touched,
        window="nodes",
        outline=cluster_outline,
        row="node-row",
        rows=cluster_rows,
    ),
    "node": Page(
        "fleet/node.html", ("summary", "history"), node_context, _node_touched, slow=("history",)
    ),
    # The traffic polls (every 10 s, as the routers' buckets fill), rather than being pushed.
    "model": Page(
        "fleet/model.html", ("profiles", "replicas", "traffic"), model_context, _model_touched
    ),
    "logs": Page("fleet/logs.html", ("node-state",), logs_context, _logs_touched),
    "mirror": Page("fleet/mirror.html", ("holders",), mirror_context, _mirror_touched),
    "audit": Page(
        "fleet/audit.html",
        ("events",),
        audit_context,
        _audit_touched,
        window="events",
        outline=audit_outline,
    ),
}


def touched(page: str, key: str, kind: str, subjects: list[str], shown=frozenset()) -> set[str]:
    """The fragments of ``page`` (for ``key``) that a change of ``kind`` may alter;
    ``shown``: the subjects of the rows the page showed last."""
    return PAGES[page].touched(key, kind, subjects, frozenset(shown))


@dataclass(frozen=True)
class Push:
    """What a page's socket sends. For a page showing a window of a list, when the push
    re-draws the window: the subjects of its rows and its outline (else None)."""

    html: str
    shown: frozenset[str] | None = None
    outline: Hashable = None


def render_push(
    page: str,
    key: str,
    can_operate: bool,
    fragments: Iterable[str],
    outline: Hashable = None,
    rows: Iterable[str] = (),
) -> Push | None:
    """The named fragments of a page as one push; None when nothing shown would change
    (only ``OUTLINE`` was asked, and the outline is as it was). With ``ROWS``: the rows of
    ``rows`` (subjects the page shows) too, unless the whole window is pushed anyway."""
    spec = PAGES[page]
    asked = set(fragments)
    if OUTLINE in asked:
        asked.discard(OUTLINE)
        if spec.outline is not None and spec.window not in asked and spec.outline(key) != outline:
            asked.add(spec.window)
    row_ids = sorted(rows) if ROWS in asked and spec.window not in asked else []
    names = [name for name in spec.fragments if name in asked]
    if not names and not row_ids:
        return None
    html, shown, drawn_outline = "", None, None
    if names:
        context = spec.context(key, names)
        if context is None:
            return Push(render_to_string("fleet/gone.html", {"page": page, "key": key}))
        context["can_operate"] = can_operate
        html = "".join(render_to_string(f"{spec.template}#{name}", context) for name in names)
        shown, drawn_outline = context.get("shown"), context.get("outline")
    if row_ids and spec.rows is not None:
        row_template = get_template(f"{spec.template}#{spec.row}")  # loaded once for all rows
        html += "".join(
            row_template.render({**row, "can_operate": can_operate}) for row in spec.rows(row_ids)
        )
    return Push(html, shown, drawn_outline) if html else None


def render_fragments(page: str, key: str, can_operate: bool, fragments: Iterable[str]) -> str:
    """The named fragments of a page, as a websocket push (each carries its own id)."""
    push = render_push(page, key, can_operate, fragments)
    return push.html if push else ""
