"""A stand-in for the control plane's end of the agent link, for the agent's tests."""

from __future__ import annotations

import json

from websockets.asyncio.server import serve


class FakeControlPlane:
    """A websocket server that links agents (or refuses them) and records messages."""

    def __init__(self, refuse: str = "", drop: bool = False, epoch: int = 0) -> None:
        self.refuse = refuse
        self.drop = drop  # close every link right after accepting it
        self.epoch = epoch  # told in the answer to a register, when set
        self.received: list[dict] = []
        self.links = 0
        self.server = None
        self.port = 0

    async def handler(self, ws) -> None:
        first = json.loads(await ws.recv())
        self.received.append(first)
        if self.refuse:
            await ws.send(json.dumps({"type": "refused", "reason": self.refuse}))
            await ws.close(code=4001)
            return
        self.links += 1
        await ws.send(
            json.dumps({"type": "linked", **({"epoch": self.epoch} if self.epoch else {})})
        )
        if self.drop:
            await ws.close()
            return
        async for message in ws:
            self.received.append(json.loads(message))

    async def start(self, port: int = 0) -> FakeControlPlane:
        self.server = await serve(self.handler, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"
