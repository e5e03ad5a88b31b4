"""One request's translation: when it applies, what the engine is asked, what the client gets.

The router decides per replica, since replicas of one model may run engines of several
versions: a Messages or Responses request goes to a replica as it came when its engine
serves that API itself (``Endpoint.native``), else as chat completions, translated
here both ways. ``LLMGW_ROUTER_TRANSLATE=always`` translates for every replica.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocol.serving import TRANSLATED_PATHS, TranslatedApi
from router import errors
from router.table.routes import Endpoint
from router.translate import messages, responses
from router.wire.compact_json import compact_json

CHAT_PATH = "/v1/chat/completions"
# Counting a Messages request's tokens where the engine has no count_tokens of its own:
# the chat form of the request, tokenized by the engine (vLLM's /tokenize takes messages).
TOKENIZE_PATH = "/tokenize"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"


class EventTranslator(Protocol):
    def feed(self, data: bytes) -> bytes: ...
    def flush(self) -> bytes: ...


@dataclass
class Translation:
    """A Messages or Responses request that may have to be served on chat completions."""

    api: TranslatedApi
    path: str  # the client's
    payload: dict[str, Any]  # the client's body, parsed
    model: str  # the catalog's name, which the engine serves
    always: bool  # LLMGW_ROUTER_TRANSLATE=always
    _engine_request: tuple[str, bytes] | None = field(default=None, repr=False)

    @classmethod
    def of(
        cls, path: str, payload: dict[str, Any], model: str, *, always: bool
    ) -> Translation | None:
        api = TRANSLATED_PATHS.get(path)
        return cls(api, path, payload, model, always) if api is not None else None

    def applies_to(self, endpoint: Endpoint) -> bool:
        if self.counts_tokens:
            # Counting is not an answer to translate: an engine that counts does it best.
            return self.api not in endpoint.native
        return self.always or self.api not in endpoint.native

    @property
    def module(self):
        return messages if self.api == "messages" else responses

    @property
    def counts_tokens(self) -> bool:
        return self.path == COUNT_TOKENS_PATH

    def check(self) -> None:
        """Raise the 400 a client gets for a body that cannot be translated, before any
        replica is picked (whether it will be translated is known only then)."""
        self.engine_request()

    def engine_request(self) -> tuple[str, bytes]:
        """The path and body the engine is sent instead of the client's."""
        if self._engine_request is None:
            payload = self.payload
            if self.counts_tokens:  # a count names no max_tokens, which a message needs
                payload = {"max_tokens": 1, **payload}
            chat = self.module.to_chat(payload)
            chat["model"] = self.model
            if self.counts_tokens:
                body = {"model": chat["model"], "messages": chat["messages"]}
                self._engine_request = (TOKENIZE_PATH, compact_json(body))
            else:
                if chat.get("stream"):
                    chat["stream_options"] = {"include_usage": True}
                self._engine_request = (CHAT_PATH, compact_json(chat))
        return self._engine_request

    def answer(self, status: int, data: bytes) -> bytes:
        """The client's answer made of the engine's whole (not streamed) one."""
        if status >= 400:
            return self.module.error_body(status, data)
        try:
            engine_answer = json.loads(data)
        except ValueError:
            return self.module.error_body(502, data)
        if self.counts_tokens:
            count = engine_answer.get("count")
            if not isinstance(count, int):
                count = len(engine_answer.get("tokens") or [])
            return compact_json({"input_tokens": count})
        if self.api == "messages":
            return compact_json(messages.from_chat(engine_answer, self.model))
        return compact_json(responses.from_chat(engine_answer, self.model, self.payload))

    def events(self) -> EventTranslator:
        """A translator for the engine's chat completion events, for one stream."""
        if self.api == "messages":
            return messages.stream_translator(self.model)
        return responses.stream_translator(self.model, self.payload)


def stream_error_event_for(path: str) -> Callable[[str], bytes]:
    """How a stream of ``path``'s API that broke off ends: with that API's error event,
    whether the engine spoke it or the router translated."""
    api = TRANSLATED_PATHS.get(path)
    if api == "messages":
        return messages.stream_error_event
    if api == "responses":
        return responses.stream_error_event
    return errors.stream_error_event
