"""Small ASGI answers: JSON bodies, errors, the model entries of /v1/models."""

from __future__ import annotations

import json
from typing import Any

from router.errors import RouterError
from router.table.routes import ModelRoute
from router.translate import messages

JSON = [(b"content-type", b"application/json")]
MESSAGES_PATH = "/v1/messages"


def model_entry(route: ModelRoute, created: float) -> dict[str, Any]:
    replicas = {state: n for state, n in sorted(route.states.items()) if state != "ready"}
    entry: dict[str, Any] = {
        "id": route.name,
        "object": "model",
        "created": int(created),
        "owned_by": "llmgw",
    }
    if route.parent:
        entry["parent"] = route.parent  # a LoRA adapter on its base's replicas (as vLLM says)
    entry["llmgw"] = {
        "aliases": list(route.aliases),
        "serves": list(route.serves),
        "replicas": {"wanted": route.wanted, "ready": len(route.endpoints), **replicas},
    }
    return entry


def header(scope: dict, wanted: bytes) -> bytes | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return value
    return None


async def send_json(send, status: int, body: Any, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*JSON, (b"content-length", str(len(data)).encode()), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def send_empty(send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def send_error(send, error: RouterError, path: str = "") -> None:
    """The router's own refusal, in the shape the client's API has: Anthropic's for the
    Messages API (its SDK reads only that), OpenAI's for everything else."""
    data = error.body()
    if path.startswith(MESSAGES_PATH):
        data = messages.error_body(error.status, data)
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [*JSON, (b"content-length", str(len(data)).encode()), *error.headers],
        }
    )
    await send({"type": "http.response.body", "body": data})
