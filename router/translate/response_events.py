"""The Responses API's answers: the shapes responses.py and the stream share, and the stream.

An engine's chat completions stream is told as the Responses API's events:

``response.created`` and ``response.in_progress``, then each output item in turn: a
message (``output_item.added``, ``content_part.added``, ``output_text.delta``…,
``output_text.done``, ``content_part.done``, ``output_item.done``) or a function call
(``output_item.added``, ``function_call_arguments.delta``…, ``.done``,
``output_item.done``), then ``response.completed`` with the whole response and its
usage, or ``response.incomplete`` when the engine stopped at the token limit. The engine
reports usage after its last chunk, so the end waits for ``[DONE]`` (or the stream's
end). An engine's error event (the router's own included) becomes ``response.failed``.
Every event carries its ``sequence_number``.
"""

from __future__ import annotations

import time
from typing import Any

from router.translate.chat import ChatStream, EngineError, new_id, sse

# Why an answer stopped short, for a chat finish_reason that means it did.
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}

# The codes a failed response may carry (the SDK checks them), for an error's type.
_FAILURE_CODES = {"rate_limit_error": "rate_limit_exceeded",
                  "invalid_request_error": "invalid_prompt",
                  "exceed_context_size_error": "invalid_prompt"}  # fmt: skip


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [part]}  # fmt: skip


def function_item(item_id: str, call_id: str, name: str, arguments: str,
                  status: str) -> dict[str, Any]:  # fmt: skip
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}  # fmt: skip


def usage_json(usage: dict[str, Any] | None) -> dict[str, Any]:
    """The Responses API's usage for a chat completion's."""
    usage = usage or {}
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    prompt_details = usage.get("prompt_tokens_details")
    output_details = usage.get("completion_tokens_details")
    cached = _count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else 0
    reasoning = (_count(output_details.get("reasoning_tokens"))
                 if isinstance(output_details, dict) else 0)  # fmt: skip
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def response_json(
    response_id: str, model: str, created_at: int, status: str, output: list[dict[str, Any]],
    request: dict[str, Any] | None, *, usage: dict[str, Any] | None = None,
    incomplete: str | None = None, error: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A Response object, echoing what the request set as the Responses API does."""
    request = request if isinstance(request, dict) else {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "model": model,
        "output": output,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "parallel_tool_calls": request.get("parallel_tool_calls") is not False,
        "temperature": request.get("temperature"),
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "usage": usage,
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def failure_event(error: EngineError, sequence_number: int, response: dict[str, Any] | None
                  ) -> bytes:  # fmt: skip
    """``response.failed`` for a response that began, else the ``error`` event."""
    code = _FAILURE_CODES.get(error.type or "", "server_error")
    if response is None:
        data = {"type": "error", "sequence_number": sequence_number, "code": code,
                "message": error.message, "param": None}  # fmt: skip
        return sse("error", data)
    response["error"] = {"code": code, "message": error.message, "type": error.type}
    return sse("response.failed", {"type": "response.failed", "sequence_number": sequence_number,
                                   "response": response})  # fmt: skip


class ResponseEvents(ChatStream):
    """One streamed answer: ``feed`` the engine's bytes, ``flush`` at its end.

    ``request`` is the client's body, echoed in the response as the API does.
    """

    def __init__(self, model: str, request: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.model = model
        self.request = request
        self.id = new_id("resp_")
        self.created_at = int(time.time())
        self._sequence = 0
        self._started = False
        self._output: list[dict[str, Any]] = []  # every item so far, as the client has it
        self._open: int | None = None  # the output index being written
        self._call_items: dict[int, int] = {}  # the engine's tool call index: its output index

    def on_text(self, piece: str) -> bytes:
        out = self._start()
        if self._open is None or self._output[self._open]["type"] != "message":
            out += self._close()
            out += self._add(message_item(new_id("msg_"), "", "in_progress"))
            part = self._output[-1]["content"][0]
            out += self._event("response.content_part.added", **self._at(), part=part)
        self._output[self._open]["content"][0]["text"] += piece  # type: ignore[index]
        return out + self._event("response.output_text.delta", **self._at(), delta=piece,
                                 logprobs=[])  # fmt: skip

    def on_tool_start(self, index: int, call_id: str, name: str) -> bytes:
        out = self._start() + self._close()
        out += self._add(function_item(new_id("fc_"), call_id, name, "", "in_progress"))
        self._call_items[index] = self._open  # type: ignore[assignment]
        return out

    def on_tool_arguments(self, index: int, piece: str) -> bytes:
        # Engines send one call's arguments before the next call begins; a late piece
        # still goes to its own item.
        position = self._call_items[index]
        item = self._output[position]
        item["arguments"] += piece
        return self._event("response.function_call_arguments.delta", item_id=item["id"],
                           output_index=position, delta=piece)  # fmt: skip

    def on_error(self, error: EngineError) -> bytes:
        out = self._start()
        for item in self._output:
            if item["status"] == "in_progress":
                item["status"] = "incomplete"
        failed = failure_event(error, self._sequence, self._response("failed"))
        self._sequence += 1
        return out + failed

    def on_end(self) -> bytes:
        incomplete = INCOMPLETE.get(self.finish_reason or "")
        out = self._start() + self._close("incomplete" if incomplete else "completed")
        usage = self.usage_reported or {"prompt_tokens": 0, "completion_tokens": self.pieces}
        if incomplete:
            response = self._response("incomplete", usage=usage_json(usage), incomplete=incomplete)
            return out + self._event("response.incomplete", response=response)
        response = self._response("completed", usage=usage_json(usage))
        return out + self._event("response.completed", response=response)

    # -- the events ----------------------------------------------------------------------

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self._event("response.created", response=self._response("in_progress")) + (
            self._event("response.in_progress", response=self._response("in_progress"))
        )

    def _add(self, item: dict[str, Any]) -> bytes:
        """Begin an output item; a message's content part is announced on its own."""
        self._open = len(self._output)
        self._output.append(item)
        shown = {**item, "content": []} if item["type"] == "message" else item
        return self._event("response.output_item.added", output_index=self._open, item=shown)

    def _close(self, status: str = "completed") -> bytes:
        """End the item being written: its ``done`` events, whole."""
        if self._open is None:
            return b""
        position, self._open = self._open, None
        item = self._output[position]
        item["status"] = status
        out = b""
        if item["type"] == "message":
            part = item["content"][0]
            at = {"item_id": item["id"], "output_index": position, "content_index": 0}
            out += self._event("response.output_text.done", **at, text=part["text"], logprobs=[])
            out += self._event("response.content_part.done", **at, part=part)
        else:
            out += self._event("response.function_call_arguments.done", item_id=item["id"],
                               output_index=position, name=item["name"],
                               arguments=item["arguments"])  # fmt: skip
        return out + self._event("response.output_item.done", output_index=position, item=item)

    def _at(self) -> dict[str, Any]:
        position = self._open
        assert position is not None
        return {"item_id": self._output[position]["id"], "output_index": position,
                "content_index": 0}  # fmt: skip

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        output = self._output if status != "in_progress" else []
        return response_json(self.id, self.model, self.created_at, status, output,
                             self.request, **extra)  # fmt: skip

    def _event(self, kind: str, /, **fields: Any) -> bytes:
        # Written out at once: the items it holds may change after.
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(kind, data)
