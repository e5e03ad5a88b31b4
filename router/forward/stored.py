"""``GET`` or ``DELETE /v1/responses/{id}`` (and what lies under it): answered from the
router's own store when it keeps that response (router/conversations/), else relayed to the
replica that made it, the only one that may have kept it (which replica made which
response: balance/response_ids.py)."""

from __future__ import annotations

from typing import Any

from router import errors
from router.balance.response_ids import ResponseIds
from router.conversations.answers import answer_kept
from router.conversations.store import ConversationStore
from router.forward.relay import normalized_error
from router.intake.call import Send
from router.responses import header
from router.table.keeper import TableKeeper
from router.table.routes import Endpoint
from router.wire.connection import UpstreamBroken
from router.wire.upstream import Upstream, UpstreamUnreachable

RESPONSES_PREFIX = "/v1/responses/"


class StoredResponses:
    """Finds the replica that made a response and relays the request there."""

    def __init__(
        self, tables: TableKeeper, response_ids: ResponseIds, upstream: Upstream,
        conversations: ConversationStore | None = None,
    ) -> None:  # fmt: skip
        self.tables = tables
        self.response_ids = response_ids
        self.upstream = upstream
        self.conversations = conversations or ConversationStore()

    async def serve(self, scope: dict[str, Any], send: Send, path: str, request_id: bytes) -> None:
        if scope["method"] not in ("GET", "DELETE", "POST"):
            raise errors.method_not_allowed(scope["method"], "GET, DELETE")
        self.tables.require_loaded()
        caller = self.tables.keys.authenticate(
            header(scope, b"authorization"), header(scope, b"x-api-key")
        )
        response_id, _, under = path.removeprefix(RESPONSES_PREFIX).partition("/")
        # One the router keeps itself (router/conversations/) is answered from its store.
        if await answer_kept(self.conversations, scope["method"], response_id, under, caller,
                             send):  # fmt: skip
            return
        made_by = await self.response_ids.made_by(response_id)
        route = self.tables.table.routes.get(made_by.model) if made_by else None
        # Another key's response, or one of a model the key may not use, is as unknown as
        # one never made.
        if (made_by is None or not made_by.for_caller(caller.owner) or route is None
                or not caller.may_use(route.names)):  # fmt: skip
            raise errors.unknown_response(response_id)
        endpoint = next((e for e in route.endpoints if e.replica == made_by.replica), None)
        if endpoint is None:
            raise errors.response_replica_gone(response_id, route.name, made_by.replica)
        query = scope.get("query_string", b"")
        target = path + ("?" + query.decode("latin-1") if query else "")
        status = await self._pass_through(
            scope["method"], endpoint, target, [(b"x-request-id", request_id)], send
        )
        if scope["method"] == "DELETE" and status < 300:
            await self.response_ids.forget(response_id)

    async def _pass_through(
        self, method: str, endpoint: Endpoint, path: str, headers: list[tuple[bytes, bytes]],
        send: Send,
    ) -> int:  # fmt: skip
        """Relay a request with no body to one replica; return the status the client got."""
        if endpoint.authorization:
            headers = [*headers, (b"authorization", endpoint.authorization)]
        try:
            response = await self.upstream.request(method.encode(), endpoint.url, path, b"",
                                                   headers)  # fmt: skip
        except UpstreamUnreachable as exc:
            raise errors.bad_gateway(
                f"The replica that made this response did not answer: {exc}"
            ) from None
        try:
            data = await response.read()
        except UpstreamBroken as exc:
            raise errors.bad_gateway(f"The replica broke off its answer: {exc}") from None
        finally:
            response.close()
        status, data = normalized_error(response.status, data) if response.status >= 400 else (
            response.status, data
        )  # fmt: skip
        headers = response.headers_for_client()
        headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        return status
