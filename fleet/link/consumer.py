"""The agent link's control-plane end: one websocket per node at /agent/.

Only the node's own certificate (or, while a fleet moves over, its token) admits it, and a
node cannot speak for another id. A socket must prove itself within LINK_PROOF_TIMEOUT,
and only so many may wait at once from one address (``admission``). A revoked node is
refused, and its open link closed (``revocations``). The "linked" answer tells the node its
command key, signed so the agent knows who sent it (``fleet.pki.linked``).
Heartbeats touch no ORM on arrival (they are batched), so this consumer skips
Channels' per-message hop to the sync thread that closes old DB connections.
"""

from __future__ import annotations

import asyncio
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
from fleet.actions.certificates import link_proven
from fleet.link.admission import peer_address, pending
from fleet.link.heartbeats import batcher
from fleet.link.node_address import address_problem
from fleet.link.revocations import live_links
from fleet.pki.authority import PkiError
from fleet.pki.keys import command_key
from fleet.pki.linked import prove_linked
from fleet.pki.revocation import is_token_generation, token_generation
from fleet.pki.tokens import verify_node_token
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
    # The agent's nonce for this link, which the "linked" answer is signed over.
    agent_nonce = ""
    token = ""
    # What the node's command key derives from: the proven certificate's serial, or token….
    generation = ""
    # Where a socket waiting to prove itself is counted, and the timer that closes it.
    pending_from: str | None = None
    proof_timer: asyncio.Task | None = None
    # Set once the node was revoked: nothing more it sends is taken.
    revoked = False

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
        self.agent_nonce = headers.get(b"x-llmgw-link-nonce", b"").decode(errors="replace")[:64]
        token = authorization.removeprefix("Bearer ").strip()
        if not token and headers.get(b"x-llmgw-auth") == b"certificate" and claimed:
            await self._challenge(claimed)
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
        generation = await database_sync_to_async(token_generation)(node_id)
        if generation is None:
            await self._refuse(
                messages.CLOSE_UNAUTHENTICATED,
                f"node {node_id} was revoked (llmgw_ctl ca revoke), and its token with it; "
                f"`llmgw_ctl onboard {node_id}` lets it back in",
            )
        self.token, self.generation = token, generation
        await self._admit(node_id)

    async def _challenge(self, claimed: str) -> None:
        """The agent proves itself with its certificate: a fresh nonce comes first, and it
        has LINK_PROOF_TIMEOUT to sign it, one of at most so many from its address."""
        address = peer_address(self.scope)
        limit = settings.LINK_PENDING_PER_ADDRESS
        if not pending.take(address, limit):
            await self._refuse(
                messages.CLOSE_UNAUTHENTICATED,
                f"{limit} links from {address} are waiting to prove themselves already; "
                "try again in a moment (LLMGW_LINK_PENDING_PER_ADDRESS)",
            )
        self.pending_from = address
        self.claimed, self.nonce = claimed, secrets.token_hex(16)
        self.proof_timer = asyncio.get_running_loop().create_task(self._close_unproven())
        await self.send(json.dumps({"type": "challenge", "nonce": self.nonce}))

    async def _close_unproven(self) -> None:
        timeout = settings.LINK_PROOF_TIMEOUT
        await asyncio.sleep(timeout)
        if self.nonce is None:
            return
        self.nonce = None
        self._end_pending()
        reason = (f"node {self.claimed} did not answer the challenge within {timeout:g} s "
                  "(LLMGW_LINK_PROOF_TIMEOUT)")  # fmt: skip
        log.warning("refused an agent link: %s", reason)
        await self._say_and_close(messages.CLOSE_UNAUTHENTICATED, reason)

    def _end_pending(self) -> None:
        """The socket proved itself, failed to, or went: it waits no more."""
        if self.proof_timer is not None and self.proof_timer is not asyncio.current_task():
            self.proof_timer.cancel()
        self.proof_timer = None
        if self.pending_from is not None:
            pending.release(self.pending_from)
            self.pending_from = None

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
            serial = await database_sync_to_async(link_proven)(
                certificate, self.claimed, nonce, signature, actor=AGENT_LINK
            )
        except PkiError as exc:
            await self._refuse(messages.CLOSE_UNAUTHENTICATED,
                               f"node {self.claimed} refused: {exc}")  # fmt: skip
        self._end_pending()
        self.generation = str(serial)
        await self._admit(self.claimed)

    async def _refuse(self, code: int, reason: str) -> NoReturn:
        log.warning("refused an agent link: %s", reason)
        self._end_pending()
        live_links.remove(self)
        await self._say_and_close(code, reason)
        # End this consumer now: nothing of a refused link may keep running until the
        # server gets round to sending a disconnect (a leak per refused connection).
        raise StopConsumer()

    async def _say_and_close(self, code: int, reason: str) -> None:
        # Daphne drops a close frame's reason, so say it in a message first.
        await self.send(json.dumps({"type": "refused", "code": code, "reason": reason}))
        await self.close(code=code)

    async def close_revoked(self) -> None:
        """Close this link: its node was revoked (``revocations.live_links`` found it so)."""
        self.revoked = True
        if is_token_generation(self.generation):
            reason = f"node {self.node_id} was revoked (llmgw_ctl ca revoke); the link is closed"
        else:
            reason = (f"the certificate of node {self.node_id} (serial {self.generation}) was "
                      "revoked; the link is closed")  # fmt: skip
        log.warning("closed an agent link: %s", reason)
        await self._say_and_close(messages.CLOSE_UNAUTHENTICATED, reason)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if self.revoked:
            return  # closed already; frames in flight are not taken
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
        problem = address_problem(self.node_id, message.inventory.address, peer_address(self.scope))
        if problem:
            await self._refuse(messages.CLOSE_IDENTITY_MISMATCH, problem)
            return
        answer = await database_sync_to_async(reports.link_node)(
            self.node_id, message, actor=AGENT_LINK, key_generation=self.generation
        )
        # The key its commands are signed with: only this link, proven, learns it.
        answer["command_key"] = key = command_key(self.node_id, self.generation)
        # The epoch that leads: a node away through a failover learns it here, even once
        # the new leader's announcement has expired, and refuses the deposed leader.
        epoch = await database_sync_to_async(_leading_epoch)()
        if epoch:
            answer["epoch"] = epoch
        answer["proof"] = prove_linked(self.agent_nonce, self.node_id, key, epoch,
                                       token=self.token)  # fmt: skip
        if not self.registered:
            await live_links.add(self)
        self.registered = True
        await self.send(json.dumps(answer))

    async def disconnect(self, code) -> None:
        self._end_pending()
        live_links.remove(self)
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
