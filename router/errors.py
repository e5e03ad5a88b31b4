"""Error answers in OpenAI's shape: ``{"error": {"message", "type", "code"}}``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field


@dataclass
class RouterError(Exception):
    """An answer the router gives itself, instead of relaying an engine's."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    param: str | None = None  # the body's field at fault, as OpenAI names it

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    ).encode()


def stream_error_event(message: str) -> bytes:
    """How a stream that already began ends on a failure: an error event, then [DONE].

    vLLM and SGLang end theirs the same way, and the openai SDK raises ``APIError`` on an
    event holding ``error``, so a cut answer is never mistaken for a whole one.
    """
    body = error_body(message, "upstream_error", "upstream_stream_broken")
    return b"data: " + body + b"\n\ndata: [DONE]\n\n"


def missing_key() -> RouterError:
    return RouterError(
        401,
        "No API key: send `Authorization: Bearer <key>`; "
        "an operator creates one with `llmgw_ctl keys create NAME`.",
        "invalid_request_error",
        "missing_api_key",
        [(b"www-authenticate", b"Bearer")],
    )


def bad_key() -> RouterError:
    return RouterError(
        401,
        "Incorrect API key (unknown or revoked); ask an operator for a current one.",
        "invalid_request_error",
        "invalid_api_key",
        [(b"www-authenticate", b"Bearer")],
    )


def expired_key(name: str, prefix: str, expired_at: float) -> RouterError:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(expired_at))
    return RouterError(
        401,
        f"The API key {prefix}… ({name}) expired on {when}; ask an operator for a new one "
        "(`llmgw_ctl keys create`) or to extend it (`llmgw_ctl keys update --expires`).",
        "invalid_request_error",
        "expired_api_key",
    )


def model_not_allowed(model: str, key_name: str, allowed: list[str]) -> RouterError:
    return RouterError(
        403,
        f"The key {key_name!r} may not use model {model!r}; it may use: {', '.join(allowed)}.",
        "permission_error",
        "model_not_allowed",
    )


def unknown_model(model: str, known: list[str]) -> RouterError:
    listing = ", ".join(known) if known else "none yet"
    return RouterError(
        404,
        f"The model {model!r} does not exist; known models: {listing}.",
        "invalid_request_error",
        "model_not_found",
    )


def malformed(message: str, code: str) -> RouterError:
    return RouterError(400, message, "invalid_request_error", code)


def invalid_field(param: str, message: str) -> RouterError:
    return RouterError(400, message, "invalid_request_error", "invalid_value", param=param)


def too_large(limit: int) -> RouterError:
    return RouterError(
        413,
        f"The request body is over {limit} bytes (LLMGW_ROUTER_MAX_BODY).",
        "invalid_request_error",
        "request_too_large",
    )


def unavailable(message: str, retry_after: int, code: str = "no_ready_replica") -> RouterError:
    return RouterError(
        503, message, "service_unavailable", code, [(b"retry-after", str(retry_after).encode())]
    )


def bad_gateway(message: str) -> RouterError:
    return RouterError(502, message, "upstream_error", "upstream_unreachable")


def not_found(path: str) -> RouterError:
    return RouterError(
        404,
        f"No route {path}; the router serves /v1/chat/completions, /v1/completions, "
        "/v1/responses, /v1/messages, /v1/embeddings, /v1/rerank, /v1/audio/*, "
        "/v1/images/generations, /tokenize, /detokenize, /v1/models, /health and /metrics.",
        "invalid_request_error",
        "not_found",
    )


def not_served(
    model: str, path: str, kind: str, serves: tuple[str, ...], serving: list[str],
    *, restricted: bool = False,
) -> RouterError:  # fmt: skip
    """A request for what the model's profiles do not serve: said before any engine sees it.
    ``serving`` names the models the key may use that serve ``kind``; ``restricted``: the
    key may use only some models."""
    if serving:
        elsewhere = f"models that serve {kind}: {', '.join(serving)}"
    elif restricted:
        elsewhere = f"no model this key may use serves {kind}"
    else:
        elsewhere = f"no model serves {kind} yet; an operator adds `serves: [{kind}]` to a profile"
    return RouterError(
        400,
        f"The model {model!r} serves {', '.join(serves)}, not {kind} ({path}); {elsewhere}.",
        "invalid_request_error",
        "model_does_not_serve",
        param="model",
    )


def unknown_response(response_id: str) -> RouterError:
    return RouterError(
        404,
        f"The response {response_id!r} is not known to this router (it was never made "
        "here, or is too old to be remembered); start again without previous_response_id.",
        "invalid_request_error",
        "response_not_found",
        param="previous_response_id",
    )


def conversation_too_long(response_id: str, limit: int) -> RouterError:
    return RouterError(
        400,
        f"The conversation up to {response_id!r} is over {limit} bytes, more than the router "
        "keeps (LLMGW_ROUTER_CONVERSATION_BYTES); send the conversation in `input` instead "
        "of previous_response_id.",
        "invalid_request_error",
        "conversation_too_long",
        param="previous_response_id",
    )


def response_replica_gone(response_id: str, model: str, replica: str) -> RouterError:
    return RouterError(
        404,
        f"The response {response_id!r} was made by replica {replica[:8]} of {model}, which "
        "no longer serves (it stopped or was replaced), and only it kept the response; start "
        "again without previous_response_id, sending the conversation in `input`.",
        "invalid_request_error",
        "response_not_found",
        param="previous_response_id",
    )


def method_not_allowed(method: str, allowed: str) -> RouterError:
    return RouterError(
        405,
        f"{method} is not allowed here; use {allowed}.",
        "invalid_request_error",
        "method_not_allowed",
        [(b"allow", allowed.encode())],
    )
