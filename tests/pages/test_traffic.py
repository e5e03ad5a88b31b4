"""A model's traffic, last hour: what routers add into Redis, read back as the page's charts."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from django.test import Client

from fleet import traffic
from protocol.routing import TRAFFIC_BUCKET_SECONDS, TRAFFIC_KEY_PREFIX
from router.traffic import Traffic, with_load
from tests.factories import make_model, make_node, make_profile, make_replica, make_shard
from tests.pages.rows import router_reported

pytestmark = pytest.mark.django_db


@pytest.fixture
def model_name():
    name = f"traffic-{uuid.uuid4().hex[:8]}"
    yield name
    client = traffic.redis_client()
    for key in client.scan_iter(match=f"{TRAFFIC_KEY_PREFIX}{name}:*"):
        client.delete(key)


def served(model: str, answers: list[tuple[int, float]], tokens=(0, 0)) -> dict:
    counted = Traffic()
    for code, ttft in answers:
        counted.first_byte(model, ttft)
        counted.request(model, code)
    counted.tokens(model, *tokens)
    return counted.take()


def test_two_routers_reports_add_up_in_the_bucket_and_read_back_as_rates(model_name):
    now = time.time()
    start = now // TRAFFIC_BUCKET_SECONDS * TRAFFIC_BUCKET_SECONDS
    router_reported(served(model_name, [(200, 0.2)] * 8 + [(503, 0.01)], (900, 300)), start + 1)
    router_reported(with_load(served(model_name, [(200, 3.0)] * 2), {model_name: {"inflight": 4,
                                                                         "queued": 2}}),
           start + 2)  # fmt: skip
    charts = {c["id"]: c for c in traffic.model_traffic(model_name, start + 5)["charts"]}
    assert charts["requests"]["x"] == [start]
    assert charts["requests"]["series"][0]["values"] == [11 / TRAFFIC_BUCKET_SECONDS]
    ttft = {s["label"]: s["values"][0] for s in charts["ttft"]["series"]}
    # 8 answers within 0.25 s, one within 0.05 s and two within 5 s.
    assert ttft == {"p50": 0.25, "p95": 5.0}
    tokens = {s["label"]: s["values"][0] for s in charts["tokens"]["series"]}
    assert tokens == {"completion": 30.0, "prompt": 90.0}
    errors = {s["label"]: s["values"][0] for s in charts["errors"]["series"]}
    assert errors == {"503": 0.1}
    load = {s["label"]: s["values"][0] for s in charts["load"]["series"]}
    assert load == {"in flight": 0.4, "waiting": 0.2}


def test_a_model_without_traffic_says_so(model_name):
    charts = traffic.model_traffic(model_name)["charts"]
    assert all(chart["x"] == [] and chart["empty"] for chart in charts)


def test_the_model_page_shows_its_traffic_and_polls_for_more(model_name, reader):
    make_profile(make_model(model_name), replicas=1)
    router_reported(served(model_name, [(200, 0.4)] * 3, (30, 12)), time.time())
    client = Client()
    client.force_login(reader)
    html = client.get(f"/models/{model_name}/").content.decode()
    assert 'id="model-traffic"' in html and 'hx-trigger="every 10s"' in html
    fragment = client.get(f"/models/{model_name}/?fragment=traffic", HTTP_HX_REQUEST="true")
    body = fragment.content.decode()
    assert body.lstrip().startswith('<section id="model-traffic"')
    data = json.loads(body.split('id="traffic-data" type="application/json">')[1].split("<")[0])
    requests = next(c for c in data["charts"] if c["id"] == "requests")
    assert round(sum(requests["series"][0]["values"]) * TRAFFIC_BUCKET_SECONDS) == 3


def test_the_node_pages_queue_chart_reads_the_same_reports(model_name):
    node = make_node(f"n-{model_name}")
    make_shard(make_replica(make_profile(make_model(model_name))), node=node)
    now = time.time()
    router_reported(with_load({}, {model_name: {"inflight": 1, "queued": 5}}), now)
    chart = traffic.waiting_chart([model_name], now)
    assert chart["series"] == [{"label": model_name, "values": [0.5]}]
