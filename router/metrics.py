"""The router's Prometheus metrics, in a registry of its own (one per router process).

Labelled children are cached in plain dicts: ``Counter.labels()`` takes a lock and
builds a tuple on every call, which is measurable at tens of thousands of requests.
Requests for a model the router does not know are counted under ``model=""`` so a
client cannot grow the label set without bound.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from router.traffic import Traffic

# From sub-millisecond overhead to multi-minute generations.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class RouterMetrics:
    """Counters, histograms and gauges the router updates per request."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        # The router is its own process: the *_created series only double the output.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        r = self.registry
        self._requests = Counter(
            "llmgw_router_requests", "Requests answered, by model and HTTP status",
            ["model", "code"], registry=r,
        )  # fmt: skip
        self._seconds = Histogram(
            "llmgw_router_request_seconds", "Time from request to the last byte of the answer",
            ["model"], buckets=BUCKETS, registry=r,
        )  # fmt: skip
        self._ttfb = Histogram(
            "llmgw_router_time_to_first_byte_seconds",
            "Time from request to the first byte of the answer sent to the client",
            ["model"], buckets=BUCKETS, registry=r,
        )  # fmt: skip
        self._inflight = Gauge(
            "llmgw_router_inflight", "Requests in flight to each replica",
            ["model", "replica"], registry=r,
        )  # fmt: skip
        self._upstream_errors = Counter(
            "llmgw_router_upstream_errors",
            "Failed attempts at a replica (connect, timeout, 5xx, broken stream)",
            ["model", "replica", "kind"], registry=r,
        )  # fmt: skip
        self._migrations = Counter(
            "llmgw_router_migrations",
            "Requests moved to another replica after their engine broke off the answer, by "
            "how it broke (closed, silent, invalid; unreachable or refused: the replica "
            "asked before did not take it on)", ["model", "reason"], registry=r,
        )  # fmt: skip
        self._prompt_tokens = Counter(
            "llmgw_router_prompt_tokens", "Prompt tokens engines reported", ["model"], registry=r
        )
        self._completion_tokens = Counter(
            "llmgw_router_completion_tokens", "Completion tokens engines reported",
            ["model"], registry=r,
        )  # fmt: skip
        self._breaker_open = Gauge(
            "llmgw_router_breaker_open", "1 while a replica is taken out after failing",
            ["model", "replica"], registry=r,
        )  # fmt: skip
        self.limits_shared = Gauge(
            "llmgw_router_rate_limits_shared",
            "1 while per-key limits are counted in Redis with the other routers; 0 while Redis "
            "does not answer and this process counts alone",
            registry=r,
        )
        self.limits_shared.set(1)
        self.rate_limited = Counter(
            "llmgw_router_rate_limited", "Requests refused by a key's limit, by limit",
            ["limit"], registry=r,
        )  # fmt: skip
        self.table_models = Gauge(
            "llmgw_router_table_models", "Models in the routing table", registry=r
        )
        self.table_loaded = Gauge(
            "llmgw_router_table_loaded_timestamp_seconds",
            "When the routing table was last loaded", registry=r,
        )  # fmt: skip
        self.table_age = Gauge(
            "llmgw_router_table_age_seconds",
            "Seconds since the routing table was loaded (a saved table: since the database "
            "last gave it)", registry=r,
        )  # fmt: skip
        self.table_from_saved = Gauge(
            "llmgw_router_table_from_saved",
            "1 while the router serves its saved table because the database did not answer",
            registry=r,
        )  # fmt: skip
        self.keys = Gauge("llmgw_router_api_keys", "API keys the router accepts", registry=r)
        self._children: dict[tuple, object] = {}
        # The same counts, by model, for the model page (taken every second: traffic.py).
        self.traffic = Traffic()

    def _child(self, metric, *labels: str):
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def request_done(self, model: str, code: int, seconds: float) -> None:
        self._child(self._requests, model, str(code)).inc()
        self._child(self._seconds, model).observe(seconds)
        self.traffic.request(model, code)

    def first_byte(self, model: str, seconds: float) -> None:
        self._child(self._ttfb, model).observe(seconds)
        self.traffic.first_byte(model, seconds)

    def upstream_error(self, model: str, replica: str, kind: str) -> None:
        self._child(self._upstream_errors, model, replica, kind).inc()
        self.traffic.failure(model, kind)

    def migrated(self, model: str, reason: str) -> None:
        self._child(self._migrations, model, reason).inc()

    def tokens(self, model: str, prompt: int, completion: int) -> None:
        self.traffic.tokens(model, prompt, completion)
        if prompt:
            self._child(self._prompt_tokens, model).inc(prompt)
        if completion:
            self._child(self._completion_tokens, model).inc(completion)

    def replicas(self, rows: list[tuple[str, str, int, bool]]) -> None:
        """Set per-replica gauges from (model, replica, in flight, breaker open) rows.

        Cleared first, so a replica that left the table leaves the metrics too.
        """
        self._inflight.clear()
        self._breaker_open.clear()
        for model, replica, inflight, is_open in rows:
            self._inflight.labels(model, replica).set(inflight)
            self._breaker_open.labels(model, replica).set(1 if is_open else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
