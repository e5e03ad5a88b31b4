"""An hour of each node's CPU, RAM, load, per-model use and router queue, for the node page.

From Prometheus (``query_range``) when ``PROMETHEUS_URL`` is set. Otherwise from samples
the control plane keeps itself, so ``make run`` draws charts with no Prometheus: one
sample per node every SAMPLE_EVERY seconds in a Redis sorted set per node (scored by
time, trimmed to an hour), written from the batched heartbeat writes. Redis rather than
process memory because several daphne processes may hold links and serve pages.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import httpx
import redis
from django.conf import settings
from pydantic import ValidationError

from audit.redis import redis_client
from core.http import outbound_client
from fleet import traffic
from protocol.inventory import NodeUsage

log = logging.getLogger("llmgw.fleet.history")

WINDOW = 3600
# Heartbeats come every 5 s; a sample every 10 s keeps an hour at 360 points a node.
SAMPLE_EVERY = 10
# Prometheus' step for an hour: 240 points, as fine as a scrape interval of 15 s allows.
PROMETHEUS_STEP = 15
PROMETHEUS_TIMEOUT = 5.0
NO_DATA = "no data yet"


def _redis() -> redis.Redis:
    return redis_client()


def samples_key(node_id: str) -> str:
    return f"llmgw:history:{node_id}"


# When this process last kept a sample of each node: the downsampling gate. Process memory
# is enough, and a Redis gate a node cost each flush thousands of commands (the flush's
# CPU, which the event loop waits on): a node's heartbeats come through the one process
# holding its link, and a link that moves costs at most one extra sample.
_last_sampled: dict[str, float] = {}


def _due(node_id: str, stamp: float) -> bool:
    last = _last_sampled.get(node_id)
    if last is not None and last <= stamp < last + SAMPLE_EVERY:
        return False
    _last_sampled[node_id] = stamp
    return True


def forget_sampled(node_id: str) -> None:
    """Let the next heartbeat of ``node_id`` be sampled whenever it comes."""
    _last_sampled.pop(node_id, None)


def compact_sample(at: float, usage: NodeUsage) -> dict[str, Any]:
    """The few numbers a chart needs from one heartbeat's usage."""
    return {
        "t": round(at, 3),
        "cpu": usage.cpu_percent,
        "mem": usage.memory_used,
        "memt": usage.memory_total,
        "load": usage.load[0],
        "shards": {
            shard_id: [shard.cpu_cores, shard.rss] for shard_id, shard in usage.shards.items()
        },
    }


def record_samples(batch: dict[str, tuple[datetime, dict]]) -> list[str]:
    """Keep a sample for each node in ``batch`` not sampled in the last SAMPLE_EVERY s.

    Returns the nodes sampled. Never raises: charts are worth less than heartbeats.
    """
    due = [node_id for node_id, (at, _usage) in batch.items() if _due(node_id, at.timestamp())]
    if not due:
        return []
    try:
        writes = _redis().pipeline(transaction=False)
        for node_id in due:
            at, usage = batch[node_id]
            stamp = at.timestamp()
            key = samples_key(node_id)
            sample = compact_sample(stamp, NodeUsage.model_validate(usage))
            writes.zadd(key, {json.dumps(sample): stamp})
            writes.zremrangebyscore(key, "-inf", stamp - WINDOW)
            # A node that goes away leaves nothing behind for long.
            writes.expire(key, 2 * WINDOW)
        writes.execute()
        return due
    except (redis.RedisError, ValidationError) as exc:
        log.warning("could not keep history samples: %s", exc)
        return []


def local_samples(node_id: str, now: float | None = None) -> list[dict[str, Any]]:
    """The last hour of ``node_id``'s samples kept by the control plane, oldest first."""
    now = time.time() if now is None else now
    try:
        raw = _redis().zrangebyscore(samples_key(node_id), now - WINDOW, "+inf")
    except redis.RedisError as exc:
        log.warning("could not read history of %s: %s", node_id, exc)
        return []
    return [json.loads(item) for item in raw]  # type: ignore[arg-type]  # members: JSON bytes


def _chart(chart_id: str, title: str, unit: str, empty: str = NO_DATA) -> dict[str, Any]:
    return {"id": chart_id, "title": title, "unit": unit, "x": [], "series": [], "empty": empty}


def charts_from_samples(
    samples: list[dict[str, Any]], model_of_shard: dict[str, str]
) -> list[dict[str, Any]]:
    """Turn kept samples into the node page's charts: x in seconds, one list per series."""
    x = [sample["t"] for sample in samples]
    cpu = _chart("cpu", "CPU", "%")
    memory = _chart("memory", "RAM", "bytes")
    load = _chart("load", "Load (1 min)", "")
    cores = _chart("model-cores", "Cores by model", "cores")
    model_memory = _chart("model-memory", "Memory by model", "bytes")
    queue = _chart(
        "queue",
        "Router queue depth",
        "requests",
        empty="no data yet",
    )
    if samples:
        for chart in (cpu, memory, load):
            chart["x"] = x
        cpu["series"] = [{"label": "CPU %", "values": [s.get("cpu") for s in samples]}]
        memory["series"] = [
            {"label": "used", "values": [s.get("mem") for s in samples]},
            {"label": "total", "values": [s.get("memt") for s in samples]},
        ]
        load["series"] = [{"label": "load 1m", "values": [s.get("load") for s in samples]}]
        per_model = _per_model(samples, model_of_shard)
        if per_model:
            cores["x"] = model_memory["x"] = x
            cores["series"] = [{"label": m, "values": v[0]} for m, v in per_model.items()]
            model_memory["series"] = [{"label": m, "values": v[1]} for m, v in per_model.items()]
    return [cpu, memory, load, cores, model_memory, queue]


