"""The pages operators live in (cluster, node, model, logs) and the metrics endpoint.

Each page is one template with ``{% partialdef %}`` fragments; an htmx request gets
``page.html#fragment``, and the page's websocket pushes the same fragments as the fleet
changes (``fleet.pages.consumers``). Contexts come from ``fleet.pages.fragments``, shared
with the sockets.
"""

from __future__ import annotations

import hmac
import re

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django_htmx.middleware import HtmxDetails
from prometheus_client import CONTENT_TYPE_LATEST

from catalog.permissions import is_operator
from fleet import commands, selectors
from fleet.metrics import FleetCollector, exposition
from fleet.models import Node, Shard
from fleet.pages import fragments
from fleet.pages.node_filter import STATES, NodeFilter
from protocol.commands import LOG_LINES_KEPT

LOG_LINES_DEFAULT = 200
LOG_SOURCE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class HtmxRequest(HttpRequest):
    """A request as django-htmx's middleware leaves it."""

    htmx: HtmxDetails


def _page(request: HtmxRequest, page: str, key: str = "", **extra) -> HttpResponse:
    spec = fragments.PAGES[page]
    context = spec.context(key, spec.fragments)
    if context is None:
        raise Http404(f"no {page} named {key!r}")
    context.update(can_operate=is_operator(request.user), key=key, **extra)
    fragment = request.GET.get("fragment", "")
    if request.htmx and fragment in spec.fragments:
        return render(request, f"{spec.template}#{fragment}", context)
    return render(request, spec.template, context)


@login_required
def cluster(request: HtmxRequest) -> HttpResponse:
    """The nodes a page at a time, filtered as the query string says, and the models."""
    query = request.META.get("QUERY_STRING", "")
    node_filter = NodeFilter.from_query(request.GET)
    canonical = fragments.cluster_query(node_filter, fragments.models_page(query))
    if query != canonical and not node_filter.notes and not request.htmx:
        # The filter form sends its empty fields too: the URL to share is the short one.
        return redirect(f"{request.path}?{canonical}" if canonical else request.path)
    choices = {"states": STATES, **selectors.node_filter_choices()}
    return _page(request, "cluster", query, filter_choices=choices)


@login_required
def node(request: HtmxRequest, node_id: str) -> HttpResponse:
    return _page(request, "node", node_id)


@login_required
def model(request: HtmxRequest, name: str) -> HttpResponse:
    return _page(request, "model", name)


@login_required
def weights(request: HtmxRequest, name: str) -> HttpResponse:
    """Where a model's weights are: the mirror page."""
    return _page(request, "mirror", name)


@login_required
def node_logs(request: HtmxRequest, node_id: str) -> HttpResponse:
    """The node's recent log lines for one source, read from its agent's memory."""
    node = Node.objects.filter(id=node_id).first()
    if node is None:
        raise Http404(f"no node named {node_id!r}")
    source = request.GET.get("source", "agent") or "agent"
    if not LOG_SOURCE.match(source):
        return HttpResponseBadRequest(f"{source!r} is not a log source; use agent or a shard id")
    try:
        lines = int(request.GET.get("n", LOG_LINES_DEFAULT))
    except ValueError:
        return HttpResponseBadRequest("n must be a whole number of lines, e.g. n=200")
    lines = max(1, min(LOG_LINES_KEPT, lines))
    follow = request.GET.get("follow") == "1"
    answer, error = {}, ""
    try:
        answer = commands.read_logs(node.id, source, lines)
    except commands.AgentDidNotAnswer as exc:
        error = str(exc)
    context = {
        "node": node,
        "source": source,
        "n": lines,
        "follow": follow,
        "lines": answer.get("lines", []),
        "error": error,
        "sources": _log_sources(node.id, answer.get("sources"), source),
    }
    if request.htmx and request.GET.get("fragment") == "lines":
        return render(request, "fleet/logs.html#lines", context)
    logs_page = fragments.PAGES["logs"]
    context.update(logs_page.context(node.id, logs_page.fragments) or {})
    return render(request, "fleet/logs.html", context)


def _log_sources(node_id: str, reported: list[str] | None, current: str) -> list[dict]:
    """The sources the node sent, named by model; the node's shards when it did not answer."""
    shards = {
        shard.id: shard for shard in Shard.objects.filter(node_id=node_id).select_related("replica")
    }
    names = list(reported or [])
    if not reported:
        names = ["agent", *sorted(shards)]
    if current not in names:
        names.append(current)
    result = []
    for name in names:
        shard = shards.get(name)
        label = (
            f"{shard.replica.model_name} rank {shard.rank} ({name[:8]})"
            if shard
            else ("agent" if name == "agent" else name)
        )
        result.append({"id": name, "label": label})
    return result


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format, behind the metrics token (LLMGW_METRICS_TOKEN, else the one
    generated in the home)."""
    token = settings.METRICS_TOKEN
    sent = request.headers.get("Authorization", "")
    if token and not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
        return HttpResponse(
            "metrics need 'Authorization: Bearer <token>': LLMGW_METRICS_TOKEN, or the "
            "metrics-token file in the control plane's LLMGW_HOME\n",
            status=401,
        )
    return HttpResponse(exposition(FleetCollector().collect()), content_type=CONTENT_TYPE_LATEST)
