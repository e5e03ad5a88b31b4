"""The control plane's outbound HTTP client: one place that says how llmgw calls out
(its user agent, and a timeout always set)."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

USER_AGENT = "llmgw-control-plane"


def outbound_client(
    base_url: str, timeout: float, headers: Mapping[str, str] | None = None
) -> httpx.Client:
    """A client for one outside service (Prometheus, a model index), closed by its caller."""
    return httpx.Client(
        base_url=base_url,
        timeout=timeout,
        headers={"User-Agent": USER_AGENT, **(headers or {})},
    )
