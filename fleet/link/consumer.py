"""The agent link's control-plane end: one websocket per node at /agent/.

Only the node's own token admits it, and a node cannot speak for another id.
Heartbeats touch no ORM on arrival (they are batched), so this consumer skips
Channels' per-message hop to the sync thread that closes old DB connections.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any, NoReturn

import redis
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from audit.actors import AGENT_LINK
from fleet import leadership
from fleet.actions import reports, shard_reports
from fleet.link.heartbeats import batcher
from fleet.pki.authority import PkiError
from fleet.pki.tokens import node_token, verify_node_token
from fleet.pki.verify import check_link_proof
from protocol import messages

log = logging.getLogger("llmgw.fleet.link")


class AgentConsumer(AsyncWebsocketConsumer):
    # No channel layer: nothing reaches an agent through it (commands go through Celery),
    # and each subscription is one more blocking Redis read per node, whose cancellation
    # outlived a refused link by seconds or hung its teardown.
    channel_layer_alias = "agents-use-no-channel-layer"
    node_id: str | None = None
    registered = False
    # Set while a certificate's proof of possession is awaited: the nonce it must sign.
    nonce: str | None = None
    claimed = ""
    by_certificate = False

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
        if not token and headers.get(b"x-llmgw-auth") == b"certificate" and claimed:
            # The agent proves itself with its certificate: a fresh nonce comes first.
            self.claimed, self.nonce = claimed, secrets.token_hex(16)
            await self.send(json.dumps({"type": "challenge", "nonce": self.nonce}))
            return
        if token and settings.LLMGW_NODE_AUTH != "token":
            await self._refuse(
                messages.CLOSE_UNAUTHENTICATED,
                f"node {claimed or '(unnamed)'} links with a token, and this control plane "
                f"takes node certificates only: give it a bundle from `llmgw_ctl onboard "
                f"{claimed or 'NODE'}`, or set LLMGW_NODE_AUTH=token while moving nodes over",
            )
        node_id = verify_node_token(token) if token else None
        # Authenticate first: who leads is not for just anyone to learn.
        if node_id is None:
            await self._refuse(
                messages.CLOSE_UNAUTHENTICATED,
                f"node {claimed or '(unnamed)'} sent no valid node token nor a certificate; "
                f"give it a bundle from `llmgw_ctl onboard {claimed or 'NODE'}` (or the output "
                f"of `llmgw_ctl node-token {claimed or 'NODE'}` in its token setting)",
            )
        if claimed and claimed != node_id:
            await self._refuse(
                messages.CLOSE_IDENTITY_MISMATCH,
                f"this link claims to be node {claimed!r} but its token was issued to "
                f"{node_id!r}; give each node its own token",
            )
        await self._admit(node_id)

    async def _admit(self, node_id: str) -> None:
        leader = await database_sync_to_async(leadership.leader_for_links)()
        if leader is not None:
            await self._refuse(messages.CLOSE_NOT_LEADER, f"this control plane is a standby; "
                               f"the leader is {leader}")  # fmt: skip
        self.node_id = node_id

    async def _check_proof(self, text: str | None) -> None:
        """The answer to the challenge: the node's certificate and its key's signature."""
        assert self.nonce is not None
        nonce, self.nonce = self.nonce, None
        try:
            proof = json.loads(text or "")
            certificate = str(proof["certificate"]).encode()
            signature = base64.b64decode(str(proof["signature"]), validate=True)
        except (ValueError, KeyError, TypeError):
            await self._refuse(messages.CLOSE_UNAUTHENTICATED,
                               f"node {self.claimed} did not answer the challenge with a proof "
                               "(its certificate and a signature)")  # fmt: skip
        try:
            await database_sync_to_async(check_link_proof)(
                certificate, self.claimed, nonce, signature
            )
        except PkiError as exc:
            await self._refuse(messages.CLOSE_UNAUTHENTICATED,
                               f"node {self.claimed} refused: {exc}")  # fmt: skip
        self.by_certificate = True
        await self._admit(self.claimed)

    async def _refuse(self, code: int, reason: str) -> NoReturn:
        log.warning("refused an agent link: %s", reason)
        # Daphne drops a close frame's reason, so say it in a message first.
        await self.send(json.dumps({"type": "refused", "code": code, "reason": reason}))
        await self.close(code=code)
        # End this consumer now: nothing of a refused link may keep running until the
        # server gets round to sending a disconnect (a leak per refused connection).
        raise StopConsumer()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        frame = text_data if text_data is not None else bytes_data
        if frame is not None and len(frame) > settings.LINK_MAX_FRAME:
            # Refused by size before parsing: no agent sends this much in one message.
            await self._refuse(
                messages.CLOSE_BAD_MESSAGE,
                f"node {self.node_id or self.claimed or '(unnamed)'} sent a frame of "
                f"{len(frame)} bytes, over the limit of {settings.LINK_MAX_FRAME} "
                "(LLMGW_LINK_MAX_FRAME)",
            )
        if self.nonce is not None:
            await self._check_proof(text_data)
            return
        if self.node_id is None:
            return
        try:
            message = messages.parse_message(frame)
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
            await _report(shard_reports.record_shard_status, self.node_id, message)
        elif isinstance(message, messages.ShardProgress):
            await _report(shard_reports.record_shard_progress, self.node_id, message)
        elif isinstance(message, messages.Engines):
            await _report(reports.update_engines, self.node_id, message)
        elif isinstance(message, messages.Weights):
            await _report(reports.update_weights, self.node_id, message)
        elif isinstance(message, messages.CommandRefused):
            await _report(reports.record_refused_command, self.node_id, message)

    async def _register(self, message: messages.Register) -> None:
        assert self.node_id is not None
        if message.inventory.hostname != self.node_id:
            await self._refuse(
                messages.CLOSE_IDENTITY_MISMATCH,
                f"register describes host {message.inventory.hostname!r} on the link of node "
                f"{self.node_id!r}; the node id must be its hostname",
            )
            return
        answer = await _report(reports.link_node, self.node_id, message)
        if self.by_certificate:
            # The key its commands are signed with: only this link, proven, learns it.
            answer["command_key"] = node_token(self.node_id)
        # The epoch that leads: a node away through a failover learns it here, even once
        # the new leader's announcement has expired, and refuses the deposed leader.
        epoch = await database_sync_to_async(_leading_epoch)()
        if epoch:
            answer["epoch"] = epoch
        self.registered = True
        await self.send(json.dumps(answer))

    async def disconnect(self, code) -> None:
        if self.node_id and self.registered:
            log.info("node %s link closed (%s)", self.node_id, code)


async def _report(verb: Callable[..., Any], node_id: str, message: object) -> Any:
    """Run a report verb on the database thread, as the agent link."""
    return await database_sync_to_async(verb)(node_id, message, actor=AGENT_LINK)


def _leading_epoch() -> int:
    """The lease's epoch, 0 when there is none or Redis cannot say."""
    try:
        lease = leadership.current()
    except redis.RedisError:
        return 0
    return lease.epoch if lease is not None else 0
