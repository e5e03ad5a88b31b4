"""Carrying a streamed answer on to another replica when its engine breaks off.

No I/O here: the proxy (proxy.py) calls these when a stream breaks after its first byte.

- ``Relayed`` keeps the events the client has received and reads them back as
  ``Progress`` (the answer's id, its text so far, whether a tool call or reasoning was in
  flight, whether it had finished). Nothing is parsed while a stream is whole, except
  once what is kept passes ``FOLD_BYTES``.
- ``why_not_movable`` says why a broken answer cannot be carried on, in words.
- ``continuation_body`` asks another engine to go on: for a chat, the conversation plus
  the partial answer as a final assistant message to continue (``continue_final_message``:
  vLLM reads it, and so does llama-server, which without it repeats the partial text
  before going on); for a completion, the prompt plus the text so far. The budget is what
  is left of ``max_tokens``; everything else (seed, sampling) is the client's.
- ``Splice`` makes the continuation read as the rest of the first answer: its id, created
  and model, no second role delta, and the usage of the whole answer.

Tokens the client received are counted by the engine's tokenizer (forward/counting.py;
one per event that carried text where it cannot say), so the budget left to a
continuation is in tokens; the whole answer's total is the last engine's (its prompt
holds the text already sent), so the prompt is counted once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from router.translate.chat import CONTINUE_FINAL_MESSAGE
from router.wire.compact_json import compact_json
from router.wire.tokens import EVENT_END, Tokens, tokens_of

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# Engines (an adapter's name) known to continue a final assistant message; "" is a table
# that does not say, taken as able. Others (SGLang) end a broken stream with the error.
CONTINUING_ENGINES = frozenset({"", "llama.cpp", "vllm"})
# Fields that constrain the output to a format: a continuation would start it over.
STRUCTURED_FIELDS = ("grammar", "json_schema", "guided_json", "guided_regex",
                     "guided_grammar", "guided_choice", "structured_outputs")  # fmt: skip
BUDGETS = ("max_tokens", "max_completion_tokens")
# What is kept of a stream is read into its Progress past this size, so a long answer
# costs the router its text, not every event it relayed.
FOLD_BYTES = 256 * 1024


@dataclass
class Progress:
    """What the client has received of a streamed answer (its first choice)."""

    id: str | None = None
    created: int | None = None
    model: str | None = None
    parts: list[str] = field(default_factory=list)
    chunks: int = 0  # events that carried text: about one token each
    role_sent: bool = False
    tool_call: bool = False
    reasoning: bool = False
    other_choice: bool = False
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def absorb(self, chunk: dict[str, Any]) -> None:
        """Take in one event of the answer, as the client received it."""
        other_api = _text_of_other_api(chunk)
        if other_api is not None:  # Messages or Responses: counted, never carried on
            if other_api:
                self.parts.append(other_api)
                self.chunks += 1
            return
        if self.id is None and isinstance(chunk.get("id"), str):
            self.id = chunk["id"]
            self.created, self.model = chunk.get("created"), chunk.get("model")
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self.other_choice = True
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self.role_sent |= bool(delta.get("role"))
                self.tool_call |= bool(delta.get("tool_calls") or delta.get("function_call"))
                self.reasoning |= bool(delta.get("reasoning_content") or delta.get("reasoning"))
                piece = delta.get("content")
            else:
                piece = choice.get("text")
            if isinstance(piece, str) and piece:
                self.parts.append(piece)
                self.chunks += 1
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]


def _text_of_other_api(chunk: dict[str, Any]) -> str | None:
    """The text an Anthropic Messages or OpenAI Responses stream event carries ("" for
    another of their events), or None for a chat completion's or completion's event."""
    kind = chunk.get("type")
    if not isinstance(kind, str) or "choices" in chunk:
        return None
    delta = chunk.get("delta")
    if kind == "content_block_delta" and isinstance(delta, dict):
        text = delta.get("text") or delta.get("thinking") or delta.get("partial_json")
        return text if isinstance(text, str) else ""
    if kind.startswith("response.") and kind.endswith(".delta") and isinstance(delta, str):
        return delta
    return ""


class Relayed:
    """The events a client received, kept as bytes until someone asks what they said."""

    def __init__(self) -> None:
        self._progress = Progress()
        self._kept = bytearray()

    def keep(self, events: bytes) -> None:
        """Note whole events as they go out to the client."""
        self._kept += events
        if len(self._kept) > FOLD_BYTES:
            self._fold()

    def read(self) -> Progress:
        self._fold()
        return self._progress

    def _fold(self) -> None:
        for chunk in event_payloads(bytes(self._kept)):
            self._progress.absorb(chunk)
        self._kept.clear()


def event_payloads(data: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects of the server-sent events in ``data`` ([DONE] and others skipped)."""
    for event in EVENT_END.split(data):
        chunk = _payload(event)
        if isinstance(chunk, dict):
            yield chunk


def _payload(event: bytes) -> Any:
    data = b"\n".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
    if not data or data == b"[DONE]":
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def engine_continues(engine: str) -> bool:
    """Whether an engine (its adapter's name) can carry on another engine's answer."""
    return engine in CONTINUING_ENGINES


