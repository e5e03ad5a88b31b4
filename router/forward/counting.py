"""Counting the tokens of an answer the engine did not count for us, and what it served.

An engine says its usage once, at the end of its answer; a stream cut short before that (the
client gone right after ``finish_reason``, a timeout, a move that failed) has no count of
its own. The router then counts tokens, not events, with the engine's own tokenizer:
llama-server's ``/apply-template`` and ``/tokenize``, vLLM's ``/tokenize`` (which reads
chat messages itself), within ``COUNT_SECONDS`` in all; past that, or from an engine
without them, an estimate (a token per four bytes of prompt, a token per text event).

``Served`` is what one request was served, noted by the proxy as it goes: the engine asked
last, what it was sent, what reached the client, and the engine's count where it gave one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from router.forward.migration import Relayed
from router.table.routes import Endpoint
from router.wire.compact_json import compact_json
from router.wire.connection import Response
from router.wire.tokens import Tokens

logger = logging.getLogger(__name__)

# Counting an unfinished answer's tokens waits at most this long for the engine.
COUNT_SECONDS = 2.0
# Engines whose /tokenize reads chat messages and a model name (vLLM's and SGLang's).
MESSAGE_TOKENIZERS = frozenset({"vllm", "sglang"})
JSON_HEADERS = [(b"content-type", b"application/json")]

Post = Callable[[Endpoint, str, bytes, list[tuple[bytes, bytes]]], Awaitable[Response]]


@dataclass
class Served:
    """What one request was served so far, whatever ends it."""

    endpoint: Endpoint | None = None  # the engine asked last: it counts what it did not say
    path: str = ""  # what that engine was sent (for a translated request, chat completions)
    body: bytes = b""
    began: bool = False  # the answer's first bytes went to the client
    relayed: Relayed | None = None  # what of a stream reached the client
    engine_usage: Callable[[], Tokens | None] = lambda: None  # the engine's count, once said
    accounted: bool = False  # charged and recorded: once
    journalled: int | None = None  # its number in the usage journal, once it began


class TokenCounter:
    """Counts tokens with the engine's tokenizer, through the proxy's way to engines."""

    def __init__(self, post: Post) -> None:
        self.post = post

    async def served(self, served: Served, model: str) -> Tokens:
        """The prompt and the completion that reached the client: the engine's count where
        it gave one, else counted here (bounded in time), else estimated."""
        usage = served.engine_usage()
        if usage is not None and usage.prompt and usage.completion:
            return usage
        text = served.relayed.read().text if served.relayed is not None else ""
        events = served.relayed.read().chunks if served.relayed is not None else 0
        prompt = usage.prompt if usage is not None and usage.prompt else None
        completion = usage.completion if usage is not None and usage.completion else None
        try:
            async with asyncio.timeout(COUNT_SECONDS):
                if prompt is None:
                    prompt = await self.prompt(served, model)
                if completion is None:
                    completion = await self.text(served.endpoint, model, text) if text else 0
        except Exception as exc:  # noqa: BLE001  # any failure: the estimate below
            logger.info("tokens of an unfinished answer to %s estimated: %s", model, exc or
                        "the engine did not count them in time")  # fmt: skip
        if prompt is None:
            prompt = estimate_prompt(served.body)
        if completion is None:
            completion = events
        return Tokens(prompt, completion)

    async def prompt(self, served: Served, model: str) -> int | None:
        """The tokens of the prompt ``served.body`` holds, as the engine counts them."""
        endpoint = served.endpoint
        if endpoint is None:
            return None
        try:
            payload = json.loads(served.body)
        except ValueError:
            return None
        if not isinstance(payload, dict):
            return None
        messages = payload.get("messages")
        if isinstance(messages, list):
            if endpoint.engine in MESSAGE_TOKENIZERS:
                return await self._tokenize(endpoint, {"model": model, "messages": messages})
            template = await self._ask(endpoint, "/apply-template", {"messages": messages})
            rendered = template.get("prompt") if template else None
            if not isinstance(rendered, str):
                return None
            return await self._tokenize_text(endpoint, model, rendered, special=True)
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            return await self._tokenize_text(endpoint, model, prompt, special=True)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        return None

    async def text(self, endpoint: Endpoint | None, model: str, text: str) -> int | None:
        """The tokens of generated text (no special tokens added)."""
        if endpoint is None:
            return None
        return await self._tokenize_text(endpoint, model, text, special=False)

    async def _tokenize_text(
        self, endpoint: Endpoint, model: str, text: str, *, special: bool
    ) -> int | None:
        if endpoint.engine in MESSAGE_TOKENIZERS:
            return await self._tokenize(
                endpoint, {"model": model, "prompt": text, "add_special_tokens": special}
            )
        return await self._tokenize(endpoint, {"content": text, "add_special": special})

    async def _tokenize(self, endpoint: Endpoint, request: dict[str, Any]) -> int | None:
        answer = await self._ask(endpoint, "/tokenize", request)
        if answer is None:
            return None
        if isinstance(answer.get("count"), int):
            return answer["count"]
        tokens = answer.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None

    async def _ask(self, endpoint: Endpoint, path: str, request: dict[str, Any]) -> dict | None:
        body = compact_json(request)
        response = await self.post(endpoint, path, body, JSON_HEADERS)
        try:
            data = await response.read()
        finally:
            response.close()
        if response.status != 200:
            return None
        try:
            answer = json.loads(data)
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None


def estimate_prompt(body: bytes) -> int:
    """A prompt's tokens when no tokenizer answered: about four bytes a token."""
    return math.ceil(len(body) / 4)
