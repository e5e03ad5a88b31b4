"""Anthropic's answers: the shapes messages.py and the stream share, and the stream.

An engine's chat completions stream is told as Anthropic's Messages stream:

``message_start``, then one content block at a time (text, or a tool call whose arguments
come as ``input_json_delta``), each opened by ``content_block_start`` and closed by
``content_block_stop``, then ``message_delta`` (the stop reason and usage) and
``message_stop``. The engine reports usage after its last chunk, so the message's close
waits for ``[DONE]`` (or the stream's end); ``message_start`` carries no input tokens and
``message_delta`` carries them all, which Anthropic's SDKs take as the totals. An engine's
error event (the router's own included) becomes Anthropic's ``error`` event, which ends
the stream.
"""

from __future__ import annotations

from typing import Any

from router.translate.chat import ChatStream, EngineError, new_id, sse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                "content_filter": "refusal"}  # fmt: skip
# An error's type, for errors that give no HTTP status (the router's own, vLLM's).
_TYPE_STATUS = {
    "invalid_request_error": 400,
    "BadRequestError": 400,
    "exceed_context_size_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "rate_limit_error": 429,
    "unavailable_error": 529,
    "service_unavailable": 529,
}


def stop_reason(finish_reason: str | None, called_tools: bool,
                sequence: str | None) -> tuple[str, str | None]:  # fmt: skip
    """Anthropic's stop_reason and stop_sequence for a chat ``finish_reason``."""
    if finish_reason in STOP_REASONS:
        return STOP_REASONS[finish_reason], None
    if called_tools:  # some engines end a forced tool call with "stop"
        return "tool_use", None
    if sequence:
        return "stop_sequence", sequence
    return "end_turn", None


def usage_json(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def error_json(status: int | None, message: str) -> dict[str, Any]:
    """Anthropic's error object; its type says what the HTTP status did."""
    if status in ERROR_TYPES:
        kind = ERROR_TYPES[status]
    else:
        kind = "api_error" if status is None or status >= 500 else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_event(error: EngineError) -> bytes:
    """Anthropic's ``error`` event, which ends a stream."""
    status = error.status or _TYPE_STATUS.get(error.type or "")
    return sse("error", error_json(status, error.message))


class MessageEvents(ChatStream):
    """One streamed answer: ``feed`` the engine's bytes, ``flush`` at its end."""

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model
        self.id = new_id("msg_")
        self._started = False
        self._open: int | None = None  # the content block being written
        self._open_is_text = False
        self._blocks = 0
        self._tool_blocks: dict[int, int] = {}  # the engine's tool call index: its block

    def on_text(self, piece: str) -> bytes:
        out = self._start()
        if self._open is None or not self._open_is_text:
            out += self._begin_block({"type": "text", "text": ""}, text=True)
        return out + self._delta({"type": "text_delta", "text": piece})

    def on_tool_start(self, index: int, call_id: str, name: str) -> bytes:
        out = self._start()
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        out += self._begin_block(block, text=False)
        self._tool_blocks[index] = self._blocks - 1
        return out

    def on_tool_arguments(self, index: int, piece: str) -> bytes:
        # Engines send one call's arguments before the next call begins; a late piece
        # still goes to its own block, which is what clients index by.
        delta = {"type": "input_json_delta", "partial_json": piece}
        return self._delta(delta, self._tool_blocks[index])

    def on_error(self, error: EngineError) -> bytes:
        return error_event(error)

    def on_end(self) -> bytes:
        out = self._start() + self._close()
        reason, sequence = stop_reason(self.finish_reason, self.called_tools, self.stop_sequence)
        prompt = self.usage.prompt if self.usage else 0
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": usage_json(prompt, self.output_tokens)}  # fmt: skip
        return out + sse("message_delta", delta) + sse("message_stop", {"type": "message_stop"})

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        message: dict[str, Any] = {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage_json(0, 0),
        }  # fmt: skip
        return sse("message_start", {"type": "message_start", "message": message})

    def _begin_block(self, block: dict, *, text: bool) -> bytes:
        out = self._close()
        self._open, self._open_is_text = self._blocks, text
        self._blocks += 1
        start = {"type": "content_block_start", "index": self._open, "content_block": block}
        return out + sse("content_block_start", start)

    def _delta(self, delta: dict, index: int | None = None) -> bytes:
        index = self._open if index is None else index
        return sse("content_block_delta",
                   {"type": "content_block_delta", "index": index, "delta": delta})  # fmt: skip

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        index, self._open = self._open, None
        return sse("content_block_stop", {"type": "content_block_stop", "index": index})
