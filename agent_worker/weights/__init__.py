"""Weights on a node: a local path used as is, a URL fetched once (resumed, written beside
its target and renamed when whole, single-flight across shards, progress reported), or
a hub id passed to engines that resolve it themselves. Files llmgw fetched carry a cache
name derived from the source's hash; only those may ever be deleted.
"""

from __future__ import annotations

from agent_worker.weights.fetch import (
    ChecksumMismatch,
    FetchCancelled,
    FetchSettings,
    ProgressCallback,
    WeightFetchError,
)
from agent_worker.weights.names import WeightSourceError
from agent_worker.weights.store import Resolved, WeightStore, fingerprint

__all__ = [
    "ChecksumMismatch",
    "FetchCancelled",
    "FetchSettings",
    "ProgressCallback",
    "Resolved",
    "WeightFetchError",
    "WeightSourceError",
    "WeightStore",
    "fingerprint",
]
