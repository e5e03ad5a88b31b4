"""The router's answers besides inference: ``/v1/models``, ``/health``, ``/metrics`` and a
browser's CORS preflight. Each reads what the router keeps and touches no engine (a stored
response's ``GET``/``DELETE`` goes to one: forward/stored.py)."""

from __future__ import annotations

import hmac
import time
from typing import Any

from router import errors
from router.balance.balancer import Balancer
from router.errors import RouterError
from router.intake.call import Send
from router.intake.cors import Cors
from router.metrics import RouterMetrics
from router.responses import header, model_entry, send_empty, send_json
from router.table.keeper import TableKeeper


async def preflight(scope: dict[str, Any], send: Send, cors: Cors) -> None:
    """A browser asking whether it may send the request it is about to."""
    allowed = cors.preflight(
        header(scope, b"origin"), header(scope, b"access-control-request-headers")
    )
    if allowed is None:
        raise RouterError(
            403, "This origin may not call the router from a browser; an operator adds "
            "it to LLMGW_ROUTER_CORS_ORIGINS.", "permission_error", "origin_not_allowed",
        )  # fmt: skip
    await send_empty(send, 204, allowed)


async def models(scope: dict[str, Any], send: Send, path: str, tables: TableKeeper) -> None:
    """``/v1/models`` (the models the key may use that have a ready replica) or one of them."""
    if scope["method"] != "GET":
        raise errors.method_not_allowed(scope["method"], "GET")
    tables.require_loaded()
    caller = tables.keys.authenticate(header(scope, b"authorization"), header(scope, b"x-api-key"))
    table = tables.table
    listed = [
        model_entry(route, table.loaded_at)
        for route in table.routes.values()
        if route.endpoints and caller.may_use(route.names)
    ]
    if path == "/v1/models":
        await send_json(send, 200, {"object": "list", "data": listed})
        return
    wanted = path.removeprefix("/v1/models/")
    route = table.by_name.get(wanted)
    entry = next((e for e in listed if route is not None and e["id"] == route.name), None)
    if entry is None:
        raise errors.unknown_model(wanted, [e["id"] for e in listed])
    await send_json(send, 200, entry)


async def health(scope: dict[str, Any], send: Send, tables: TableKeeper, token: str) -> None:
    """``/health``: 200 while a table is loaded (``degraded`` when it is the saved one).

    Anyone may ask (load balancers do), so the answer names no error: a failed table load's
    text can name the database's host and user. With the metrics token, when one is set,
    it carries the last error and the count of keys too."""
    table = tables.table
    loaded = table.loaded_at > 0
    # A saved table still serves (200), but what it says may be out of date.
    status = ("degraded" if table.source == "saved" else "ok") if loaded else "loading"
    body: dict[str, Any] = {
        "status": status,
        "mode": tables.source.mode,
        "table_source": table.source if loaded else None,
        "models": len(table.routes),
        "routable_models": sum(1 for r in table.routes.values() if r.endpoints),
        "table_age_seconds": round(time.time() - table.loaded_at, 3) if loaded else None,
    }
    if token and _bears(scope, token):
        body["api_keys"] = len(tables.keys)
        body["last_error"] = tables.refresher.last_error
    await send_json(send, 200 if loaded else 503, body)


def _bears(scope: dict[str, Any], token: str) -> bool:
    """Whether the request carries ``Authorization: Bearer <token>``, compared in constant
    time: a byte-by-byte compare would tell a prober how much it got right."""
    sent = header(scope, b"authorization") or b""
    return hmac.compare_digest(sent, f"Bearer {token}".encode())


async def scrape(
    scope: dict[str, Any], send: Send, token: str, metrics: RouterMetrics, balancer: Balancer,
    tables: TableKeeper,
) -> None:  # fmt: skip
    """``/metrics``, behind ``Authorization: Bearer <token>`` (router/config.py)."""
    if token and not _bears(scope, token):
        raise RouterError(
            401, "/metrics needs `Authorization: Bearer <token>`: LLMGW_METRICS_TOKEN, or the "
            "metrics-token file in the router's LLMGW_HOME.",
            "invalid_request_error", "invalid_metrics_token",
        )  # fmt: skip
    # Per-replica gauges come from the balancer at scrape time, not per request.
    metrics.replicas(
        [
            (route.name, e.replica, balancer.inflight(e.replica), balancer.is_open(e.replica))
            for route in tables.table.routes.values()
            for e in route.endpoints
        ]
    )
    body = metrics.render()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", metrics.content_type.encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
