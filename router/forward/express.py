"""The express way: a request answered from the sockets' callbacks, without a task.

Most requests need nothing but sockets: a chat or completion of a key whose limits are
caps alone (its places leased here), for a model with a replica ready and a kept-alive
connection to it free. Such a request (intake/reception.py's ``take_now``) is sent from
the callback that read its body, and its answer relayed from the engine connection's
callbacks to the client's transport: no task, no future, no ASGI message, which were
about half the router's CPU an answer (bench/README.md, "The fourth round").

It keeps what the task path does: the journal's line when an engine takes it, the
stream's usage asked for and its usage chunk dropped, whole events only, every event kept
for a move, back-pressure both ways, the engine hung up on when the client leaves, the
answer counted, charged and logged. The moment it would have to wait on anything else, it
hands over to the task path (forward/proxy.py's ``forward``, with a ``Resume``): an engine
that fails before answering (another replica is asked), a stream that breaks (carried on
elsewhere), an answer that breaks before any of it was sent (asked again), a client that
leaves mid-answer (its tokens counted by the engine's tokenizer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from router.errors import RouterError
from router.forward.counting import Served
from router.forward.migration import Relayed
from router.forward.proxy import Proxy, Resume
from router.forward.relay import (
    JSON_TYPE,
    STREAM_HEADERS,
    BrokenStream,
    StreamRelay,
    normalized_error,
)
from router.intake.call import CLIENT_CLOSED, Call
from router.responses import send_error
from router.table.routes import Endpoint
from router.wire.connection import EngineConnection, Response, UpstreamBroken
from router.wire.tokens import EventScanner, Tokens, usage_of_body

if TYPE_CHECKING:
    from router.intake.reception import Arrival, Reception
    from router.wire.cycle import RequestCycle

logger = logging.getLogger(__name__)

# How an engine that failed before answering is named in metrics (upstream.py's kinds).
KIND_BEFORE_ANSWER = {"closed": "disconnected", "silent": "timeout", "invalid": "error"}


def send_express(proxy: Proxy, reception: Reception, call: Call, arrival: Arrival,
                 cycle: RequestCycle, extra: list[tuple[bytes, bytes]]) -> bool:  # fmt: skip
    """Send ``call`` to a replica on a kept-alive connection and answer it from callbacks;
    False, having sent nothing, when no replica has one free (the task path then)."""
    endpoint = proxy.balancer.pick(proxy.loras.hot(call.route), session=call.session)
    if endpoint is None or not proxy.loras.use_now(call.route, endpoint):
        return False
    path, body, _translation = call.request_for(endpoint)  # none on the express paths
    headers = call.headers
    if endpoint.authorization:
        headers = [*headers, (b"authorization", endpoint.authorization)]
    answer = proxy.upstream.send_now(
        endpoint.url, path, body, headers,
        lambda connection: ExpressAnswer(connection, proxy, reception, call, arrival, cycle,
                                         endpoint, extra),  # fmt: skip
    )  # fmt: skip
    if answer is None:
        return False
    answer.served.endpoint, answer.served.path, answer.served.body = endpoint, path, body
    cycle.express = answer
    return True


class ExpressAnswer(Response):
    """An engine's answer relayed as it comes, and the client's side of it."""

    def __init__(self, connection: EngineConnection, proxy: Proxy, reception: Reception,
                 call: Call, arrival: Arrival, cycle: RequestCycle, endpoint: Endpoint,
                 extra: list[tuple[bytes, bytes]]) -> None:  # fmt: skip
        super().__init__(connection)
        self.proxy = proxy
        self.reception = reception
        self.call = call
        self.arrival = arrival
        self.cycle = cycle
        self.endpoint = endpoint
        self.extra = extra  # the request id, CORS: on whatever answer the client gets
        self.trial = proxy.balancer.started(endpoint.replica)
        self.served = Served()
        self.scanner: EventScanner | None = None  # a stream's
        self.relayed: Relayed | None = None
        self.parts: list[bytes] = []  # an answer that does not stream, until it is whole
        self.pending: list[bytes] = []  # a stream's events of this read, to go in one write
        self.first_sent = False
        self.done = False  # seen out, or handed over

    # -- the engine's side (EngineConnection's callbacks) ---------------------------------

    def _headed(self) -> None:
        if self.done:
            return
        try:
            self._begin()
        except Exception:  # noqa: BLE001  # a fault here must not leave the client waiting
            self._failed()

    def _feed(self, data: bytes) -> None:
        scanner = self.scanner
        if scanner is None:
            self.parts.append(data)
            return
        if self.done:
            return
        try:
            self._relay(scanner.feed(data))
        except Exception:  # noqa: BLE001
            self._failed()

    def _fed(self) -> None:
        if self.pending and not self.done:
            try:
                self._write(more=True)
            except Exception:  # noqa: BLE001
                self._failed()

    def _end(self, error: Exception | None = None) -> None:
        super()._end(error)
        if self.done:
            return
        try:
            if error is not None:
                self._broke(error)
            elif self.scanner is not None:
                self._stream_ended(self.scanner)
            else:
                self._whole()
        except Exception:  # noqa: BLE001
            self._failed()

    def _begin(self) -> None:
        """The status and headers: a stream's go out now, with its first events."""
        call, status = self.call, self.status
        if status >= 500 and self._other_replica() is not None:
            return  # read on, then another replica is asked (``_whole``)
        self.proxy.began(call, self.served, status < 400, self.served.body)
        if not self.is_event_stream:
            return
        self.scanner = scanner = EventScanner(drop_usage_only=call.drop_usage_only)
        self.relayed = relayed = Relayed()
        self.served.relayed = relayed
        self.served.engine_usage = lambda: scanner.tokens
        headers = [*self.headers_for_client(), *STREAM_HEADERS, *call.limit_headers,
                   *self.extra]  # fmt: skip
        self.cycle.start_answer(status, headers)

    def _relay(self, events: bytes) -> None:
        """Whole events, kept (for a move) and sent with the rest of this read's."""
        if events:
            assert self.relayed is not None
            self.relayed.keep(events)
            self.pending.append(events)

    def _write(self, *, more: bool) -> None:
        pending = self.pending
        self.cycle.send_body(pending[0] if len(pending) == 1 else b"".join(pending), more)
        pending.clear()
        if not self.first_sent:
            self.first_sent = True
            self.proxy.metrics.first_byte(self.call.model, time.perf_counter() - self.call.started)

    def _stream_ended(self, scanner: EventScanner) -> None:
        self._relay(scanner.flush())
        self.call.exchange.finishing = True
        self._write(more=False)
        self._seen_out(self.status, True, scanner.tokens)

    def _whole(self) -> None:
        """An answer that does not stream, whole: to the client, or (a 5xx with another
        replica ready) the task path's to ask another."""
        call, status = self.call, self.status
        data = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        if status >= 500:
            following = self._other_replica()
            if following is not None:
                self._failed_before(f"http_{status}", f"{call.model} answered HTTP {status}",
                                    following)  # fmt: skip
                return
        tokens = usage_of_body(data) if status < 400 else None
        headers = self.headers_for_client()
        if status >= 400:
            status, edited = normalized_error(status, data, call.path)
            if edited is not data:
                data = edited
                headers = [(n, v) for n, v in headers if n != b"content-type"] + JSON_TYPE
        headers += call.limit_headers
        headers += self.extra
        headers.append((b"content-length", b"%d" % len(data)))
        call.exchange.finishing = True
        cycle = self.cycle
        cycle.start_answer(status, headers)
        cycle.send_body(data, False)
        self.proxy.metrics.first_byte(call.model, time.perf_counter() - call.started)
        self._seen_out(status, status < 500, tokens or Tokens())

    def _seen_out(self, status: int, ok: bool, tokens: Tokens | None) -> None:
        """The answer is out: the connection back to its pool, the request charged and
        logged (its tokens counted in a task when the engine did not say them)."""
        self._finished(ok)
        self.arrival.status = status
        if tokens is None:
            self._hand_over(self._counted())
            return
        self.proxy.account_now(self.call, self.served, tokens)
        self.reception.see_out_now(self.arrival)

    def _finished(self, ok: bool | None) -> None:
        """Done with the engine (hung up on unless its answer was read whole) and with the
        client's callbacks (a cycle the collector would otherwise have to find)."""
        self.done = True
        self.close()
        self.proxy.balancer.finished(self.endpoint.replica, ok=ok, trial=self.trial)
        self.cycle.express = None

    async def _counted(self) -> int:
        await self.proxy.account(self.call, self.served, None)
        return self.arrival.status

    # -- failures: handed over to the task path ---------------------------------------

    def _broke(self, error: Exception) -> None:
        """The engine failed: before its answer began (another replica, or the same on a
        new connection), or mid-answer (a stream carried on, an answer asked again)."""
        call, replica = self.call, self.endpoint.replica
        broken = error if isinstance(error, UpstreamBroken) else UpstreamBroken(str(error))
        if not self.status:
            if broken.kind == "closed":
                # It closed the kept-alive connection as the request went out (llama-server
                # does after a stream): not the replica's fault, and the task path sends
                # it again on a new connection.
                self._hand_over_from(ok=None, resume=Resume([], self.endpoint))
                return
            kind = KIND_BEFORE_ANSWER.get(broken.kind, "error")
            self._failed_before(kind, f"{self.endpoint.url}: {broken}",
                                self._other_replica())  # fmt: skip
            return
        if self.scanner is None:  # nothing reached the client: asked again from the start
            try:
                following = self.proxy.ask_again(call, broken, [self.endpoint], 0)
            except RouterError as exc:
                self._hand_over_from(ok=False, refusal=exc)
                return
            self._hand_over_from(ok=False, resume=Resume([self.endpoint], following, str(broken)))
            return
        if self.pending:  # kept as the client's: sent before the stream is carried on
            self._write(more=True)
        self.proxy.metrics.upstream_error(call.model, replica, "broken_stream")
        assert self.relayed is not None
        stream = StreamRelay(call, self.proxy.metrics, self.relayed)
        moved = BrokenStream(stream, broken, self.scanner.tokens)
        self._hand_over_from(ok=False, resume=Resume([self.endpoint], None, str(broken), moved))

    def _failed_before(self, kind: str, problem: str, following: Endpoint | None) -> None:
        """No answer from this replica reached the client: the task path asks the next."""
        self.proxy.metrics.upstream_error(self.call.model, self.endpoint.replica, kind)
        self._hand_over_from(ok=False, resume=Resume([self.endpoint], following, problem))

    def _other_replica(self) -> Endpoint | None:
        return self.proxy.next_replica(self.call, [self.endpoint], "http")

    def _hand_over_from(self, *, ok: bool | None, resume: Resume | None = None,
                        refusal: RouterError | None = None) -> None:  # fmt: skip
        self._finished(ok)
        if refusal is not None:
            self._hand_over(self._refused(refusal))
        else:
            self._hand_over(self.proxy.forward(self.call, self.served, resume))

    async def _refused(self, refusal: RouterError) -> int:
        raise refusal

    def _hand_over(self, work: Awaitable[int]) -> None:
        self.cycle.hand_over(self._answered(work))

    async def _answered(self, work: Awaitable[int]) -> None:
        """The task path's end of ``Router.inference``: the status, or the refusal, then
        the request seen out."""
        arrival = self.arrival
        try:
            arrival.status = await work
        except RouterError as exc:
            await send_error(self.call.send, arrival.refused(exc), arrival.path)
        finally:
            await self.reception.see_out(arrival)

    def _failed(self) -> None:
        """A fault of the router's own: logged, the engine hung up on, the client told."""
        logger.exception("The express answer to %s failed", self.call.path)
        if self.done:
            return
        self._finished(None)
        cycle = self.cycle
        if not cycle.started:
            cycle.connection.refuse(500, "Internal Server Error")
        else:
            cycle.connection.transport.close()
        self.arrival.status = 500
        scanner = self.scanner
        self.proxy.account_now(self.call, self.served, (scanner and scanner.tokens) or Tokens())
        self.reception.see_out_now(self.arrival)

    # -- the client's side (the server's Express) -----------------------------------------

    def client_left(self) -> None:
        if self.done:
            return
        self._finished(None)  # an answer not read whole: the engine is hung up on, and stops
        self.arrival.status = CLIENT_CLOSED
        if self.served.began:  # what reached the client, counted by the engine's tokenizer
            self._hand_over(self._counted())
        else:
            self.reception.see_out_now(self.arrival)

    def client_paused(self) -> None:
        self._connection.pause()

    def client_resumed(self) -> None:
        self._connection.resume()
