"""What the router checks of a request body before a replica sees it.

Only what would otherwise reach an engine as nonsense, or cost it dearly: the fields
every OpenAI endpoint shares, with the field named in the answer. Everything else goes
through untouched, since engines accept more than OpenAI's API does.
"""

from __future__ import annotations

from typing import Any

from router import errors

# What each endpoint cannot do without, and what it must be ("messages": a non-empty list
# of objects; "text": a string or a list; "string"; "list").
REQUIRED = {
    "/v1/chat/completions": ("messages", "messages"),
    "/v1/completions": ("prompt", "text"),
    "/v1/embeddings": ("input", "text"),
    "/v1/messages": ("messages", "messages"),
    "/v1/messages/count_tokens": ("messages", "messages"),
    "/v1/rerank": ("documents", "list"),
    "/rerank": ("documents", "list"),
    "/v1/audio/speech": ("input", "string"),
    "/v1/images/generations": ("prompt", "string"),
    "/detokenize": ("tokens", "list"),
}
WANTED = {
    "messages": "a non-empty list of message objects",
    "text": "a string or a list",
    "string": "a string",
    "list": "a list",
}
COUNTS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


def check_body(path: str, payload: dict[str, Any], max_choices: int) -> None:
    """Raise a 400 naming the first field a replica could not use as sent."""
    if path in REQUIRED:
        _check_required(payload, *REQUIRED[path])
    if path == "/v1/responses" and "previous_response_id" not in payload:
        _check_required(payload, "input", "text")
    if "stream" in payload and not isinstance(payload["stream"], bool | None):
        _refuse("stream", "`stream` must be true or false")
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        _refuse("stream_options", "`stream_options` must be an object")
    for name in COUNTS:
        count = payload.get(name)
        if count is not None and (not _is_int(count) or count < 1):
            _refuse(name, f"`{name}` must be a whole number of at least 1")
    choices = payload.get("n")
    if choices is not None and (not _is_int(choices) or not 1 <= choices <= max_choices):
        _refuse("n", f"`n` must be a whole number from 1 to {max_choices} (LLMGW_ROUTER_MAX_N)")
    for name in NUMBERS:
        number = payload.get(name)
        if number is not None and (isinstance(number, bool) or not isinstance(number, int | float)):
            _refuse(name, f"`{name}` must be a number")


def _check_required(payload: dict[str, Any], field: str, shape: str) -> None:
    value = payload.get(field)
    if shape == "messages":
        ok = isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)
    elif shape == "text":
        ok = isinstance(value, str | list)
    elif shape == "string":
        ok = isinstance(value, str)
    else:
        ok = isinstance(value, list)
    if not ok:
        missing = "; it is missing" if value is None else ""
        _refuse(field, f"`{field}` must be {WANTED[shape]}{missing}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(param: str, message: str) -> None:
    raise errors.invalid_field(param, message + ".")
