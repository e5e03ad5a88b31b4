"""The router: OpenAI-compatible /v1 in front of every ready replica (its own process)."""

from __future__ import annotations

import json


async def application(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    if scope["path"] == "/health":
        await _json(send, 200, {"status": "ok"})
    elif scope["path"] == "/v1/models":
        await _json(send, 200, {"object": "list", "data": []})
    else:
        await _json(send, 404, {"error": {"message": "not found", "type": "invalid_request_error",
                                          "code": "not_found"}})  # fmt: skip


async def _json(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": data})
