"""Uploads (audio to transcribe): the model is read from the form, and the file streams
through to the engine as it arrives, never held whole in the router.

The router reads the body only until the ``model`` field is whole (clients send their
fields before the file; OpenAI's SDK does), up to ``LLMGW_ROUTER_MAX_BODY``. The rest goes
to the engine chunk by chunk, up to ``LLMGW_ROUTER_MAX_UPLOAD`` in all. Once the rest has
begun to go out, no other replica can be asked: a replica that fails then fails the
request, with the reason.
"""

from __future__ import annotations

import json
from typing import Any

from router import errors
from router.intake.call import Receive, Upload, resolve
from router.table.keys import Caller
from router.table.routes import ModelRoute, RoutingTable


async def read_upload(
    receive: Receive, content_length: bytes | None, content_type: bytes | None,
    head_limit: int, upload_limit: int,
) -> Upload | None:  # fmt: skip
    """Read an upload as far as its ``model`` field; None when the client left first."""
    boundary = _boundary_of(content_type)
    try:
        length = int(content_length or b"")
    except ValueError:
        raise errors.RouterError(
            411, "An upload needs a Content-Length (the router streams it to the engine).",
            "invalid_request_error", "length_required",
        ) from None  # fmt: skip
    if length > upload_limit:
        raise errors.RouterError(
            413, f"The upload is over {upload_limit} bytes (LLMGW_ROUTER_MAX_UPLOAD).",
            "invalid_request_error", "request_too_large",
        )  # fmt: skip
    head = b""
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        head += message.get("body", b"")
        more = bool(message.get("more_body"))
        if form_field(head, boundary, b"model", whole=False) is not None or len(head) > head_limit:
            break
    # However the client's bytes arrived, the field must end within the first head_limit.
    if len(head) > head_limit and form_field(head[:head_limit], boundary, b"model",
                                             whole=False) is None:  # fmt: skip
        raise errors.malformed(
            f"No `model` form field in the upload's first {head_limit} bytes: send the "
            "`model` field before the file.",
            "missing_model",
        )
    return Upload(head, receive, max(length, len(head)))


def resolve_upload(
    table: RoutingTable, upload: Upload, content_type: bytes | None, caller: Caller
) -> tuple[ModelRoute, dict[str, Any]]:
    """Like ``call.resolve``, for an upload: the model is a form field."""
    model = form_field(upload.head, _boundary_of(content_type), b"model", whole=True)
    if model is None:
        raise errors.malformed(
            "The upload has no `model` form field; send the model's name as a field of the "
            "multipart/form-data body, before the file.",
            "missing_model",
        )
    return resolve(table, json.dumps({"model": model}).encode(), caller)


def form_field(body: bytes, boundary: bytes, name: bytes, *, whole: bool) -> str | None:
    """The value of the text field ``name`` in ``body`` (the start of a multipart body
    unless ``whole``), once its part has ended; None until then, or if there is none."""
    wanted = b'name="' + name + b'"'
    parts = body.split(b"--" + boundary)
    if not whole:
        parts = parts[:-1]  # the last part may not have ended yet
    for part in parts:
        head, separator, value = part.partition(b"\r\n\r\n")
        if not separator:
            continue
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-disposition:") and wanted in line:
                if b"filename=" in line:
                    break  # a file named "model" is not the field
                return value.removesuffix(b"\r\n").decode("utf-8", "replace")
    return None


def _boundary_of(content_type: bytes | None) -> bytes:
    if content_type is None or not content_type.lower().startswith(b"multipart/form-data"):
        raise errors.malformed(
            "This endpoint takes an upload: send multipart/form-data with the file and a "
            "`model` field.",
            "invalid_content_type",
        )
    for parameter in content_type.split(b";")[1:]:
        key, _, value = parameter.strip().partition(b"=")
        if key.lower() == b"boundary" and value:
            return value.strip(b'"')
    raise errors.malformed(
        "The multipart/form-data content type names no boundary.", "invalid_content_type"
    )
