"""The agent link's control-plane end: one websocket per node at /agent/.

Only the node's own token admits it, and a node cannot speak for another id.
Heartbeats touch no ORM on arrival (they are batched), so this consumer skips
Channels' per-message hop to the sync thread that closes old DB connections.
"""

from __future__ import annotations

import json
import logging
from typing import NoReturn

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from fleet import leadership, services
from fleet.heartbeats import batcher
from fleet.node_auth import verify_node_token
from protocol import messages

log = logging.getLogger("llmgw.fleet.link")


class AgentConsumer(AsyncWebsocketConsumer):
    # No channel layer: nothing reaches an agent through it (commands go through Celery),
    # and each subscription is one more blocking Redis read per node, whose cancellation
    # outlived a refused link by seconds or hung its teardown.
    channel_layer_alias = "agents-use-no-channel-layer"
    node_id: str | None = None
    registered = False

    async def dispatch(self, message) -> None:
        # Skip aclose_old_connections for the hot path; ORM work below goes through
        # database_sync_to_async, which manages connections itself.
        handler = getattr(self, message["type"].replace(".", "_"), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        await self.accept()
        headers = dict(self.scope.get("headers", []))
        claimed = headers.get(b"x-llmgw-node", b"").decode(errors="replace")
        authorization = headers.get(b"authorization", b"").decode(errors="replace")
        token = authorization.removeprefix("Bearer ").strip()
        node_id = verify_node_token(token) if token else None
        # Authenticate first: who leads is not for just anyone to learn.
        if node_id is None:
            await self._refuse(
                messages.CLOSE_UNAUTHENTICATED,
                f"node {claimed or '(unnamed)'} sent no valid node token; put the output of "
                f"`llmgw_ctl node-token {claimed or 'NODE'}` in the agent's token setting",
            )
        if claimed and claimed != node_id:
            await self._refuse(
                messages.CLOSE_IDENTITY_MISMATCH,
                f"this link claims to be node {claimed!r} but its token was issued to "
                f"{node_id!r}; give each node its own token",
            )
        leader = await database_sync_to_async(leadership.leader_for_links)()
        if leader is not None:
            await self._refuse(messages.CLOSE_NOT_LEADER, f"this control plane is a standby; "
                               f"the leader is {leader}")  # fmt: skip
        self.node_id = node_id

    async def _refuse(self, code: int, reason: str) -> NoReturn:
        log.warning("refused an agent link: %s", reason)
        # Daphne drops a close frame's reason, so say it in a message first.
        await self.send(json.dumps({"type": "refused", "code": code, "reason": reason}))
        await self.close(code=code)
        # End this consumer now: nothing of a refused link may keep running until the
        # server gets round to sending a disconnect (a leak per refused connection).
        raise StopConsumer()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if self.node_id is None:
            return
        try:
            message = messages.parse_message(text_data if text_data is not None else bytes_data)
        except messages.MessageError as exc:
            reason = f"malformed message from node {self.node_id}: {exc}"
            log.warning(reason)
            await self.send(json.dumps({"type": "error", "reason": reason}))
            return
        if isinstance(message, messages.Register):
            await self._register(message)
        elif not self.registered:
            await self.send(json.dumps({"type": "error", "reason": "send register first"}))
        elif isinstance(message, messages.Heartbeat):
            batcher.record(self.node_id, message.usage.model_dump(mode="json"))
        elif isinstance(message, messages.ShardStatus):
            await database_sync_to_async(services.record_shard_status)(self.node_id, message)
        elif isinstance(message, messages.ShardProgress):
            await database_sync_to_async(services.record_shard_progress)(self.node_id, message)
        elif isinstance(message, messages.Engines):
            await database_sync_to_async(services.update_engines)(self.node_id, message)
        elif isinstance(message, messages.Weights):
            await database_sync_to_async(services.update_weights)(self.node_id, message)
        elif isinstance(message, messages.CommandRefused):
            await database_sync_to_async(services.record_refused_command)(self.node_id, message)

    async def _register(self, message: messages.Register) -> None:
        assert self.node_id is not None
        if message.inventory.hostname != self.node_id:
            await self._refuse(
                messages.CLOSE_IDENTITY_MISMATCH,
                f"register describes host {message.inventory.hostname!r} on the link of node "
                f"{self.node_id!r}; the node id must be its hostname",
            )
            return
        answer = await database_sync_to_async(services.link_node)(self.node_id, message)
        self.registered = True
        await self.send(json.dumps(answer))

    async def disconnect(self, code) -> None:
        if self.node_id and self.registered:
            log.info("node %s link closed (%s)", self.node_id, code)
