"""What this router served, per model, since its last report: the model page's traffic.

Counted on the request path as a few dictionary additions (``RouterMetrics`` feeds it),
and added into Redis by the in-flight report loop every second (inflight.py), into the
per-model buckets ``protocol.routing`` describes. The control plane reads them back
(``fleet/traffic.py``) for the last hour's charts, with no Prometheus needed.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict

from protocol.routing import TRAFFIC_KEEP_SECONDS, TTFT_EDGES, traffic_key

# A time to first byte's field, by the index of the first edge at or above it.
TTFT_FIELDS = [*(f"ttft:{index}" for index in range(len(TTFT_EDGES))), "ttft:inf"]


class Traffic:
    """Counts by model since the last ``take``."""

    def __init__(self) -> None:
        self._counts: defaultdict[str, defaultdict[str, int]] = defaultdict(
            lambda: defaultdict(int)
        )

    def request(self, model: str, code: int) -> None:
        if not model:
            return  # refused before a model was known: no model's traffic
        counts = self._counts[model]
        counts["requests"] += 1
        if code >= 400:
            counts[f"error:{code}"] += 1

    def first_byte(self, model: str, seconds: float) -> None:
        self._counts[model][TTFT_FIELDS[bisect_left(TTFT_EDGES, seconds)]] += 1

    def tokens(self, model: str, prompt: int, completion: int) -> None:
        counts = self._counts[model]
        counts["prompt"] += prompt
        counts["completion"] += completion

    def failure(self, model: str, kind: str) -> None:
        """An attempt at a replica that failed (the client may still have been answered)."""
        self._counts[model][f"error:{kind}"] += 1

    def take(self) -> dict[str, dict[str, int]]:
        counts, self._counts = self._counts, defaultdict(lambda: defaultdict(int))
        return {model: dict(fields) for model, fields in counts.items()}


async def add_traffic(client, counts: dict[str, dict[str, int]], now: float) -> None:
    """Add one report's counts into their models' buckets, in one round trip."""
    if not counts:
        return
    pipe = client.pipeline(transaction=False)
    for model, fields in counts.items():
        key = traffic_key(model, now)
        for field, value in fields.items():
            if value:
                pipe.hincrby(key, field, value)
        pipe.expire(key, TRAFFIC_KEEP_SECONDS)
    await pipe.execute()


def with_load(
    counts: dict[str, dict[str, int]], models: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """``counts`` with each model's requests in flight and waiting now (one second's worth)."""
    for model, load in models.items():
        fields = counts.setdefault(model, {})
        fields["inflight"] = fields.get("inflight", 0) + load["inflight"]
        fields["waiting"] = fields.get("waiting", 0) + load["queued"]
    return counts
