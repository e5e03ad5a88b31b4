"""The audit page and its exports (CSV, JSON): the same filters, the same readers' rules
(``fleet.audit_log.reading``); an export holds every Event the filter picks, streamed."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.utils import timezone

from audit import export
from audit.filters import EventFilter
from fleet.audit_log.reading import EventFilterRefused, asked_events, readable_events
from fleet.pages import fragments
from fleet.pages.audit_page import audit_key
from fleet.pages.views import HtmxRequest

FORMATS = {
    "csv": (export.csv_chunks, "text/csv; charset=utf-8"),
    "json": (export.json_chunks, "application/json"),
}


@login_required
def audit(request: HtmxRequest) -> HttpResponse:
    """The Events this reader may read, filtered as the query string says."""
    query = request.META.get("QUERY_STRING", "")
    asked = EventFilter.from_query(request.GET, timezone.now())
    if query != asked.query() and not asked.notes and not request.htmx:
        # The filter form sends its empty fields too: the URL to share is the short one.
        return redirect(f"{request.path}?{asked.query()}" if asked.query() else request.path)
    spec = fragments.PAGES["audit"]
    key = audit_key(request.user, query)
    context = spec.context(key, spec.fragments)
    if context is None:
        raise Http404("this account can no longer read the log")
    context.update(key=key, query=key.partition("?")[2])
    if request.htmx and request.GET.get("fragment") in spec.fragments:
        return render(request, f"{spec.template}#{request.GET['fragment']}", context)
    return render(request, spec.template, context)


@login_required
def audit_export(request: HtmxRequest, fmt: str) -> HttpResponseBase:
    """Every Event the filter picks, newest first, as a file to download."""
    if fmt not in FORMATS:
        raise Http404(f"no export as {fmt!r}; use csv or json")
    asked = EventFilter.from_query(request.GET, timezone.now())
    if asked.notes:
        return HttpResponseBadRequest("\n".join(asked.notes) + "\n")
    try:
        events = asked_events(readable_events(request.user), asked)
    except EventFilterRefused as exc:
        return HttpResponseBadRequest(f"{exc}\n")
    chunks, content_type = FORMATS[fmt]
    response = StreamingHttpResponse(export.streamed(chunks(events)), content_type=content_type)
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="llmgw-events-{stamp}.{fmt}"'
    return response
