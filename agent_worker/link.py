"""The agent's end of the link: one websocket it dials out to the control plane.

It reconnects forever over the configured addresses: after a failure it goes
straight to the next address it has not just tried, and only when every address
has just failed does it wait, with jittered exponential backoff — the delay exists
to stop hammering one control plane, and the next one has not been hammered.

Events (shard statuses) are queued and all sent, in order. Statements of a whole (the
engines, the weights) keep only their latest unsent one: an older one sent after a newer
would stand on the control plane until the next change.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import random
import secrets
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from agent_worker.control_plane_proof import LinkedAnswerRefused, check_linked_answer
from agent_worker.identity import NodeIdentity
from protocol.messages import CLOSE_BAD_MESSAGE, Heartbeat, Register

log = logging.getLogger("llmgw.agent.link")

BACKOFF_BASE = 1.0
# A node whose link comes back is heard again within this long, well inside the 60 s after
# which it is lost: a 40 s cut must not become a lost node by the agent's own sleep. The
# jitter still spreads a 10,000-node fleet's reconnects over 7.5 s (about 1,300 a second).
BACKOFF_MAX = 15.0
OPEN_TIMEOUT = 5.0
# Messages kept while unlinked; past this the oldest go (register resends the state).
OUTBOX_LIMIT = 10_000
# A session this long resets the backoff; a shorter one counts as a failed round.
STABLE_SESSION = 30.0
# Bounded so that stopping the agent never waits on a peer that does not answer.
CLOSE_TIMEOUT = 2.0


@dataclass
class LinkCallbacks:
    register: Callable[[], Register]
    heartbeat: Callable[[], Heartbeat]
    # The leader's epoch, as the control plane names it when it links the node.
    epoch: Callable[[int], object] | None = None


def backoff_delay(failed_rounds: int, rng: random.Random | None = None) -> float:
    """Uniform in [c/2, c] for c = min(max, base * 2**(n-1)): never sooner than half the
    ceiling, and jittered so that a fleet that lost its control plane never reconnects in step."""
    ceiling = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** max(0, failed_rounds - 1))
    return (rng or random).uniform(ceiling / 2, ceiling)


def _decode(message: str | bytes) -> dict:
    try:
        value = json.loads(message)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def agent_url(server: str) -> str:
    """``wss://host:port`` or ``https://…`` → the link's websocket URL at /agent/."""
    url = server.rstrip("/")
    for plain, secure in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(plain):
            url = secure + url[len(plain) :]
    if not url.startswith(("ws://", "wss://")):
        url = "ws://" + url
    return url if url.endswith("/agent") else url + "/agent/"


