"""Sending a call to a replica: retries on another, breakers kept, tokens counted.

A replica that cannot be reached, or answers 5xx before anything reached the client,
is counted against its breaker and the call goes to another (``MAX_ATTEMPTS`` in all);
once an answer began, it is the client's, whatever follows. A client that hangs up
cancels the relay, and leaving the relay closes the engine's connection.
"""

from __future__ import annotations

import asyncio

from router import errors
from router.accounting import Accounting
from router.balancer import Balancer
from router.call import CLIENT_CLOSED, Call
from router.errors import RouterError
from router.metrics import RouterMetrics
from router.relay import WATCH_AFTER_SECONDS, relay, start_watching
from router.table import Endpoint
from router.upstream import Upstream, UpstreamUnreachable
from router.usage import Tokens

# One try and at most two retries, each on another replica.
MAX_ATTEMPTS = 3


class Proxy:
    """Forwards calls through the process's balancer and upstream pool."""

    def __init__(
        self, balancer: Balancer, upstream: Upstream, metrics: RouterMetrics,
        accounting: Accounting | None,
    ) -> None:  # fmt: skip
        self.balancer = balancer
        self.upstream = upstream
        self.metrics = metrics
        self.accounting = accounting  # None: tokens go to /metrics only (router-only mode)

    async def forward(self, call: Call) -> int:
        """Relay with retries; return the status the client got (499 if it left first)."""
        task = asyncio.current_task()
        assert task is not None
        # Most answers take milliseconds; a watcher task for each would cost more than the
        # rest of the router's work. Watch only requests still running after a moment.
        timer = asyncio.get_running_loop().call_later(
            WATCH_AFTER_SECONDS, start_watching, call, task
        )
        exchange = call.exchange
        try:
            return await self._attempts(call)
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

    async def _attempts(self, call: Call) -> int:
        model = call.model
        tried: list[Endpoint] = []
        endpoint = self.balancer.pick(call.route.endpoints, session=call.session)
        last_problem = ""
        for attempt in range(MAX_ATTEMPTS):
            if endpoint is None:
                break
            replica = endpoint.replica
            headers = call.headers
            if endpoint.authorization:
                headers = [*headers, (b"authorization", endpoint.authorization)]
            trial = self.balancer.started(replica)
            ok: bool | None = None
            try:
                try:
                    response = await self.upstream.post(endpoint.url, call.path, call.body, headers)
                except UpstreamUnreachable as exc:
                    ok = False
                    self.metrics.upstream_error(model, replica, exc.kind)
                    last_problem = str(exc)
                    tried.append(endpoint)
                    endpoint = self._next(call, tried, exc.kind)
                    continue
                try:
                    if response.status >= 500:
                        ok = False
                        self.metrics.upstream_error(model, replica, f"http_{response.status}")
                        tried.append(endpoint)
                        following = None
                        if attempt + 1 < MAX_ATTEMPTS:
                            following = self._next(call, tried, "http")
                        if following is not None:
                            endpoint = following
                            continue
                    try:
                        ok, tokens = await relay(call, response, replica, self.metrics)
                    except RouterError:
                        ok = False
                        raise
                    if response.status >= 500:
                        ok = False
                    self._account(call, tokens)
                    return response.status
                finally:
                    response.close()  # returns nothing half-read to the pool
            finally:
                self.balancer.finished(replica, ok=ok, trial=trial)
        raise errors.bad_gateway(
            f"No replica of {model} answered ({len(tried)} tried): {last_problem}."
        )

    def _next(self, call: Call, tried: list[Endpoint], kind: str) -> Endpoint | None:
        endpoint = self.balancer.pick(call.route.endpoints, session=call.session, exclude=tried)
        if endpoint is None and kind == "disconnected" and tried.count(tried[-1]) == 1:
            # The engine closed a kept-alive connection as the request went out: the
            # request never reached it, so the same replica may take it once more.
            return tried[-1]
        return endpoint

    def _account(self, call: Call, tokens: Tokens | None) -> None:
        prompt = tokens.prompt if tokens else 0
        completion = tokens.completion if tokens else 0
        call.tokens_spent = prompt + completion
        self.metrics.tokens(call.model, prompt, completion)
        if self.accounting is not None:
            caller = call.caller
            self.accounting.record(caller.prefix, caller.name, call.model, prompt, completion)
