"""The last hour of a model's traffic, from what the routers add up every second.

Routers add their counts into one Redis hash per model and ten seconds
(``protocol.routing.traffic_key``; ``router/traffic.py`` writes them), so these charts need
no Prometheus: requests and errors per second, time to first token (p50 and p95 from the
counts per TTFT_EDGES bucket), tokens per second, and the requests in flight and waiting.
The node page's queue chart reads the same buckets for the models it runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from audit.redis import redis_client
from protocol.routing import TRAFFIC_BUCKET_SECONDS, TTFT_EDGES, traffic_key

log = logging.getLogger("llmgw.fleet.traffic")

WINDOW = 3600
SOURCE = "the routers' reports (every second, added up per 10 s)"
NO_TRAFFIC = "no requests in the last hour"


def buckets(model: str, now: float | None = None) -> list[tuple[float, dict[str, int]]]:
    """Every 10 s bucket of the last hour that holds counts, oldest first."""
    now = time.time() if now is None else now
    first = (int(now) - WINDOW) // TRAFFIC_BUCKET_SECONDS * TRAFFIC_BUCKET_SECONDS
    starts = range(first, int(now) + 1, TRAFFIC_BUCKET_SECONDS)
    try:
        pipe = redis_client().pipeline(transaction=False)
        for start in starts:
            pipe.hgetall(traffic_key(model, start))
        found = pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not read the traffic of %s: %s", model, exc)
        return []
    kept = []
    for start, fields in zip(starts, found, strict=True):
        if fields:
            kept.append((float(start), {k.decode(): int(v) for k, v in fields.items()}))
    return kept


def quantile(fields: dict[str, int], q: float) -> float | None:
    """The ``q`` quantile of time to first token in one bucket: the upper edge of the TTFT
    bucket it falls in (None without answers; past the last edge, the last edge)."""
    counts = [fields.get(f"ttft:{i}", 0) for i in range(len(TTFT_EDGES))]
    counts.append(fields.get("ttft:inf", 0))
    total = sum(counts)
    if not total:
        return None
    running = 0
    for index, count in enumerate(counts):
        running += count
        if running >= q * total:
            return TTFT_EDGES[min(index, len(TTFT_EDGES) - 1)]
    return TTFT_EDGES[-1]


def _chart(chart_id: str, title: str, unit: str, empty: str = NO_TRAFFIC) -> dict[str, Any]:
    return {"id": chart_id, "title": title, "unit": unit, "x": [], "series": [], "empty": empty}


def model_traffic(model: str, now: float | None = None) -> dict[str, Any]:
    """The model page's traffic charts for the last hour."""
    kept = buckets(model, now)
    per_second = 1 / TRAFFIC_BUCKET_SECONDS
    charts = [
        _chart("requests", "Requests per second", "req/s"),
        _chart("ttft", "Time to first token", "s"),
        _chart("tokens", "Tokens per second", "tok/s"),
        _chart("errors", "Errors per second, by kind", "req/s", "no errors in the last hour"),
        _chart("load", "In flight and waiting", "requests"),
    ]
    if kept:
        x = [start for start, _ in kept]
        rows = [fields for _, fields in kept]

        def series(label: str, field: str, scale: float = per_second) -> dict[str, Any]:
            return {"label": label, "values": [row.get(field, 0) * scale for row in rows]}

        requests, ttft, tokens, errors, load = charts
        requests["series"] = [series("requests", "requests")]
        ttft["series"] = [
            {"label": label, "values": [quantile(row, q) for row in rows]}
            for label, q in (("p50", 0.5), ("p95", 0.95))
        ]
        tokens["series"] = [series("completion", "completion"), series("prompt", "prompt")]
        kinds = sorted({field for row in rows for field in row if field.startswith("error:")})
        errors["series"] = [series(kind.removeprefix("error:"), kind) for kind in kinds]
        # Added once a second by each router: a bucket's sum over its seconds is the mean.
        load["series"] = [series("in flight", "inflight"), series("waiting", "waiting")]
        for chart in charts:
            if chart["series"]:
                chart["x"] = x
    return {"source": SOURCE, "charts": charts, "note": ""}


def waiting_chart(models: list[str], now: float | None = None) -> dict[str, Any]:
    """The node page's queue chart: requests waiting in the routers for each model the
    node runs, from the same buckets."""
    chart = _chart(
        "queue", "Router queue depth", "requests",
        "no data yet: no request waited for its models in the last hour",
    )  # fmt: skip
    per_model = {model: dict(buckets(model, now)) for model in sorted(set(models))}
    # Buckets in which a router carried or queued something for one of them.
    starts = sorted(
        {
            start
            for kept in per_model.values()
            for start, fields in kept.items()
            if "inflight" in fields or "waiting" in fields
        }
    )
    if not starts:
        return chart
    chart["x"] = starts
    chart["series"] = [
        {
            "label": model,
            "values": [kept.get(s, {}).get("waiting", 0) / TRAFFIC_BUCKET_SECONDS for s in starts],
        }
        for model, kept in per_model.items()
    ]
    return chart
