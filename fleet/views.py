"""Pages and the metrics endpoint of the control plane."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from fleet import selectors
from fleet.metrics import FleetCollector


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    return render(request, "fleet/cluster.html", selectors.cluster_overview())


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format; guarded by a bearer token when LLMGW_METRICS_TOKEN is set."""
    token = settings.METRICS_TOKEN
    if token and request.headers.get("Authorization", "") != f"Bearer {token}":
        return HttpResponse(
            "metrics need 'Authorization: Bearer <LLMGW_METRICS_TOKEN>'\n", status=401
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
