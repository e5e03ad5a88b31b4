"""Sockets at the control plane's /agent/, through Channels' WebsocketCommunicator."""

from __future__ import annotations

import asyncio
import json

from channels.testing import WebsocketCommunicator

from fleet.pki.tokens import node_token
from fleet.websockets import websocket_urlpatterns
from protocol import messages
from tests.fleet.inventories import inventory


def application():
    from channels.routing import URLRouter

    return URLRouter(websocket_urlpatterns)


def communicator(node_id: str, token: str | None = None) -> WebsocketCommunicator:
    headers = [(b"x-llmgw-node", node_id.encode())]
    if token is not False:
        headers.append((b"authorization", f"Bearer {token or node_token(node_id)}".encode()))
    return WebsocketCommunicator(application(), "/agent/", headers=headers)


def register(node_id: str, **fields) -> str:
    return messages.Register(
        inventory=inventory(node_id), engines_probed=True, **fields
    ).model_dump_json()


async def linked(node_id: str) -> WebsocketCommunicator:
    ws = communicator(node_id)
    connected, _ = await ws.connect()
    assert connected
    await ws.send_to(text_data=register(node_id))
    assert json.loads(await ws.receive_from())["type"] == "linked"
    return ws


async def consumer_ended(ws: WebsocketCommunicator, within: float = 2.0) -> bool:
    """True once the consumer has finished by itself: a refused link leaves nothing running."""
    for _ in range(int(within / 0.05)):
        if ws.future.done():
            return True
        await asyncio.sleep(0.05)
    return False
