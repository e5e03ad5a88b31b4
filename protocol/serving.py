"""What a model serves: the kinds a profile names in ``serves:``, and the paths of each.

An operator writes ``serves: [embeddings]`` rather than engine flags; each engine adapter
turns the kinds into its own flags (``agent_worker/engines/``), the routing snapshot
carries them, and the router answers a path only for a model that serves its kind,
without touching an engine otherwise. ``/tokenize`` and ``/detokenize`` belong to every
kind: any engine that loaded the model can count its tokens.

Two chat APIs are also served on top of an engine's chat completions, where the engine
lacks them natively (``router/translate/``): Anthropic's Messages and OpenAI's Responses.
Which engines serve them natively, from which version, is ``NATIVE_SINCE``.
"""

from __future__ import annotations

import re
from typing import Final, Literal

ServeKind = Literal["chat", "embeddings", "rerank", "transcription", "speech", "images"]
SERVE_KINDS: tuple[ServeKind, ...] = (
    "chat", "embeddings", "rerank", "transcription", "speech", "images",
)  # fmt: skip
# What a profile that names nothing serves: a language model's generation.
DEFAULT_SERVES: tuple[ServeKind, ...] = ("chat",)

# The POST paths a client addresses to a model (by ``model`` in the body), by kind.
PATHS_BY_KIND: Final[dict[ServeKind, tuple[str, ...]]] = {
    "chat": (
        "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
        "/v1/messages/count_tokens",
    ),
    "embeddings": ("/v1/embeddings",),
    "rerank": ("/v1/rerank", "/rerank", "/v1/score"),
    "transcription": ("/v1/audio/transcriptions", "/v1/audio/translations"),
    "speech": ("/v1/audio/speech",),
    "images": ("/v1/images/generations",),
}  # fmt: skip
TOKENIZE_PATHS: Final = ("/tokenize", "/detokenize")
KIND_OF_PATH: Final[dict[str, ServeKind]] = {
    path: kind for kind, paths in PATHS_BY_KIND.items() for path in paths
}
# Uploads: the model is a form field, and the file streams through.
MULTIPART_PATHS: Final = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations"})
# Answers that may stream (``"stream": true``) as server-sent events.
STREAMING_PATHS: Final = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"}
)

# The chat APIs the router can serve on an engine's /v1/chat/completions.
TranslatedApi = Literal["messages", "responses"]
TRANSLATED_PATHS: Final[dict[str, TranslatedApi]] = {
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages",
    "/v1/responses": "responses",
}
# engine -> API -> the first version serving it natively ("" for every version).
# An engine or API missing here is translated.
NATIVE_SINCE: Final[dict[str, dict[TranslatedApi, str]]] = {
    "llama.cpp": {"messages": "", "responses": ""},
    "vllm": {"messages": "0.11.0", "responses": "0.10.0"},
}


def serve_kind_problems(serves: list[str]) -> list[str]:
    """Every kind in ``serves`` llmgw does not know, said so an operator can fix it."""
    known = ", ".join(SERVE_KINDS)
    return [
        f"serves: {kind!r} is not a kind llmgw routes; use one or more of {known}"
        for kind in serves
        if kind not in SERVE_KINDS
    ]


def natively_served(engine: str, version: str) -> list[TranslatedApi]:
    """The translatable APIs ``engine`` at ``version`` serves itself, without the router."""
    native = NATIVE_SINCE.get(engine, {})
    return [api for api, since in native.items() if not since or _at_least(version, since)]


def _at_least(version: str, since: str) -> bool:
    """Whether ``version`` is ``since`` or newer; an unknown version counts as older."""
    have = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if have is None:
        return False
    need = tuple(int(part) for part in since.split("."))
    return tuple(int(part or 0) for part in have.groups()) >= need
