"""A Responses request in a conversation the router keeps: ``previous_response_id`` put
into the input itself on the way in, and the answer kept with it on the way out.

No engine llmgw runs keeps responses for a later request: llama-server refuses
``previous_response_id`` (it keeps nothing), SGLang has no Responses API (the router
translates, keeping nothing either), and vLLM keeps them only in one process's memory
and only with ``VLLM_ENABLE_RESPONSES_API_STORE=1``. So the router keeps every answer to
a request that does not say ``store: false``: the conversation so far (its input items,
this request's, and the answer's output items) under the answer's id, for the key that
asked. A request naming such an id is sent to any replica with that conversation as its
input and no ``previous_response_id``; as OpenAI does, the earlier ``instructions`` are
not carried over. An id this router does not keep is left to the engine-kept path
(balance/response_ids.py), for an engine that keeps its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router import errors
from router.conversations.store import ConversationStore, Kept
from router.table.keys import Caller

# The answers worth continuing: a finished response, or one cut at its token limit.
KEPT_STATUSES = ("completed", "incomplete")
STREAM_ENDS = (b"response.completed", b"response.incomplete")


@dataclass
class Chain:
    """One request's place in a kept conversation, and where its answer is kept."""

    store: ConversationStore
    owner: str
    model: str
    items: list[Any]  # everything the engine is asked: the conversation so far and this input

    def kept_with(self, response: Any) -> Kept | None:
        """The conversation with ``response`` (as the client got it) added, or None for
        an answer that is no response to continue."""
        if not isinstance(response, dict) or response.get("status") not in KEPT_STATUSES:
            return None
        response_id = response.get("id")
        if not isinstance(response_id, str) or not response_id:
            return None
        # Reasoning is done anew each turn (and llama-server refuses it as input).
        output = [
            item
            for item in response.get("output") or []
            if isinstance(item, dict) and item.get("type") != "reasoning"
        ]
        return Kept(response_id, self.owner, self.model, [*self.items, *output], response)

    def keep_answer(self, data: bytes) -> None:
        """Keep the conversation with a whole (not streamed) answer."""
        try:
            kept = self.kept_with(json.loads(data))
        except ValueError:
            return
        if kept is not None:
            self.store.keep(kept)

    def watching(
        self, edit: Callable[[bytes], bytes], flush: Callable[[], bytes]
    ) -> tuple[Callable[[bytes], bytes], Callable[[], bytes]]:
        """``edit`` and ``flush`` of a stream, keeping the conversation with the response
        its last event holds, before that event goes out to the client."""
        watcher = _StreamEnd(self)
        return (lambda data: watcher.see(edit(data))), (lambda: watcher.see(flush()))


class _StreamEnd:
    """Reads a Responses stream's events as the client gets them, for the one that ends it."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.pending = b""  # an event not yet whole
        self.done = False

    def see(self, data: bytes) -> bytes:
        if self.done or not data:
            return data
        whole, _, self.pending = (self.pending + data).rpartition(b"\n\n")
        if len(self.pending) > self.chain.store.max_bytes:
            self.done = True  # no event is this long: not a stream to keep
        if any(end in whole for end in STREAM_ENDS):
            for event in whole.split(b"\n\n"):
                self._last(event)
        return data

    def _last(self, event: bytes) -> None:
        lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
        try:
            parsed = json.loads(b"\n".join(line[5:].lstrip() for line in lines))
        except ValueError:
            return
        if not isinstance(parsed, dict) or parsed.get("type") not in (
            "response.completed", "response.incomplete",
        ):  # fmt: skip
            return
        kept = self.chain.kept_with(parsed.get("response"))
        if kept is not None:
            self.chain.store.keep(kept)
            self.done = True


@dataclass(frozen=True)
class Continued:
    """A Responses request as the engine is asked it, and where its answer is kept."""

    payload: dict[str, Any]
    chain: Chain | None  # None: the router keeps nothing of it
    expanded: bool  # the conversation so far was put into its input: the body changed


async def continued(
    store: ConversationStore, payload: dict[str, Any], caller: Caller, model: str
) -> Continued:
    """``payload`` with the conversation its ``previous_response_id`` names (when this
    router keeps it) put before its input; 404 for another key's, 400 for one too long."""
    owner = caller.owner
    wanted = payload.get("previous_response_id")
    history: list[Any] | None = [] if wanted is None else None
    if isinstance(wanted, str) and wanted:
        kept = await store.recall(wanted)
        if kept is not None and kept.owner != owner:
            raise errors.unknown_response(wanted)  # another key's is as unknown as none
        if kept is not None and kept.too_long:
            raise errors.conversation_too_long(wanted, store.max_bytes)
        if kept is not None:
            history = kept.items
            payload = {name: v for name, v in payload.items() if name != "previous_response_id"}
            payload["input"] = [*history, *_input_items(payload.get("input"))]
    if history is None or payload.get("store") is False:
        # Continued where the router keeps nothing (the engine may), or not to be kept.
        return Continued(payload, None, expanded=False)
    items = payload["input"] if wanted else _input_items(payload.get("input"))
    return Continued(payload, Chain(store, owner, model, list(items)), expanded=bool(wanted))


def _input_items(given: Any) -> list[Any]:
    """A request's ``input`` as items: text is one user message."""
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    return list(given) if isinstance(given, list) else []
