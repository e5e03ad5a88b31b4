"""Reading ``usage`` out of engine answers without slowing the relay down.

Streams are split into server-sent events only to look at them: an event is parsed as
JSON only when it carries a ``"usage": {...}`` object, which is once per stream. The
usage-only chunk the router asked for on the client's behalf (``choices: []``) can be
dropped, so a client that did not ask for usage sees the stream it asked for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TypeGuard

_ENDINGS = (b"\n\n", b"\r\n\r\n", b"\r\r")  # what ends a server-sent event
EVENT_END = re.compile(b"|".join(re.escape(ending) for ending in _ENDINGS))
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
_DECODER = json.JSONDecoder()


@dataclass
class Tokens:
    prompt: int = 0  # the whole prompt, the part the engine found in its cache included
    completion: int = 0
    cached: int = 0  # of ``prompt``, read from the engine's prompt cache


# Anthropic's Messages API counts the prompt in three parts: ``input_tokens`` is only what
# was neither read from the prompt cache nor written to it (llama-server's "Say hi" after a
# 31-token cached system prompt says input_tokens 1, cache_read_input_tokens 31).
CACHE_READ, CACHE_WRITE = "cache_read_input_tokens", "cache_creation_input_tokens"


def tokens_of(usage: object) -> Tokens | None:
    """The tokens of a ``usage`` object in OpenAI's words (prompt/completion tokens) or in
    Anthropic's and the Responses API's (input/output tokens): the whole prompt, however
    the engine split it, and its cached part."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
    if prompt is None and _is_count(completion) and "output_tokens" in usage:
        return Tokens(0, completion)  # message_delta: the output; the input said before
    if not _is_count(prompt) or not _is_count(completion):
        return None
    read, written = _count_or_0(usage.get(CACHE_READ)), _count_or_0(usage.get(CACHE_WRITE))
    if read or written:  # Anthropic's parts, each apart from input_tokens
        return Tokens(prompt + read + written, completion, read)
    # OpenAI's (chat) and the Responses API's cached tokens are part of the prompt's count.
    details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
    cached = _count_or_0(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Tokens(prompt, completion, min(cached, prompt))


def _count_or_0(value: object) -> int:
    return value if _is_count(value) and value > 0 else 0


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def usage_in_event(chunk: dict) -> object:
    """An event's usage object: at the top (chat, Anthropic's message_delta), in its
    ``message`` (message_start) or in its ``response`` (response.completed)."""
    if "usage" in chunk:
        return chunk["usage"]
    for holder in ("message", "response"):
        inner = chunk.get(holder)
        if isinstance(inner, dict) and "usage" in inner:
            return inner["usage"]
    return None


def usage_of_body(body: bytes) -> Tokens | None:
    """The ``usage`` of a whole JSON answer, found from the end (where engines put it).

    Decodes only the usage object rather than the whole body: an embeddings answer can
    be megabytes of floats. A quote inside a JSON string is always escaped, so
    ``"usage"`` followed by a colon is a key, never text.
    """
    match = _last_usage(body, max(0, len(body) - 4096)) or _last_usage(body, 0)
    if match is None:
        return None
    try:
        usage, _end = _DECODER.raw_decode(body[match.end() - 1 :].decode("utf-8", "replace"))
    except ValueError:
        return None
    return tokens_of(usage)


def _last_usage(body: bytes, start: int) -> re.Match[bytes] | None:
    end = len(body)
    while (found := body.rfind(b'"usage"', start, end)) >= 0:
        match = _USAGE_OBJECT.match(body, found)
        if match is not None:
            return match
        end = found
    return None


def _last_event_end(data: bytes) -> int:
    """Where the last whole event in ``data`` ends (0 if none does)."""
    end = 0
    for separator in _ENDINGS:
        found = data.rfind(separator)
        if found >= 0:
            end = max(end, found + len(separator))
    return end


def _event_end(data: bytes, position: int) -> int:
    """Where the event around ``position`` ends (just past its blank line)."""
    found = EVENT_END.search(data, position)
    return found.end() if found else len(data)


class EventScanner:
    """Cuts a byte stream into whole server-sent events and notes the last usage seen."""

    def __init__(self, *, drop_usage_only: bool) -> None:
        self.drop_usage_only = drop_usage_only
        self.tokens: Tokens | None = None
        self._partial = b""

    def feed(self, data: bytes) -> bytes:
        """Take bytes as they came; return the whole events to pass on (maybe fewer)."""
        if self._partial:
            data = self._partial + data
        # Fastest, nearly every read of a stream: whole events without a usage key, passed
        # on as they came (no regular expression, no copy).
        if data.endswith(_ENDINGS) and b'"usage"' not in data:
            self._partial = b""
            return data
        # Fast path: no usage object, so pass on every whole event.
        end = _last_event_end(data)
        if not _USAGE_OBJECT.search(data, 0, end):
            self._partial = data[end:]
            return data[:end]
        # Only the events holding a usage object are cut out and parsed.
        self._partial = data[end:]
        kept: list[bytes] = []
        done = 0  # data[:done] is decided
        for match in _USAGE_OBJECT.finditer(data, 0, end):
            if match.start() < done:
                continue  # a second usage key in an event already looked at
            first = _last_event_end(data[: match.start()])
            last = _event_end(data, match.end())
            if not self._look_at(data[first:last]):
                kept.append(data[done:first])
                done = last
        if not kept:
            return data[:end]
        kept.append(data[done:end])
        return b"".join(kept)

    @property
    def mid_event(self) -> bool:
        """Whether the bytes fed so far end inside an event."""
        return bool(self._partial)

    def flush(self) -> bytes:
        """What is left when the stream ends: an unterminated last event, passed on as is."""
        rest, self._partial = self._partial, b""
        if rest and _USAGE_OBJECT.search(rest) and not self._look_at(rest):
            return b""
        return rest

    def _look_at(self, event: bytes) -> bool:
        """Note the event's usage; return False if it is a usage-only chunk to drop."""
        payload = b"".join(
            line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")
        )
        try:
            chunk = json.loads(payload)
        except ValueError:
            return True
        if not isinstance(chunk, dict):
            return True
        tokens = tokens_of(usage_in_event(chunk))
        if tokens is None:
            return True
        seen = self.tokens
        # Anthropic's stream says the input in message_start and the output in
        # message_delta: an event that leaves a count out does not undo an earlier one.
        self.tokens = tokens if seen is None else Tokens(
            tokens.prompt or seen.prompt, tokens.completion or seen.completion,
            tokens.cached if tokens.prompt else seen.cached,
        )  # fmt: skip
        return not (self.drop_usage_only and chunk.get("choices") == [])