def _per_model(
    samples: list[dict[str, Any]], model_of_shard: dict[str, str]
) -> dict[str, tuple[list, list]]:
    """Sum each sample's shards by model; None where a model ran nothing at that time."""
    names = sorted(
        {model_of_shard.get(s, s[:8]) for sample in samples for s in sample.get("shards", {})}
    )
    result: dict[str, tuple[list, list]] = {name: ([], []) for name in names}
    for sample in samples:
        cores: dict[str, float] = {}
        rss: dict[str, int] = {}
        for shard_id, (shard_cores, shard_rss) in sample.get("shards", {}).items():
            name = model_of_shard.get(shard_id, shard_id[:8])
            cores[name] = cores.get(name, 0) + shard_cores
            rss[name] = rss.get(name, 0) + shard_rss
        for name in names:
            result[name][0].append(cores.get(name))
            result[name][1].append(rss.get(name))
    return result


def node_history(node_id: str, replica_ids: Iterable[str] = (), now: float | None = None):
    """The node page's charts for the last hour, and where they came from."""
    from fleet.models import Shard

    now = time.time() if now is None else now
    prometheus = getattr(settings, "PROMETHEUS_URL", "")
    if prometheus:
        try:
            charts = prometheus_charts(prometheus, node_id, list(replica_ids), now)
            return {"source": "Prometheus", "charts": charts, "note": ""}
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            note = f"Prometheus at {prometheus} did not answer ({exc}); showing local samples"
            log.warning(note)
    else:
        note = ""
    samples = local_samples(node_id, now)
    shard_ids = {s for sample in samples for s in sample.get("shards", {})}
    model_of_shard = dict(
        Shard.objects.filter(id__in=shard_ids).values_list("id", "replica__model_name")
    )
    charts = charts_from_samples(samples, model_of_shard)
    # The queue is the routers' to tell, from the same reports as the model page's traffic.
    models = list(model_of_shard.values()) or list(
        Shard.objects.filter(node_id=node_id).values_list("replica__model_name", flat=True)
    )
    charts = [traffic.waiting_chart(models, now) if c["id"] == "queue" else c for c in charts]
    return {
        "source": "the control plane's heartbeat samples and the routers' reports",
        "charts": charts,
        "note": note,
    }


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def prometheus_queries(node_id: str, replica_ids: list[str]) -> dict[str, list[str]]:
    """PromQL for each chart; a chart with several queries gets one series per result."""
    node = f'node="{_label(node_id)}"'
    queries = {
        "cpu": [f"llmgw_node_cpu_utilization_percent{{{node}}}"],
        "memory": [f"llmgw_node_memory_used_bytes{{{node}}}", f"llmgw_node_memory_bytes{{{node}}}"],
        "load": [f'llmgw_node_load{{{node},period="1m"}}'],
        "model-cores": [f"sum by (model) (llmgw_shard_cpu_cores{{{node}}})"],
        "model-memory": [f"sum by (model) (llmgw_shard_memory_bytes{{{node}}})"],
        "queue": [],
    }
    if replica_ids:
        replicas = "|".join(_label(r) for r in replica_ids)
        queries["queue"] = [f'sum by (model) (llmgw_router_inflight{{replica=~"{replicas}"}})']
    return queries


def prometheus_charts(
    base_url: str, node_id: str, replica_ids: list[str], now: float
) -> list[dict[str, Any]]:
    """The same charts as charts_from_samples, from Prometheus' query_range."""
    start = now - WINDOW
    # Prometheus answers points at start + k*step; align every series on that grid.
    start -= start % PROMETHEUS_STEP
    grid = list(range(int(start), int(now) + 1, PROMETHEUS_STEP))
    charts = charts_from_samples([], {})
    labels = {"memory": ["used", "total"], "cpu": ["CPU %"], "load": ["load 1m"]}
    with outbound_client(base_url, PROMETHEUS_TIMEOUT) as client:
        for chart in charts:
            for index, query in enumerate(prometheus_queries(node_id, replica_ids)[chart["id"]]):
                response = client.get(
                    "/api/v1/query_range",
                    params={"query": query, "start": start, "end": now, "step": PROMETHEUS_STEP},
                )
                response.raise_for_status()
                body = response.json()
                if body.get("status") != "success":
                    raise ValueError(body.get("error", "query failed"))
                for result in body["data"]["result"]:
                    values = {int(float(t)): float(v) for t, v in result["values"]}
                    names = labels.get(chart["id"])
                    label = names[index] if names else result["metric"].get("model", "?")
                    chart["series"].append(
                        {"label": label, "values": [values.get(t) for t in grid]}
                    )
            if chart["series"]:
                chart["x"] = grid
    return charts
