"""An hour of a node's history: kept in Redis from heartbeats, or asked of Prometheus."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone

from fleet import history
from fleet.link.heartbeats import write_heartbeats
from tests.factories import make_node, make_replica, make_shard
from tests.pages.rows import usage

pytestmark = pytest.mark.django_db


@pytest.fixture
def node_id():
    node_id = f"hist-{uuid.uuid4().hex[:8]}"
    yield node_id
    history._redis().delete(history.samples_key(node_id))
    history.forget_sampled(node_id)


def test_heartbeats_leave_one_sample_per_interval(node_id):
    make_node(node_id)
    now = timezone.now()
    write_heartbeats({node_id: (now, usage(cpu_percent=10.0))})
    write_heartbeats({node_id: (now + timedelta(seconds=2), usage(cpu_percent=90.0))})
    samples = history.local_samples(node_id)
    assert [s["cpu"] for s in samples] == [10.0]
    assert samples[0]["mem"] == usage()["memory_used"]


def test_samples_older_than_an_hour_are_trimmed(node_id):
    now = timezone.now()
    history.record_samples({node_id: (now - timedelta(seconds=4000), usage(cpu_percent=1.0))})
    history.record_samples({node_id: (now, usage(cpu_percent=2.0))})
    assert history._redis().zcard(history.samples_key(node_id)) == 1
    assert [s["cpu"] for s in history.local_samples(node_id)] == [2.0]


def test_charts_sum_shards_by_model_and_leave_gaps_where_nothing_ran():
    samples = [
        {"t": 1.0, "cpu": 5, "mem": 1, "memt": 4, "load": 0.5, "shards": {"a": [1.0, 10]}},
        {"t": 2.0, "cpu": 6, "mem": 2, "memt": 4, "load": 0.6,
         "shards": {"a": [1.5, 10], "b": [0.5, 5], "c": [2.0, 7]}},
    ]  # fmt: skip
    models = {"a": "gemma", "b": "gemma", "c": "qwen"}
    charts = {c["id"]: c for c in history.charts_from_samples(samples, models)}
    assert charts["cpu"]["x"] == [1.0, 2.0]
    assert charts["cpu"]["series"][0]["values"] == [5, 6]
    cores = {s["label"]: s["values"] for s in charts["model-cores"]["series"]}
    assert cores == {"gemma": [1.0, 2.0], "qwen": [None, 2.0]}
    memory = {s["label"]: s["values"] for s in charts["model-memory"]["series"]}
    assert memory == {"gemma": [10, 15], "qwen": [None, 7]}
    assert charts["queue"]["series"] == [] and "no data yet" in charts["queue"]["empty"]


def test_local_history_names_models_from_the_shards(node_id):
    node = make_node(node_id)
    shard = make_shard(make_replica(), node=node)
    history.record_samples(
        {node_id: (timezone.now(), usage(shards={shard.id: {"cpu_cores": 2.0, "rss": 3}}))}
    )
    result = history.node_history(node_id)
    assert result["source"] == "the control plane's heartbeat samples and the routers' reports"
    cores = {c["id"]: c for c in result["charts"]}["model-cores"]
    assert cores["series"] == [{"label": "gemma", "values": [2.0]}]


class FakePrometheus(BaseHTTPRequestHandler):
    """Answers query_range as Prometheus does: a matrix on the requested grid."""

    queries: list[str] = []

    def do_GET(self):
        url = urlsplit(self.path)
        params = {k: v[0] for k, v in parse_qs(url.query).items()}
        FakePrometheus.queries.append(params["query"])
        start, step = float(params["start"]), int(params["step"])
        values = [[start + i * step, str(i)] for i in range(3)]
        metric = {"model": "gemma"} if "sum by (model)" in params["query"] else {}
        result = [{"metric": metric, "values": values}]
        body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def prometheus():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakePrometheus.queries = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_prometheus_is_asked_when_configured(settings, prometheus):
    settings.PROMETHEUS_URL = prometheus
    result = history.node_history("node01", ["r1", "r2"], now=100_000.0)
    assert result["source"] == "Prometheus"
    charts = {c["id"]: c for c in result["charts"]}
    assert charts["cpu"]["series"][0]["values"][:3] == [0.0, 1.0, 2.0]
    assert [s["label"] for s in charts["memory"]["series"]] == ["used", "total"]
    assert charts["model-cores"]["series"][0]["label"] == "gemma"
    assert charts["queue"]["series"][0]["label"] == "gemma"
    assert 'llmgw_router_inflight{replica=~"r1|r2"}' in " ".join(FakePrometheus.queries)
    assert 'llmgw_node_cpu_utilization_percent{node="node01"}' in FakePrometheus.queries


def test_an_unreachable_prometheus_falls_back_to_local_samples(settings, node_id):
    from tests.processes.support import free_port

    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    history.record_samples({node_id: (timezone.now(), usage())})
    result = history.node_history(node_id)
    assert result["source"] == "the control plane's heartbeat samples and the routers' reports"
    assert "did not answer" in result["note"]
    assert result["charts"][0]["series"][0]["values"] == [41.0]
