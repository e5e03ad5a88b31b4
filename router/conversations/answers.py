"""``GET`` and ``DELETE /v1/responses/{id}`` of a response the router keeps itself, answered
from its store (chains.py), and only to the key that made it."""

from __future__ import annotations

from router import errors
from router.conversations.store import ConversationStore
from router.errors import RouterError
from router.responses import send_json
from router.table.keys import Caller


async def answer_kept(
    store: ConversationStore, method: str, response_id: str, under: str, caller: Caller, send
) -> bool:
    """Answer for a response the router keeps; False when it keeps none of that id (the
    replica that made it may). ``under`` is the path below the id ("" for the response)."""
    kept = await store.recall(response_id)
    if kept is None:
        return False
    if kept.owner != caller.owner:
        raise errors.unknown_response(response_id)  # another key's is as unknown as none
    if under:
        raise RouterError(
            404,
            f"The router keeps the response {response_id!r} itself and answers GET and "
            f"DELETE of it, not of /{under}.",
            "invalid_request_error",
            "not_found",
        )
    if method == "DELETE":
        await store.forget(response_id)
        await send_json(send, 200, {"id": response_id, "object": "response", "deleted": True})
    elif method == "GET" and kept.response:
        await send_json(send, 200, kept.response)
    elif method == "GET":
        raise RouterError(
            404,
            f"The response {response_id!r} was too long for the router to keep "
            "(LLMGW_ROUTER_CONVERSATION_BYTES); only its id is remembered.",
            "invalid_request_error",
            "response_not_found",
        )
    else:
        raise errors.method_not_allowed(method, "GET, DELETE")
    return True
