"""The router's Prometheus metrics, in a registry of its own (one per router process).

What every request counts (answers by status, their times, tokens) is kept in plain
dictionaries and lists and turned into Prometheus's families when scraped (``PerModel``):
prometheus_client's Counter and Histogram take a lock on each change, and a histogram's
observation walks its buckets in Python, about 6 us a request in all. Labelled children
of the other metrics are cached in plain dicts: ``Counter.labels()`` takes a lock and
builds a tuple on every call. Requests for a model the router does not know are counted
under ``model=""`` so a client cannot grow the label set without bound.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

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
        self._per_model = PerModel()
        r.register(self._per_model)
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
        per_model = self._per_model
        key = (model, code)
        per_model.answers[key] = per_model.answers.get(key, 0) + 1
        per_model.seconds.observe(model, seconds)
        self.traffic.request(model, code)

    def first_byte(self, model: str, seconds: float) -> None:
        self._per_model.first_byte.observe(model, seconds)
        self.traffic.first_byte(model, seconds)

    def upstream_error(self, model: str, replica: str, kind: str) -> None:
        self._child(self._upstream_errors, model, replica, kind).inc()
        self.traffic.failure(model, kind)

    def migrated(self, model: str, reason: str) -> None:
        self._child(self._migrations, model, reason).inc()

    def tokens(self, model: str, prompt: int, completion: int) -> None:
        self.traffic.tokens(model, prompt, completion)
        counted = self._per_model.tokens.get(model)
        if counted is None:
            counted = self._per_model.tokens[model] = [0, 0]
        counted[0] += prompt
        counted[1] += completion

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


class Buckets:
    """A histogram by model as plain counts: an observation is a bisect and two additions."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self.counts: dict[str, list[int]] = {}  # by model: per bucket, the last for +Inf
        self.sums: dict[str, float] = {}

    def observe(self, model: str, seconds: float) -> None:
        counts = self.counts.get(model)
        if counts is None:
            counts = self.counts[model] = [0] * (len(BUCKETS) + 1)
            self.sums[model] = 0.0
        counts[bisect_left(BUCKETS, seconds)] += 1  # the first bound at or above it
        self.sums[model] += seconds

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=["model"])
        bounds = [*(floatToGoString(b) for b in BUCKETS), "+Inf"]
        for model, counts in list(self.counts.items()):
            family.add_metric([model], list(zip(bounds, accumulate(counts), strict=True)),
                              self.sums[model])  # fmt: skip
        return family


class PerModel:
    """What every request counts, read by the registry when it is scraped."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, int], int] = {}  # (model, status) -> answers
        self.seconds = Buckets("llmgw_router_request_seconds",
                               "Time from request to the last byte of the answer")  # fmt: skip
        self.first_byte = Buckets(
            "llmgw_router_time_to_first_byte_seconds",
            "Time from request to the first byte of the answer sent to the client",
        )
        self.tokens: dict[str, list[int]] = {}  # model -> [prompt, completion]

    def collect(self) -> Iterator[Metric]:
        answers = CounterMetricFamily("llmgw_router_requests",
                                      "Requests answered, by model and HTTP status",
                                      labels=["model", "code"])  # fmt: skip
        for (model, code), count in list(self.answers.items()):
            answers.add_metric([model, str(code)], count)
        yield answers
        yield self.seconds.family()
        yield self.first_byte.family()
        prompt = CounterMetricFamily(
            "llmgw_router_prompt_tokens", "Prompt tokens engines reported", labels=["model"]
        )
        completion = CounterMetricFamily("llmgw_router_completion_tokens",
                                         "Completion tokens engines reported",
                                         labels=["model"])  # fmt: skip
        for model, (prompt_tokens, completion_tokens) in list(self.tokens.items()):
            if prompt_tokens:
                prompt.add_metric([model], prompt_tokens)
            if completion_tokens:
                completion.add_metric([model], completion_tokens)
        yield prompt
        yield completion
