"""What the router checks of a request body before a replica sees it.

Only what would otherwise reach an engine as nonsense, or cost it dearly: the fields
every OpenAI endpoint shares, with the field named in the answer. Everything else goes
through untouched, since engines accept more than OpenAI's API does.
"""

from __future__ import annotations

from typing import Any

from router import errors

# What each endpoint cannot do without, and what it must be.
REQUIRED = {
    "/v1/chat/completions": ("messages", "a non-empty list of message objects"),
    "/v1/completions": ("prompt", "a string or a list"),
    "/v1/embeddings": ("input", "a string or a list"),
}
COUNTS = ("max_tokens", "max_completion_tokens")
NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


def check_body(path: str, payload: dict[str, Any], max_choices: int) -> None:
    """Raise a 400 naming the first field a replica could not use as sent."""
    field, wanted = REQUIRED[path]
    value = payload.get(field)
    if path == "/v1/chat/completions":
        ok = isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)
    else:
        ok = isinstance(value, str | list)
    if not ok:
        _refuse(field, f"`{field}` must be {wanted}" + ("; it is missing" if value is None else ""))
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(param: str, message: str) -> None:
    raise errors.invalid_field(param, message + ".")