class AgentLink:
    """Keep one link open to some control plane, sending register, heartbeats and events."""

    def __init__(
        self,
        servers: Sequence[str],
        node_id: str,
        token: str,
        callbacks: LinkCallbacks,
        *,
        heartbeat_interval: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        identity: NodeIdentity | None = None,
    ) -> None:
        self.servers = list(servers)
        self.node_id = node_id
        self.token = token
        # With a certificate the agent proves itself by it, else by its token; either way it
        # learns its command key from a "linked" answer whose sender proved itself.
        self.identity = identity
        self.command_key = ""
        self.callbacks = callbacks
        self.heartbeat_interval = heartbeat_interval
        self.ssl_context = ssl_context
        self.connected_to: str | None = None
        self.sessions = 0
        # Events wait here while unlinked and go out right after the next register: a
        # transition between building a register and linking must not be lost.
        self._outbox: collections.deque[str] = collections.deque(maxlen=OUTBOX_LIMIT)
        # Statements of a whole (the engines, the weights), by kind: only the latest of
        # each is worth sending, and an older one sent after a newer would stand.
        self._statements: dict[str, str] = {}
        self._statements_lock = threading.Lock()
        self._outbox_ready: asyncio.Event | None = None
        self._register_wanted: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    def send(self, message: BaseModel) -> None:
        """Queue a message from any thread; it goes out as soon as the link is up."""
        self._outbox.append(message.model_dump_json())
        self._wake(self._outbox_ready)

    def send_latest(self, kind: str, message: BaseModel) -> None:
        """Queue a statement of the whole of ``kind``, replacing any of that kind not yet
        sent. Callers queue in the order they made them (under their own lock)."""
        with self._statements_lock:
            self._statements.pop(kind, None)  # re-inserted last: sent in the order queued
            self._statements[kind] = message.model_dump_json()
        self._wake(self._outbox_ready)

    def forget(self, kind: str) -> None:
        """Drop the unsent statement of ``kind``: a register about to go says it anew."""
        with self._statements_lock:
            self._statements.pop(kind, None)

    def request_register(self) -> None:
        """Send a fresh register on the link now up (or with the next one): for facts the
        protocol carries only there, found after the node registered."""
        self._wake(self._register_wanted)

    def _wake(self, event: asyncio.Event | None) -> None:
        loop = self._loop
        if loop is not None and event is not None:
            # A loop closed by stop() has nothing to wake; what was queued waits for a run.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    def stop(self) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def run(self) -> None:
        """Link, relink, forever, until stop()."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._outbox_ready = asyncio.Event()
        self._register_wanted = asyncio.Event()
        failed_rounds = 0
        while not self._stop.is_set():
            linked_for: float | None = None
            for server in self.servers:
                if self._stop.is_set():
                    return
                began = self._loop.time()
                try:
                    linked = await self._session(server)
                except Exception:
                    # A bug in one session must not end the link for the agent's life.
                    log.exception("link session with %s failed", server)
                    linked = False
                if linked:
                    linked_for = self._loop.time() - began
                    # A control plane that restarts is rejoined from the first address.
                    break
            if linked_for is not None and linked_for >= STABLE_SESSION:
                failed_rounds = 0
                continue
            if self._stop.is_set():
                return
            if linked_for is not None:
                # One that links and then drops at once must not be hit in a tight loop.
                log.warning("the link lasted only %.1fs; backing off before linking again",
                            linked_for)  # fmt: skip
            failed_rounds += 1
            delay = backoff_delay(failed_rounds)
            log.info("every control plane address failed; retrying in %.1fs", delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=delay)

    async def _session(self, server: str) -> bool:
        """One connection's life; True if it linked (however it ended)."""
        url = agent_url(server)
        # The control plane signs its "linked" answer over this: good for this link only.
        nonce = secrets.token_hex(16)
        headers = {"X-Llmgw-Node": self.node_id, "X-Llmgw-Link-Nonce": nonce}
        if self.identity is not None:
            headers["X-Llmgw-Auth"] = "certificate"
        else:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            ws = await connect(
                url,
                additional_headers=headers,
                open_timeout=OPEN_TIMEOUT,
                close_timeout=CLOSE_TIMEOUT,
                ssl=self.ssl_context if url.startswith("wss://") else None,
                max_size=2**22,
            )
        except InvalidStatus as exc:
            log.warning("control plane %s refused the link: HTTP %s", url, exc.response.status_code)
            return False
        except (OSError, TimeoutError, ConnectionClosed) as exc:
            log.warning("cannot reach control plane %s: %s", url, exc or type(exc).__name__)
            return False
        try:
            if self.identity is not None and not await self._prove(ws, url):
                await ws.close()
                return False
            if self._register_wanted is not None:
                self._register_wanted.clear()  # the register built now says it all
            register = await asyncio.to_thread(self.callbacks.register)
            with contextlib.suppress(ConnectionClosed):
                # A standby refuses before reading: its reason may already be waiting.
                await ws.send(register.model_dump_json())
            # The control plane answers a register with "linked" or closes with a reason.
            first = await asyncio.wait_for(ws.recv(), timeout=OPEN_TIMEOUT)
        except ConnectionClosed as exc:
            self._log_close(url, exc, linked=False)
            return False
        except TimeoutError:
            log.warning("control plane %s did not answer the register in %ss", url, OPEN_TIMEOUT)
            await ws.close()
            return False
        answer = _decode(first)
        if answer.get("type") != "linked":
            # Daphne drops a close frame's reason, so the refusal arrives as a message.
            log.warning("control plane %s refused the link: %s", url, answer.get("reason", first))
            await ws.close()
            return False
        if not self._take_key(answer, url, nonce):
            await ws.close()
            return False
        log.info("linked to control plane %s as %s", url, self.node_id)
        self.connected_to = url
        self.sessions += 1
        try:
            await self._linked(ws, url, nonce)
        except ConnectionClosed as exc:
            self._log_close(url, exc, linked=True)
        finally:
            self.connected_to = None
            await ws.close()
        return True

    async def _prove(self, ws: ClientConnection, url: str) -> bool:
        """Answer the control plane's challenge with the node certificate and a signature."""
        assert self.identity is not None
        challenge = _decode(await asyncio.wait_for(ws.recv(), timeout=OPEN_TIMEOUT))
        if challenge.get("type") != "challenge" or not challenge.get("nonce"):
            reason = challenge.get("reason") or challenge
            log.warning("control plane %s refused the link: %s", url, reason)
            return False
        proof = self.identity.proof(str(challenge["nonce"]), self.node_id)
        await ws.send(json.dumps(proof))
        return True

    def _take_key(self, answer: dict, url: str, nonce: str) -> bool:
        """Take the command key (and the epoch) of a "linked" answer whose sender proved
        itself; of any other, nothing: the link is not kept and commands wait for a key."""
        try:
            self.command_key = check_linked_answer(
                answer, nonce, self.node_id, token="" if self.identity else self.token,
                ca_pem=self.identity.ca_pem if self.identity else None,
            )  # fmt: skip
        except LinkedAnswerRefused as exc:
            self.command_key = ""
            log.error('control plane %s answered "linked" but did not prove itself (%s); not '
                      "linked to it, and no command key taken", url, exc)  # fmt: skip
            return False
        self._learn_epoch(answer)
        return True

    async def _linked(self, ws: ClientConnection, url: str, nonce: str) -> None:
        assert self._stop is not None
        sending = asyncio.Lock()
        tasks = [
            asyncio.create_task(self._heartbeats(ws)),
            asyncio.create_task(self._send_outbox(ws, sending)),
            asyncio.create_task(self._register_when_asked(ws, sending)),
            asyncio.create_task(self._read(ws, url, nonce)),
            asyncio.create_task(self._stop.wait()),
        ]
        try:
            done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
        for task in done:
            if not task.cancelled() and task.exception():
                raise task.exception()  # type: ignore[misc]

    async def _heartbeats(self, ws: ClientConnection) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            heartbeat = await asyncio.to_thread(self.callbacks.heartbeat)
            await ws.send(heartbeat.model_dump_json())

    async def _register_when_asked(self, ws: ClientConnection, sending: asyncio.Lock) -> None:
        assert self._register_wanted is not None
        while True:
            await self._register_wanted.wait()
            # Nothing else goes out between building the register and sending it: a
            # statement made after it, sent before it, would be undone by it.
            async with sending:
                self._register_wanted.clear()
                try:
                    register = await asyncio.to_thread(self.callbacks.register)
                except Exception:  # the link stays; the next register says it all
                    log.exception("building a register to send again failed")
                    continue
                await ws.send(register.model_dump_json())

    async def _send_outbox(self, ws: ClientConnection, sending: asyncio.Lock) -> None:
        assert self._outbox_ready is not None
        while True:
            async with sending:
                await self._send_statements(ws)
                while self._outbox:
                    # Taken off only once sent: a message a dropped link did not carry waits.
                    await ws.send(self._outbox[0])
                    self._outbox.popleft()
            self._outbox_ready.clear()
            if not self._outbox and not self._statements:
                await self._outbox_ready.wait()

    async def _send_statements(self, ws: ClientConnection) -> None:
        while True:
            with self._statements_lock:
                if not self._statements:
                    return
                kind = next(iter(self._statements))
                text = self._statements.pop(kind)
            try:
                await ws.send(text)
            except BaseException:
                with self._statements_lock:  # not carried: kept, unless a newer one came
                    if kind not in self._statements:
                        self._statements = {kind: text, **self._statements}
                raise

    async def _read(self, ws: ClientConnection, url: str, nonce: str) -> None:
        async for message in ws:
            answer = _decode(message)
            if answer.get("type") == "error":
                log.error("control plane refused a message: %s", answer.get("reason"))
            elif answer.get("type") == "linked":  # the answer to a later register
                if not self._take_key(answer, url, nonce):
                    return  # ends the session
            elif answer.get("type") == "refused":  # a link closed by the control plane
                log.warning("control plane %s closed the link: %s", url, answer.get("reason"))
            else:
                log.info("control plane says: %s", message)

    def _learn_epoch(self, answer: dict) -> None:
        epoch = answer.get("epoch")
        if self.callbacks.epoch is not None and isinstance(epoch, int) and epoch > 0:
            self.callbacks.epoch(epoch)

    def _log_close(self, url: str, exc: ConnectionClosed, *, linked: bool) -> None:
        frame = exc.rcvd
        if frame is None:
            log.warning("link to %s dropped without a close frame", url)
        elif frame.code == 1000 and linked:
            log.info("control plane %s closed the link", url)
        elif frame.code == CLOSE_BAD_MESSAGE:
            log.error("control plane %s refused a message: %s", url, frame.reason)
        else:
            log.warning("control plane %s refused the link (%s): %s", url, frame.code, frame.reason)
