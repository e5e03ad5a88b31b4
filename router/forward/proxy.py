"""Sending a call to a replica: retries on another, moves when an answer breaks, tokens counted.

A replica that cannot be reached, or answers 5xx before anything reached the client,
is counted against its breaker and the call goes to another (``MAX_ATTEMPTS`` in all).
An engine that breaks off an answer once it began no longer ends it, within
``LLMGW_ROUTER_MIGRATIONS`` moves: a stream is carried on by another replica from what
the client already has (migration.py), and an answer that does not stream, of which
nothing reached the client, is asked again from the start. A stream that cannot move
(a tool call in flight, n > 1, no other replica) ends with the error event. A client
that hangs up cancels the relay, and leaving the relay closes the engine's connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from router import errors
from router.balance.balancer import Balancer
from router.balance.response_ids import ResponseIds
from router.forward.counting import COUNT_SECONDS, Served, TokenCounter, estimate_prompt
from router.forward.loras import LoraLoads
from router.forward.migration import (
    Progress,
    Splice,
    budget_spent,
    closing_events,
    continuation_body,
    engine_continues,
    why_not_movable,
)
from router.forward.relay import (
    RESPONSES_PATH,
    WATCH_AFTER_SECONDS,
    BrokenStream,
    StreamRelay,
    answer_editor,
    noting_response_id,
    relay_body,
    start_watching,
    translated,
)
from router.intake.call import CLIENT_CLOSED, Call, ClientLeft, Upload
from router.metrics import RouterMetrics
from router.table.routes import Endpoint, ModelRoute
from router.translate.plan import Translation, stream_error_event_for
from router.usage.accounting import Accounting
from router.wire.connection import Response, Rest, UpstreamBroken
from router.wire.tokens import EventScanner, Tokens
from router.wire.upstream import Upstream, UpstreamUnreachable

logger = logging.getLogger(__name__)

# One try and at most two retries, each on another replica.
MAX_ATTEMPTS = 3
# The streams a broken answer can be carried on in (migration.py reads their events).
MOVABLE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


class Resume(NamedTuple):
    """Where a call begun in callbacks (express.py) is taken on by ``forward``: the replicas
    that failed it, the next to ask (None: none), the last problem, a stream that broke."""

    tried: list[Endpoint]
    endpoint: Endpoint | None
    problem: str = ""
    broken: BrokenStream | None = None


class Proxy:
    """Forwards calls through the process's balancer and upstream pool."""

    def __init__(
        self, balancer: Balancer, upstream: Upstream, metrics: RouterMetrics,
        accounting: Accounting | None, migrations: int = 2,
        current_route: Callable[[str], ModelRoute | None] | None = None,
        response_ids: ResponseIds | None = None,
    ) -> None:  # fmt: skip
        """``current_route`` gives a model's route in the table as it is now: a move goes
        to the replicas ready when the answer broke, not those of when it began."""
        self.balancer = balancer
        self.migrations = migrations  # LLMGW_ROUTER_MIGRATIONS: moves per request
        self.current_route = current_route
        self.upstream = upstream
        self.metrics = metrics
        self.accounting = accounting  # None: tokens go to /metrics only (router-only mode)
        self.response_ids = response_ids or ResponseIds()
        self.counter = TokenCounter(self._post)
        self.loras = LoraLoads(upstream)

    async def forward(
        self, call: Call, served: Served | None = None, resume: Resume | None = None
    ) -> int:
        """Relay with retries; return the status the client got (499 if it left first)."""
        task = asyncio.current_task()
        assert task is not None
        # Most answers take milliseconds; a watcher task for each would cost more than the
        # rest of the router's work. Watch only requests still running after a moment, and
        # never an upload, whose rest the relay itself reads from the client.
        timer = asyncio.get_running_loop().call_later(
            WATCH_AFTER_SECONDS if call.upload is None else 1e9, start_watching, call, task
        )
        exchange = call.exchange
        served = served or Served()
        try:
            return await self._attempts(call, served, resume)
        except ClientLeft:
            return CLIENT_CLOSED
        except asyncio.CancelledError:
            if not exchange.client_gone:
                raise
            # Our own cancellation, delivered at the await where the relay was waiting;
            # leaving _attempts closed the engine's connection, which stops generation.
            task.uncancel()
            return CLIENT_CLOSED
        except OSError:
            # The ASGI server refused a send: the client is gone (engine errors are
            # caught where they happen and never reach here as OSError).
            return CLIENT_CLOSED
        finally:
            timer.cancel()
            if exchange.watcher is not None:
                exchange.watcher.cancel()
            if served.began and not served.accounted:
                # Ended before its answer was counted (the client gone, a failure): charged
                # the prompt and every token that reached the client all the same.
                await self.account(call, served, None)

    async def _attempts(self, call: Call, served: Served, resume: Resume | None) -> int:
        model = call.model
        if resume is None:
            endpoint = self.balancer.pick(self.loras.hot(call.route), session=call.session)
            resume = Resume([], endpoint)
        tried, endpoint, last_problem, broken = resume
        failures, moves = len(tried), 0
        while endpoint is not None and failures < MAX_ATTEMPTS:
            replica = endpoint.replica
            trial = self.balancer.started(replica)
            ok: bool | None = None
            path, body, translation = call.request_for(endpoint)
            served.endpoint, served.path, served.body = endpoint, path, body
            try:
                try:
                    await self.loras.ensure(call.route, endpoint)
                    response = await self._post(endpoint, path, body, call.headers, call.upload)
                except UpstreamUnreachable as exc:
                    ok = False
                    self.metrics.upstream_error(model, replica, exc.kind)
                    last_problem = str(exc)
                    tried.append(endpoint)
                    failures += 1
                    call.not_again(exc, "failed on")
                    endpoint = self.next_replica(call, tried, exc.kind)
                    continue
                try:
                    if response.status >= 500:
                        ok = False
                        self.metrics.upstream_error(model, replica, f"http_{response.status}")
                        tried.append(endpoint)
                        failures += 1
                        following = None
                        if failures < MAX_ATTEMPTS and not call.upload_sent:
                            following = self.next_replica(call, tried, "http")
                        if following is not None:
                            endpoint = following
                            continue
                    self.began(call, served, response.status < 400, body)
                    if response.is_event_stream:
                        broken = await self._relay_stream(
                            call, response, replica, translation, served
                        )
                        ok = broken is None and response.status < 500
                        if broken is None:
                            return response.status
                        tried.append(endpoint)
                        break
                    try:
                        tokens = await relay_body(
                            call, response, self.metrics,
                            answer_editor(call, translation, replica, self.response_ids),
                        )  # fmt: skip
                    except UpstreamBroken as exc:
                        ok = False
                        tried.append(endpoint)
                        call.not_again(exc, "broke off its answer to")
                        endpoint = self.ask_again(call, exc, tried, moves)
                        moves += 1
                        continue
                    ok = response.status < 500
                    await self.account(call, served, tokens or Tokens())
                    return response.status
                finally:
                    response.close()  # returns nothing half-read to the pool
            finally:
                self.balancer.finished(replica, ok=ok, trial=trial)
        if broken is not None:
            return await self._carry_on(call, broken, tried, served)
        outage = self.balancer.outage(self._endpoints_now(call))
        if outage is not None:  # not one failure but the model's state: say so, and since when
            raise errors.unavailable(
                f"{outage.sentence(model)} The last failure: {last_problem}.", outage.retry_after
            )
        raise errors.bad_gateway(
            f"No replica of {model} answered ({len(tried)} tried): {last_problem}."
        )

    def began(self, call: Call, served: Served, began: bool, body: bytes) -> None:
        """An engine took the request: from here on it is charged however it ends, and a
        router killed before it is counted leaves its prompt charged (usage/journal.py)."""
        served.began = began
        if began and served.journalled is None and self.accounting is not None:
            caller = call.caller
            served.journalled = self.accounting.begin(
                caller.prefix, caller.name, call.model, estimate_prompt(body)
            )

    async def _post(
        self, endpoint: Endpoint, path: str, body: bytes, headers: list[tuple[bytes, bytes]],
        upload: Upload | None = None,
    ) -> Response:  # fmt: skip
        if endpoint.authorization:
            headers = [*headers, (b"authorization", endpoint.authorization)]
        rest = Rest(upload.rest(), upload.length) if upload is not None else None
        return await self.upstream.post(endpoint.url, path, body, headers, rest)

    def ask_again(
        self, call: Call, broken: UpstreamBroken, tried: list[Endpoint], moves: int
    ) -> Endpoint:
        """The replica to ask again for an answer that broke off before any of it reached
        the client; 502 when the bound is reached or no other replica is ready."""
        model = call.model
        self.metrics.upstream_error(model, tried[-1].replica, "broken_answer")
        following = None
        if moves < self.migrations:
            following = self.balancer.pick(
                self._endpoints_now(call), session=call.session, exclude=tried
            )
        if following is None:
            raise errors.bad_gateway(f"An engine of {model} broke off its answer: {broken}.")
        self._moved(model, broken, tried[-1].replica, following.replica, "from the start")
        return following

    # -- streams, and carrying a broken one on ---------------------------------------------

    async def _relay_stream(
        self, call: Call, response: Response, replica: str, translation: Translation | None,
        served: Served,
    ) -> BrokenStream | None:  # fmt: skip
        """Relay a stream from its first engine; None once it ended whole and is counted."""
        stream = StreamRelay(call, self.metrics)
        await stream.begin(response)
        scanner = EventScanner(drop_usage_only=call.drop_usage_only and translation is None)
        served.relayed = stream.relayed
        served.engine_usage = lambda: scanner.tokens
        edit: Callable[[bytes], bytes] = scanner.feed
        flush: Callable[[], bytes] = scanner.flush
        error_event = stream_error_event_for(call.path)
        if translation is not None:
            events = translation.events()
            edit, flush = translated(scanner, events)

            def error_event(message: str) -> bytes:
                # Through the stream's own translator: the error event then follows the
                # events already sent (numbered after them, holding the partial answer).
                return events.feed(errors.stream_error_event(message)) + events.flush()

        if call.chain is not None:  # its conversation kept with the response it ends with
            edit, flush = call.chain.watching(edit, flush)
        elif call.path == RESPONSES_PATH and translation is None:  # the engine's to keep
            edit = noting_response_id(scanner.feed, self.response_ids, replica, call.model,
                                      call.caller.owner)  # fmt: skip
        broken = await stream.pipe(response, edit, flush)
        if broken is None:
            await stream.end()
            await self.account(call, served, scanner.tokens)
            return None
        self.metrics.upstream_error(call.model, replica, "broken_stream")
        if translation is not None or call.path not in MOVABLE_PATHS:
            # Carried on only where the client's stream is chat completions' own.
            await stream.end_broken(
                broken, "a stream in another API's events is not moved", error_event
            )
            await self.account(call, served, scanner.tokens)
            return None
        return BrokenStream(stream, broken, scanner.tokens)

    async def _carry_on(
        self, call: Call, first: BrokenStream, tried: list[Endpoint], served: Served
    ) -> int:
        """Carry a broken stream on, replica after replica, until it ends whole or cannot
        move; return the status the client got (the stream's, which began as 200)."""
        model = call.model
        stream, broken, usage = first
        payload = json.loads(call.body)
        moves = 0
        while True:
            progress = stream.relayed.read()
            # Tokens, not events: what is left of max_tokens is the engine's to count.
            sent = await self._tokens_of(tried[-1], model, progress)
            if progress.finish_reason or budget_spent(payload, progress, sent):
                # Nothing was left to generate: end the answer here.
                await stream.end(closing_events(call.path, progress))
                await self.account(call, served, usage)
                return 200
            target, why_not = self._continuer(call, payload, progress, tried, moves)
            if target is None:
                await stream.end_broken(broken, why_not)
                await self.account(call, served, usage)
                return 200
            moves += 1
            self._moved(model, broken, tried[-1].replica, target.replica,
                        f"after {sent} tokens")  # fmt: skip
            splice = Splice(progress, drop_usage_only=call.drop_usage_only, sent=sent)
            body = continuation_body(call.path, payload, progress, sent)
            body = call.for_replica(body, target)  # its own adapter ids
            served.endpoint, served.path = target, call.path
            served.engine_usage = splice.engine_usage
            outcome = await self._continue_on(call, target, body, stream, splice)
            tried.append(target)
            usage = splice.tokens
            if outcome is None:
                await stream.end()
                await self.account(call, served, usage)
                return 200
            broken = outcome

    async def _tokens_of(self, endpoint: Endpoint, model: str, progress: Progress) -> int:
        """The tokens of the text a client received, by the engine's tokenizer; its text
        events where the engine cannot say in time."""
        if not progress.text:
            return 0
        try:
            async with asyncio.timeout(COUNT_SECONDS):
                counted = await self.counter.text(endpoint, model, progress.text)
        except Exception as exc:  # noqa: BLE001  # any failure: count events instead
            logger.info("tokens sent of %s counted as events: %s", model, exc or "timeout")
            counted = None
        return counted if counted is not None else progress.chunks

    def _continuer(
        self, call: Call, payload: dict[str, Any], progress: Progress, tried: list[Endpoint],
        moves: int,
    ) -> tuple[Endpoint | None, str]:  # fmt: skip
        """The replica to carry the stream on, or None and why there is none."""
        if moves >= self.migrations:
            return None, (
                f"moved {moves} times already (LLMGW_ROUTER_MIGRATIONS={self.migrations})"
                if moves else "LLMGW_ROUTER_MIGRATIONS is 0"
            )  # fmt: skip
        why_not = why_not_movable(call.path, payload, progress)
        if why_not is not None:
            return None, why_not
        others = [e for e in self._endpoints_now(call) if e not in tried]
        able = [e for e in others if engine_continues(e.engine)]
        target = self.balancer.pick(able, session=call.session)
        if target is not None:
            return target, ""
        if others:
            return (
                None,
                f"its other replicas' engine ({others[0].engine}) cannot continue an answer",
            )
        return None, f"no other replica of {call.model} is ready"

    def _endpoints_now(self, call: Call) -> tuple[Endpoint, ...]:
        """The model's endpoints in the table now: one that became ready since the request
        began may take it on, when the replicas it began with have failed it."""
        route = self.current_route(call.model) if self.current_route else None
        return (route or call.route).endpoints

    async def _continue_on(
        self, call: Call, target: Endpoint, body: bytes, stream: StreamRelay, splice: Splice
    ) -> UpstreamBroken | None:
        """Relay ``target``'s continuation onto the stream; None once the answer is whole,
        else how this replica failed it (the next move's reason)."""
        model, replica = call.model, target.replica
        trial = self.balancer.started(replica)
        ok: bool | None = None
        try:
            try:
                await self.loras.ensure(call.route, target)
                response = await self._post(target, call.path, body, call.headers)
            except UpstreamUnreachable as exc:
                ok = False
                self.metrics.upstream_error(model, replica, exc.kind)
                return UpstreamBroken(str(exc), "unreachable")
            try:
                if response.status != 200 or not response.is_event_stream:
                    ok = False if response.status >= 500 else None
                    self.metrics.upstream_error(model, replica, f"http_{response.status}")
                    return UpstreamBroken(
                        f"{target.url} answered the continuation with HTTP {response.status}",
                        "refused",
                    )
                broken = await stream.pipe(response, splice.feed, splice.flush)
                ok = broken is None
                if broken is not None:
                    self.metrics.upstream_error(model, replica, "broken_stream")
                return broken
            finally:
                response.close()
        finally:
            self.balancer.finished(replica, ok=ok, trial=trial)

    def _moved(self, model: str, broken: UpstreamBroken, source: str, target: str,
               how: str) -> None:  # fmt: skip
        self.metrics.migrated(model, broken.kind)
        logger.warning("moved a request for %s from replica %s to replica %s %s: %s",
                       model, source, target, how, broken)  # fmt: skip

    def next_replica(self, call: Call, tried: list[Endpoint], kind: str) -> Endpoint | None:
        endpoint = self.balancer.pick(
            self._endpoints_now(call), session=call.session, exclude=tried
        )
        if endpoint is None and kind == "disconnected" and tried.count(tried[-1]) == 1:
            # The engine closed a kept-alive connection as the request went out: the
            # request never reached it, so the same replica may take it once more.
            return tried[-1]
        return endpoint

    async def account(self, call: Call, served: Served, tokens: Tokens | None) -> None:
        """Charge and record what the request was served, once: ``tokens`` as the engine
        counted them, or (None) counted here from what reached the client."""
        if served.accounted:
            return
        served.accounted = True
        if tokens is None:
            tokens = await self.counter.served(served, call.model)
        self._record(call, served, tokens)

    def account_now(self, call: Call, served: Served, tokens: Tokens) -> None:
        """``account`` with the engine's count (no wait)."""
        if not served.accounted:
            served.accounted = True
            self._record(call, served, tokens)

    def _record(self, call: Call, served: Served, tokens: Tokens) -> None:
        prompt, completion = tokens.prompt, tokens.completion
        call.tokens_spent = prompt + completion
        self.metrics.tokens(call.model, prompt, completion)
        if self.accounting is not None:
            caller = call.caller
            self.accounting.record(caller.prefix, caller.name, call.model, prompt, completion,
                                   served.journalled, cached_prompt=tokens.cached)  # fmt: skip
