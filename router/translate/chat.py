"""Reading what an engine answered on chat completions: whole answers, streams, errors.

``ChatStream`` is the part the stream translators share: it cuts the engine's bytes into
server-sent events, reads each chunk, and calls its subclass once per thing that happened
(text, a tool call begun, a piece of its arguments, the engine's error, the end), so each
subclass only says how its API tells it. Engines differ in small ways it evens out:
llama-server sends usage in a chunk of its own after the one with ``finish_reason``, some
engines put it in that chunk, and a tool call's name may come before or with its id.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from router.wire.tokens import EVENT_END, Tokens, tokens_of

# What a message says when an error body carries no words of its own.
_NO_MESSAGE = "The engine answered HTTP {status} without saying why."
# Asks an engine to go on from the conversation's final assistant message instead of
# answering it (vLLM reads it, and so does llama-server): an Anthropic prefill, and the
# rest of an answer another engine broke off (forward/migration.py).
CONTINUE_FINAL_MESSAGE = {"continue_final_message": True, "add_generation_prompt": False}


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def object_at(holder: dict[str, Any], key: str) -> dict[str, Any]:
    """``holder[key]`` if it is an object, else an empty one: engines' answers are read
    leniently, what is missing or odd reads as absent."""
    value = holder.get(key)
    return value if isinstance(value, dict) else {}


def first_choice(answer: Any) -> dict[str, Any]:
    """The first choice of a whole chat completion, or an empty one (nothing to read)."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def matched_stop(choice: dict[str, Any]) -> str | None:
    """The stop sequence that ended a choice, where the engine says: vLLM's ``stop_reason``,
    SGLang's ``matched_stop`` (llama-server does not say)."""
    for name in ("stop_reason", "matched_stop"):
        value = choice.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def tool_calls_of(message: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(id, name, arguments) of each tool call in a whole answer's message."""
    calls = []
    given = message.get("tool_calls")
    for call in given if isinstance(given, list) else ():
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            continue
        function = call["function"]
        name, arguments = function.get("name"), function.get("arguments")
        call_id = call.get("id")
        calls.append(
            (
                call_id if isinstance(call_id, str) and call_id else new_id("call_"),
                name if isinstance(name, str) else "",
                arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
            )
        )
    return calls


def merge_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive messages of one role (tool results aside) as one: Anthropic reads them
    so, and many chat templates refuse two user or two assistant turns in a row."""
    merged: list[dict[str, Any]] = []
    for message in messages:
        before = merged[-1] if merged else None
        if before is None or before["role"] != message["role"] or message["role"] == "tool":
            merged.append(message)
        elif message["role"] == "assistant":
            before["content"] = (before.get("content") or "") + (message.get("content") or "")
            calls = before.get("tool_calls", []) + message.get("tool_calls", [])
            if calls:
                before["tool_calls"] = calls
        elif isinstance(before["content"], str) and isinstance(message["content"], str):
            before["content"] += "\n\n" + message["content"]
        else:
            before["content"] = _parts(before["content"]) + _parts(message["content"])
    return merged


def _parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


@dataclass
class EngineError:
    """An engine's error, read from whatever shape it came in."""

    status: int | None  # the HTTP status it stands for, where known
    type: str | None
    code: str | None
    message: str
    param: str | None = None


def read_error(error: Any, status: int | None = None) -> EngineError:
    """Read ``{"error": {...}}``, ``{"error": "..."}``, ``{"message": ...}`` or other JSON."""
    if isinstance(error, dict) and "error" in error:
        error = error["error"]
    if isinstance(error, str):
        return EngineError(status, None, None, error)
    if not isinstance(error, dict):
        return EngineError(status, None, None, _NO_MESSAGE.format(status=status or "?"))
    code, type_, message = error.get("code"), error.get("type"), error.get("message")
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        status = status or code  # llama-server's numeric code is an HTTP status
    if not isinstance(message, str) or not message:
        message = error.get("detail") if isinstance(error.get("detail"), str) else None
    param = error.get("param")
    return EngineError(
        status,
        type_ if isinstance(type_, str) and type_ else None,
        code if isinstance(code, str) and code else None,
        message or _NO_MESSAGE.format(status=status or "?"),
        param if isinstance(param, str) else None,
    )


def read_error_body(status: int, body: bytes) -> EngineError:
    """An error answer's body as an EngineError; text that is not JSON becomes its message."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        words = body.decode("utf-8", "replace").strip()[:2000]
        return EngineError(status, None, None, words or _NO_MESSAGE.format(status=status))
    return read_error(document, status)


@dataclass
class _ToolCall:
    id: str | None = None
    name: str = ""
    pending: str = ""  # arguments that came before the name
    begun: bool = False


class ChatStream:
    """An engine's chat completions stream, told again by a subclass in another API.

    ``feed`` takes the engine's bytes as they come (whole events or not) and returns the
    subclass's events for them; ``flush`` ends the stream (an engine that never sent
    ``[DONE]`` still gets its answer closed). ``usage`` is the last usage the engine
    reported, for accounting.
    """

    def __init__(self) -> None:
        self.usage: Tokens | None = None
        self.usage_reported: dict[str, Any] | None = None  # as the engine said it, details too
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None
        self.pieces = 0  # chunks that carried text or arguments: about one token each
        self.ended = False
        self._partial = b""
        self._engine_calls: dict[int, _ToolCall] = {}

    # -- what subclasses say -----------------------------------------------------------

    def on_text(self, piece: str) -> bytes:
        raise NotImplementedError

    def on_tool_start(self, index: int, call_id: str, name: str) -> bytes:
        raise NotImplementedError

    def on_tool_arguments(self, index: int, piece: str) -> bytes:
        raise NotImplementedError

    def on_error(self, error: EngineError) -> bytes:
        raise NotImplementedError

    def on_end(self) -> bytes:
        raise NotImplementedError

    # -- reading the engine ------------------------------------------------------------

    @property
    def called_tools(self) -> bool:
        return any(call.begun for call in self._engine_calls.values())

    @property
    def output_tokens(self) -> int:
        return self.usage.completion if self.usage else self.pieces

    def feed(self, data: bytes) -> bytes:
        data = self._partial + data if self._partial else data
        out = []
        start = 0
        for match in EVENT_END.finditer(data):
            out.append(self._read_event(data[start : match.start()]))
            start = match.end()
        self._partial = data[start:]
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self._partial = self._partial, b""
        out = self._read_event(rest) if rest.strip() else b""
        return out if self.ended else out + self._end_stream()

    def _read_event(self, event: bytes) -> bytes:
        if self.ended:
            return b""
        lines = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
        payload = b"\n".join(lines)
        if payload == b"[DONE]":
            return self._end_stream()
        try:
            chunk = json.loads(payload) if payload else None
        except (ValueError, RecursionError):  # not an event of the answer: nothing to tell
            return b""
        if not isinstance(chunk, dict):
            return b""
        # {"error": {...}} as llama-server and the router send it; older vLLM sent the
        # error object itself.
        error = chunk.get("error") or (chunk if chunk.get("object") == "error" else None)
        if error:
            self.ended = True
            return self.on_error(read_error(error))
        tokens = tokens_of(chunk.get("usage"))
        if tokens is not None:
            self.usage, self.usage_reported = tokens, chunk["usage"]
        out = []
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            # One answer per request: translated requests never ask for several choices.
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out += self._read_choice(choice)
        return b"".join(out)

    def _read_choice(self, choice: dict[str, Any]) -> list[bytes]:
        out = []
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if isinstance(content, str) and content:
                self.pieces += 1
                out.append(self.on_text(content))
            calls = delta.get("tool_calls")
            for position, call in enumerate(calls if isinstance(calls, list) else ()):
                if isinstance(call, dict):
                    out.append(self._read_tool_piece(position, call))
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
            self.stop_sequence = matched_stop(choice)
        return out

    def _read_tool_piece(self, position: int, piece: dict[str, Any]) -> bytes:
        index = piece.get("index")
        index = index if isinstance(index, int) and not isinstance(index, bool) else position
        call = self._engine_calls.setdefault(index, _ToolCall())
        if isinstance(piece.get("id"), str) and piece["id"] and call.id is None:
            call.id = piece["id"]
        function = object_at(piece, "function")
        name, arguments = function.get("name"), function.get("arguments")
        arguments = arguments if isinstance(arguments, str) else ""
        if arguments:
            self.pieces += 1
        if call.begun:
            return self.on_tool_arguments(index, arguments) if arguments else b""
        if not (isinstance(name, str) and name):
            call.pending += arguments  # a name must open the call: wait for it
            return b""
        call.begun, call.name = True, name
        call.id = call.id or new_id("call_")
        out = self.on_tool_start(index, call.id, name)
        arguments, call.pending = call.pending + arguments, ""
        return out + (self.on_tool_arguments(index, arguments) if arguments else b"")

    def _end_stream(self) -> bytes:
        self.ended = True
        return self.on_end()


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event with a name, as Anthropic and the Responses API send them."""
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {body}\n\n".encode()
