"""Chat completions as llama-server answers them, and an SDK client wired to a translator.

The shapes follow llama-server's own (tools/server/server-task.cpp): a stream opens with
a role delta, text comes in ``delta.content``, a tool call's first piece carries its
id, type and name and the next pieces its arguments, the chunk with ``finish_reason``
has an empty delta, and the usage comes in a chunk of its own (``choices: []``) before
``[DONE]``.

``Translated`` is the test's engine and router in one: the official SDK's real request
goes through the translator's ``to_chat``, a canned engine answer comes back through
``from_chat`` or the stream translator, fed in pieces as a network would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2

from router.errors import RouterError

CREATED = 1_760_000_000
FINGERPRINT = "b6000-0123abcd"


def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> dict:
    choices = [] if delta is None else [{"finish_reason": finish, "index": 0, "delta": delta}]
    return {
        "choices": choices,
        "created": CREATED,
        "id": "chatcmpl-llama",
        "model": "smol",
        "system_fingerprint": FINGERPRINT,
        "object": "chat.completion.chunk",
        **extra,
    }


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}, "id": call_id}


def answer(
    content: str | None = None,
    *,
    calls: list[dict] | None = None,
    finish: str = "stop",
    prompt: int = 12,
    completion: int = 5,
    **choice: Any,
) -> dict[str, Any]:
    """A whole chat completion."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "choices": [{"finish_reason": finish, "index": 0, "message": message, **choice}],
        "created": CREATED,
        "model": "smol",
        "system_fingerprint": FINGERPRINT,
        "object": "chat.completion",
        "usage": usage(prompt, completion),
        "id": "chatcmpl-llama",
        "timings": {"prompt_n": prompt},
    }


def stream(
    texts: list[str] = (),
    *,
    calls: list[tuple[str, str, list[str]]] = (),
    finish: str = "stop",
    prompt: int = 12,
    completion: int | None = None,
    cached: int = 0,
    tail: list[bytes] | None = None,
    **choice: Any,
) -> bytes:
    """A streamed chat completion: text pieces, then tool calls (id, name, argument
    pieces), the finishing chunk, the usage chunk and ``[DONE]`` (or ``tail``)."""
    chunks = [chunk({"role": "assistant", "content": None})]
    chunks += [chunk({"content": text}) for text in texts]
    for index, (call_id, name, pieces) in enumerate(calls):
        first = {"index": index, "id": call_id, "type": "function", "function": {"name": name}}
        chunks.append(chunk({"tool_calls": [first]}))
        chunks += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in pieces
        ]
    last = chunk({}, finish)
    last["choices"][0].update(choice)
    chunks.append(last)
    spent = completion if completion is not None else len(texts) + sum(len(c[2]) for c in calls)
    chunks.append(chunk(None, usage=usage(prompt, spent, cached), timings={"prompt_n": prompt}))
    events = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    return b"".join(events + (tail if tail is not None else [b"data: [DONE]\n\n"]))


def stream_chunks(data: bytes) -> list[Any]:
    """The JSON of each event of a chat stream (``[DONE]`` left out), to mutate."""
    return [json.loads(event[6:]) for event in data.split(b"\n\n") if event.startswith(b"data: {")]


def as_stream(chunks: list[Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


def error_event(message: str, code: int = 500, type_: str = "server_error") -> bytes:
    """llama-server's error event in a stream that already began."""
    error = {"code": code, "message": message, "type": type_}
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


def pieces(data: bytes, size: int) -> list[bytes]:
    """``data`` cut every ``size`` bytes, as a network may deliver it."""
    return [data[i : i + size] for i in range(0, len(data), size)]


def translate_stream(translator: Any, data: bytes, size: int | None = None) -> bytes:
    parts = pieces(data, size) if size else [data]
    return b"".join(translator.feed(part) for part in parts) + translator.flush()


def sse_events(data: bytes) -> list[dict[str, Any]]:
    """The JSON of each named server-sent event, checking that its name is its type."""
    found = []
    for event in data.decode().split("\n\n"):
        if event:
            name, payload = event.split("\n", 1)
            parsed = json.loads(payload.removeprefix("data: "))
            assert name == f"event: {parsed['type']}"
            found.append(parsed)
    return found


Engine = Callable[[dict[str, Any]], "tuple[int, dict | bytes]"]


def engine_answering(*answers: Any) -> Engine:
    """An engine that gives these answers in turn: a dict (a whole answer), bytes (a
    stream), or (status, body) for an error."""
    queue = list(answers)

    def engine(chat: dict[str, Any]) -> tuple[int, dict | bytes]:
        given = queue.pop(0)
        return given if isinstance(given, tuple) else (200, given)

    return engine


@dataclass
class Translated:
    """A mock transport for an SDK: the request translated, the engine's answer back.

    ``engine`` takes the chat body and returns (status, answer): a dict for a whole JSON
    answer, bytes for a stream or an error body. ``module`` is router.translate.messages
    or .responses. What passed is kept for the test to look at.
    """

    module: Any
    engine: Engine
    cut: int | None = None  # feed the stream in pieces of this many bytes
    echo: bool = False  # hand the client's request to the answer's translator (Responses)
    requests: list[dict[str, Any]] = field(default_factory=list)
    chats: list[dict[str, Any]] = field(default_factory=list)
    translators: list[Any] = field(default_factory=list)

    def client(self) -> httpx2.Client:
        return httpx2.Client(transport=httpx2.MockTransport(self.handle))

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        payload = json.loads(request.content)
        self.requests.append(payload)
        try:
            chat = self.module.to_chat(payload)
        except RouterError as error:
            return self._json(error.status, self.module.error_body(error.status, error.body()))
        self.chats.append(chat)
        status, engine_answer = self.engine(chat)
        if status >= 400:
            return self._json(status, self.module.error_body(status, engine_answer))
        if chat.get("stream"):
            translator = self.module.stream_translator(payload["model"], *self._echoed(payload))
            self.translators.append(translator)
            events = translate_stream(translator, engine_answer, self.cut)
            return httpx2.Response(
                200, content=events, headers={"content-type": "text/event-stream"}
            )
        made = self.module.from_chat(engine_answer, payload["model"], *self._echoed(payload))
        return self._json(200, json.dumps(made).encode())

    def _echoed(self, payload: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        return (payload,) if self.echo else ()

    @staticmethod
    def _json(status: int, body: bytes) -> httpx2.Response:
        return httpx2.Response(status, content=body, headers={"content-type": "application/json"})
