"""LoRA adapters loaded on a replica when a request asks for one it does not have (vLLM).

vLLM loads and unloads adapters while it runs (``/v1/load_lora_adapter``, ``/unload``,
with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, which the agent sets once a profile's
``max_loras`` turns LoRA on). This router keeps, per replica, the adapters it loaded there,
least recently used first, and holds at most ``max_loras`` on one replica with those the
replica started with: to load one more it first unloads the one used least recently. An
adapter another router loaded already is taken as loaded (vLLM answers 400 "already
loaded"). Loads on one replica go one at a time, so two requests never load one twice.

Cost: nothing for a request to a model, a llama.cpp replica or an adapter already loaded
(one dict lookup); one engine round trip (two with an unload) for the first request of an
adapter on a replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict

from router import errors
from router.table.routes import Endpoint, ModelRoute
from router.wire.upstream import Upstream, UpstreamUnreachable

logger = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
JSON = (b"content-type", b"application/json")


class LoraLoads:
    """The adapters this router loaded on each replica, least recently used first."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.loaded: dict[str, OrderedDict[str, None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def has(self, route: ModelRoute, endpoint: Endpoint) -> bool:
        """Say whether ``endpoint`` serves ``route`` now, without loading anything."""
        if not route.adapter or route.adapter in endpoint.adapters:
            return True
        return route.name in self.loaded.get(endpoint.replica, ())

    def hot(self, route: ModelRoute) -> tuple[Endpoint, ...]:
        """``route``'s endpoints that have its adapter loaded; all of them if none has."""
        loaded = tuple(e for e in route.endpoints if self.has(route, e))
        return loaded or route.endpoints

    def use_now(self, route: ModelRoute, endpoint: Endpoint) -> bool:
        """``ensure`` without a wait: whether ``endpoint`` serves ``route`` as it is."""
        if not self.has(route, endpoint):
            return False
        self._used(route, endpoint)
        return True

    async def ensure(self, route: ModelRoute, endpoint: Endpoint) -> None:
        """Have ``endpoint`` serve ``route``'s adapter, loading it there if it must;
        UpstreamUnreachable when the engine cannot be reached, 502 when it refuses."""
        if self.use_now(route, endpoint):
            return
        lock = self._locks.setdefault(endpoint.replica, asyncio.Lock())
        async with lock:
            if self.has(route, endpoint):
                self._used(route, endpoint)
                return
            loaded = self.loaded.setdefault(endpoint.replica, OrderedDict())
            room = max(endpoint.max_loras - len(endpoint.adapters), 1)
            while len(loaded) >= room:
                least, _ = loaded.popitem(last=False)
                await self._call(endpoint, UNLOAD_PATH, {"lora_name": least}, "unload")
            await self._call(
                endpoint, LOAD_PATH, {"lora_name": route.name, "lora_path": route.source}, "load"
            )
            loaded[route.name] = None
            logger.info("loaded adapter %s on replica %s", route.name, endpoint.replica[:8])

    def _used(self, route: ModelRoute, endpoint: Endpoint) -> None:
        loaded = self.loaded.get(endpoint.replica)
        if loaded is not None and route.name in loaded:
            loaded.move_to_end(route.name)

    async def _call(self, endpoint: Endpoint, path: str, body: dict, verb: str) -> None:
        headers = [JSON]
        if endpoint.authorization:
            headers.append((b"authorization", endpoint.authorization))
        response = await self.upstream.post(endpoint.url, path, json.dumps(body).encode(), headers)
        try:
            answer = (await response.read()).decode(errors="replace")
        finally:
            response.close()
        if response.status < 300:
            return
        # Another router got there first (or it is gone already): the state wanted holds.
        if verb == "load" and response.status == 400 and "already" in answer:
            return
        if verb == "unload" and response.status in (400, 404):
            return
        if response.status >= 500:
            raise UpstreamUnreachable("http", f"{endpoint.url}{path}: {response.status}")
        raise errors.bad_gateway(
            f"The engine of replica {endpoint.replica[:8]} refused to {verb} LoRA adapter "
            f"{body['lora_name']}: {response.status} {answer[:300]}"
        )
