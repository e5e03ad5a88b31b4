"""The agent link's control-plane end: one websocket per node at /agent/."""

from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer


class AgentConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        await self.close(code=4503, reason="the agent link is not available on this build yet")
