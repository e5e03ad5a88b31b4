"""A request's body as one replica's engine must get it when LoRA adapters are involved.

llama.cpp serves every adapter it loaded under the base model's name and applies each at
the scale the request's ``lora`` field gives; one it omits is applied at its loaded scale
(1.0, whatever ``--lora-init-without-apply`` promises: DESIGN.md, "Pitfalls"). So every
request to a llama.cpp replica with adapters names them all: the one asked for at its
scale, the others at 0, and a request for the base model all at 0. vLLM serves an adapter
under its own model id (``<model>:<adapter>``, the name llmgw loads it under), which is
the name the route already writes: nothing to add.
"""

from __future__ import annotations

import json
from typing import Any

from router.table.routes import Endpoint, ModelRoute
from router.wire.compact_json import compact_json

LLAMA_CPP = "llama.cpp"


def needs_rewrite(route: ModelRoute, endpoint: Endpoint) -> bool:
    """Say whether ``endpoint``'s engine must be told which adapters to apply."""
    return endpoint.engine == LLAMA_CPP and bool(endpoint.adapters)


def lora_field(route: ModelRoute, endpoint: Endpoint) -> list[dict[str, Any]]:
    """llama.cpp's ``lora`` list for ``route`` on ``endpoint``: every adapter it loaded, by
    id, at 0 except the one asked for."""
    return [
        {"id": index, "scale": route.scale if name == route.adapter else 0.0}
        for index, name in enumerate(endpoint.adapters)
    ]


def body_for(body: bytes, route: ModelRoute, endpoint: Endpoint) -> bytes:
    """``body`` (a JSON object) as ``endpoint`` must get it for ``route``; unchanged where
    its engine needs nothing added."""
    if not needs_rewrite(route, endpoint):
        return body
    payload = json.loads(body)
    if not isinstance(payload, dict):
        return body
    payload["lora"] = lora_field(route, endpoint)
    if route.parent:
        payload["model"] = route.parent  # llama.cpp serves its adapters under the base's name
    return compact_json(payload)
