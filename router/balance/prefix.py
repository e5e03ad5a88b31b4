"""Prefix routing: the key that keeps requests sharing a prompt prefix on one replica.

A profile with ``routing: prefix`` wants requests that open alike (one system prompt,
different questions) to meet the engine's prefix cache that already holds their opening.
The key is what such requests share: for a chat, every message but the last (the system
prompt and the conversation so far; the last message is what is new), or the only one.
That text is rendered the same way every time (each message's role, then its content, of
a list of parts the text parts), cut at ``size`` bytes, rounded down to whole ``block``s
and hashed: two requests get one key exactly when they keep the same bytes. A
completion's prompt has no new part to leave out, so completions meet only when their
first ``size`` bytes (or all their whole blocks) are the same. Less than one block, and
embeddings (no cache to meet), give no key: such requests go by least outstanding.

The balancer turns a key into a replica as it does an ``x-session-id``: rendezvous
hashing, passing over a replica above ``load_factor`` times the mean load
(balancer.py). A client's own session id wins over the prefix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from itertools import islice
from typing import Any

from protocol.routing import PREFIX
from router.config import RouterConfig
from router.table.routes import ModelRoute

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
# After a message's role, and after the message: control characters ordinary text does
# not hold, so where a role or a message ends is part of the key.
ROLE_END = "\x1f"
MESSAGE_END = "\x1e"


def prefix_key(payload: dict[str, Any], path: str, size: int, block: int) -> str | None:
    """The hash of the request's shared leading bytes, in whole blocks; None: no key."""
    leading = _leading_bytes(_shared_text(payload, path), size)
    whole = len(leading) // block * block
    if whole == 0:
        return None
    return hashlib.blake2b(leading[:whole], digest_size=16).hexdigest()


def affinity_for(
    route: ModelRoute, payload: dict[str, Any], path: str, session: str | None,
    config: RouterConfig,
) -> str | None:  # fmt: skip
    """What the balancer keeps this request's replica by: the client's session id if it
    sent one, else the prompt's prefix key when the model routes by prefix; None (or
    the empty id) leaves the pick to least outstanding."""
    if session or route.routing != PREFIX or len(route.endpoints) < 2:
        return session
    key = prefix_key(payload, path, config.prefix_bytes, config.prefix_block)
    if key and route.adapter:
        # An adapter's prefix cache is not its base's: the same prompt keys apart.
        return f"{route.name}|{key}"
    return key


def _shared_text(payload: dict[str, Any], path: str) -> Iterator[str]:
    """The shared part of the request, piece by piece, so reading stops at ``size``."""
    if path == CHAT_PATH:
        messages = payload.get("messages")
        if not isinstance(messages, list):
            return
        for message in islice(messages, max(len(messages) - 1, 1)):
            if isinstance(message, dict):
                yield f"{message.get('role', '')}{ROLE_END}"
                yield from _content_text(message.get("content"))
            yield MESSAGE_END
    elif path == COMPLETIONS_PATH:
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of prompts: the first one stands for them
        if isinstance(prompt, str):
            yield prompt
        elif isinstance(prompt, list):  # token ids
            yield from (f"{token}," for token in prompt)


def _content_text(content: Any) -> Iterator[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    yield text


def _leading_bytes(pieces: Iterator[str], size: int) -> bytes:
    """The first ``size`` bytes of the pieces in UTF-8, reading no further than needed."""
    leading = bytearray()
    for piece in pieces:
        # A character is at least one byte: this many characters are always enough.
        leading += piece[: size - len(leading)].encode("utf-8", "surrogatepass")
        if len(leading) >= size:
            break
    return bytes(leading[:size])
