"""The floor server of bench/heartbeats.py: a Channels consumer that only answers probes.

daphne loads it from the repository root as ``bench.heartbeat_floor:floor_application``,
so it imports nothing from this folder; the markers a probe carries are defined here.
"""

from __future__ import annotations

import json
import os

PROBER_PREFIX = "bench-probe-"
PROBE_FIELD_SUFFIX = ',"probe":1}'


def __getattr__(name: str):
    """``bench.heartbeat_floor:floor_application`` for daphne, built on first use."""
    if name == "floor_application":
        return _floor_application()
    raise AttributeError(name)


def _floor_application():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    import django

    django.setup()
    from channels.generic.websocket import AsyncWebsocketConsumer
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.urls import path

    reply = json.dumps({"type": "error", "reason": "floor"})

    class FloorConsumer(AsyncWebsocketConsumer):
        """Accept, answer probes, drop everything else: the least a consumer can do."""

        prober = False

        async def dispatch(self, message) -> None:
            # The same shortcut as AgentConsumer: no hop to the sync thread per message.
            await getattr(self, message["type"].replace(".", "_"))(message)

        async def connect(self) -> None:
            headers = dict(self.scope.get("headers", []))
            self.prober = headers.get(b"x-llmgw-node", b"").startswith(PROBER_PREFIX.encode())
            await self.accept()

        async def receive(self, text_data=None, bytes_data=None) -> None:
            if self.prober or (text_data or "").endswith(PROBE_FIELD_SUFFIX):
                await self.send(reply)

    return ProtocolTypeRouter({"websocket": URLRouter([path("agent/", FloorConsumer.as_asgi())])})
