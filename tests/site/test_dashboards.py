"""deploy/: the Grafana dashboard queries only what llmgw exports, and Prometheus scrapes it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from fleet.metrics import FleetCollector
from router.metrics import RouterMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC = re.compile(r"\bllmgw_[a-z0-9_]+")
# What Prometheus appends to a family's name in the series it stores.
SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def exported() -> set[str]:
    """Every metric family the control plane and a router export, by name."""
    families = [*FleetCollector().collect(), *RouterMetrics().registry.collect()]
    return {family.name for family in families}


def family_of(series: str) -> str:
    for suffix in SUFFIXES:
        if series.endswith(suffix):
            return series.removesuffix(suffix)
    return series


def panels(dashboard: dict) -> list[dict]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return [panel for panel in found if panel["type"] != "row"]


@pytest.mark.django_db
def test_every_metric_the_dashboard_queries_is_one_llmgw_exports():
    dashboard = json.loads((DEPLOY / "grafana" / "llmgw.json").read_text())
    queried = {
        series: panel["title"]
        for panel in panels(dashboard)
        for target in panel["targets"]
        for series in METRIC.findall(target["expr"])
    }
    names = exported()
    unknown = {s: title for s, title in queried.items() if family_of(s) not in names}
    assert unknown == {}, f"queried but never exported: {unknown}"
    # The sections the dashboard promises each show something.
    rows = [panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"]
    assert rows == ["Fleet", "Nodes", "Models", "Routers", "Keys"]
    for needed in (
        "llmgw_node_up",
        "llmgw_replicas",
        "llmgw_router_requests_total",
        "llmgw_router_time_to_first_byte_seconds_bucket",
        "llmgw_router_completion_tokens_total",
        "llmgw_router_rate_limited_total",
    ):
        assert needed in queried, needed  # fmt: skip


def test_every_panel_reads_the_dashboards_prometheus():
    dashboard = json.loads((DEPLOY / "grafana" / "llmgw.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(dashboard):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_prometheus_scrapes_the_control_plane_and_the_routers_metrics():
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"llmgw-control-plane", "llmgw-router"}
    for job in jobs.values():
        assert job["metrics_path"] == "/metrics"
        assert job["static_configs"][0]["targets"]