def why_not_movable(path: str, payload: dict[str, Any], progress: Progress) -> str | None:
    """Why this broken answer cannot be carried on elsewhere, or None if it can."""
    choices = payload.get("n")
    if (choices is not None and choices != 1) or progress.other_choice:
        return "it asked for several choices (n > 1)"
    if progress.tool_call:
        return "a tool call was in flight"
    if progress.reasoning:
        return "the model was reasoning, which a continuation cannot pick up"
    if _structured(payload):
        return (
            "its output is held to a format (response_format or a grammar), which a "
            "continuation would start over"
        )
    if path == CHAT:
        last = payload["messages"][-1]
        if last.get("role") == "assistant":
            return "it already asked to continue an assistant message of its own"
    elif path == COMPLETIONS:
        if prompt_text(payload.get("prompt")) is None:
            return "its prompt is not one text (token ids, or several prompts)"
        if payload.get("echo"):
            return "it asked for its prompt echoed"
    return None


def _structured(payload: dict[str, Any]) -> bool:
    response_format = payload.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return True
    return any(payload.get(name) is not None for name in STRUCTURED_FIELDS)


def prompt_text(prompt: Any) -> str | None:
    """A completion's prompt as one text, or None when it is token ids or several prompts."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    return None


def budget_spent(payload: dict[str, Any], progress: Progress, sent: int | None = None) -> bool:
    """Whether the client already received every token its ``max_tokens`` allowed (``sent``:
    the tokens it received, as the engine counts them; its text events if unknown)."""
    sent = progress.chunks if sent is None else sent
    return any(isinstance(payload.get(name), int) and sent >= payload[name] for name in BUDGETS)


def continuation_body(
    path: str, payload: dict[str, Any], progress: Progress, sent: int | None = None
) -> bytes:
    """The request that asks another engine to go on from what the client received, with
    what is left of its ``max_tokens`` after the ``sent`` tokens (text events if unknown)."""
    body = dict(payload)
    sent = progress.chunks if sent is None else sent
    for name in BUDGETS:
        if isinstance(body.get(name), int):
            body[name] = max(1, body[name] - sent)
    text = progress.text
    if path == CHAT and text:
        body["messages"] = [*payload["messages"], {"role": "assistant", "content": text}]
        body.update(CONTINUE_FINAL_MESSAGE)
    elif path == COMPLETIONS:
        body["prompt"] = (prompt_text(payload.get("prompt")) or "") + text
    return compact_json(body)


def closing_events(path: str, progress: Progress) -> bytes:
    """How to end an answer whose engine broke off when nothing was left to generate: its
    finish_reason had gone out (only usage and [DONE] were missing), or its budget had."""
    if progress.finish_reason:
        return b"data: [DONE]\n\n"
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if path == CHAT:
        choice["delta"] = {}
        kind = "chat.completion.chunk"
    else:
        choice["text"] = ""
        kind = "text_completion"
    chunk = {"id": progress.id, "object": kind, "created": progress.created,
             "model": progress.model, "choices": [choice]}  # fmt: skip
    return _event(chunk) + b"data: [DONE]\n\n"


class Splice:
    """Rewrites a continuation's events to read as the rest of the answer ``progress`` began."""

    def __init__(
        self, progress: Progress, *, drop_usage_only: bool, sent: int | None = None
    ) -> None:
        self.first = progress
        self.sent_before = progress.chunks if sent is None else sent
        self.drop_usage_only = drop_usage_only
        self.tokens: Tokens | None = None  # of the whole answer, once the usage came
        self._partial = b""

    def engine_usage(self) -> Tokens | None:
        """The engine's count of the whole answer, once its usage came (``Served``'s)."""
        return self.tokens

    def feed(self, data: bytes) -> bytes:
        """Take bytes as they came; return the whole events to pass on, rewritten."""
        data = self._partial + data
        end = _last_event_end(data)
        self._partial = data[end:]
        if not end:
            return b""
        return b"".join(self._rewrite(event) for event in EVENT_END.split(data[:end]))

    def flush(self) -> bytes:
        """An unterminated last event, once the continuation ended."""
        rest, self._partial = self._partial, b""
        return self._rewrite(rest) if rest.strip() else b""

    def _rewrite(self, event: bytes) -> bytes:
        if not event.strip():
            return b""
        chunk = _payload(event)
        if not isinstance(chunk, dict) or "error" in chunk:
            return event + b"\n\n"  # [DONE], comments, an engine's error: as they are
        first = self.first
        for key, value in (("id", first.id), ("created", first.created), ("model", first.model)):
            if value is not None:
                chunk[key] = value
        choices = chunk.get("choices")
        if first.role_sent and isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and isinstance(choice.get("delta"), dict):
                    choice["delta"].pop("role", None)
        usage = tokens_of(chunk.get("usage"))
        if usage is not None:
            self.tokens = self._whole_answer(chunk, usage)
            if self.drop_usage_only and choices == []:
                return b""
        elif choices and all(_says_nothing(choice) for choice in choices):
            return b""  # the continuation's opening role delta, now empty
        return _event(chunk)

    def _whole_answer(self, chunk: dict[str, Any], usage: Tokens) -> Tokens:
        """Usage of the whole answer: the continuation's prompt held the text already sent."""
        prompt = max(usage.prompt - self.sent_before, 0)
        completion = usage.completion + self.sent_before
        chunk["usage"] = {
            **chunk["usage"],
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        return Tokens(prompt, completion)


def _says_nothing(choice: Any) -> bool:
    if not isinstance(choice, dict) or choice.get("finish_reason") or choice.get("logprobs"):
        return False
    delta = choice.get("delta")
    return isinstance(delta, dict) and not any(delta.values())


def _last_event_end(data: bytes) -> int:
    ends = [m.end() for m in EVENT_END.finditer(data)]
    return ends[-1] if ends else 0


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + compact_json(chunk) + b"\n\n"
