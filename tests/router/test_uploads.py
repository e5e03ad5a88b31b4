"""Reading an upload only as far as its model, and the rest as it comes."""

from __future__ import annotations

import pytest

from router.errors import RouterError
from router.intake.call import ClientLeft
from router.intake.uploads import read_upload

pytestmark = pytest.mark.asyncio

BOUNDARY = b"xyz"
TYPE = b"multipart/form-data; boundary=" + BOUNDARY
FIELDS = (
    b'--xyz\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n'
    b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
)
END = b"\r\n--xyz--\r\n"


def client(*chunks: bytes, leaves: bool = False):
    """An ASGI receive that hands out ``chunks`` one message each, as a server would."""
    messages = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1 or leaves}
        for i, chunk in enumerate(chunks)
    ]
    if leaves:
        messages.append({"type": "http.disconnect"})
    taken: list[dict] = []

    async def receive() -> dict:
        taken.append(messages[len(taken)])
        return taken[-1]

    return receive, taken


async def test_only_the_part_holding_the_model_is_read_and_the_rest_streams_after():
    file_parts = [b"a" * 1000, b"b" * 1000, b"c" * 1000 + END]
    receive, taken = client(FIELDS, *file_parts)
    length = len(FIELDS) + sum(map(len, file_parts))
    upload = await read_upload(receive, str(length).encode(), TYPE, 100_000, 10**9)
    assert upload is not None and upload.head == FIELDS and len(taken) == 1
    assert not upload.started
    rest = [chunk async for chunk in upload.rest()]
    assert rest == file_parts and upload.started


async def test_a_client_that_leaves_mid_upload_is_noticed():
    receive, _taken = client(FIELDS, b"a" * 10, leaves=True)
    upload = await read_upload(receive, b"100000", TYPE, 100_000, 10**9)
    assert upload is not None
    with pytest.raises(ClientLeft):
        _ = [chunk async for chunk in upload.rest()]


@pytest.mark.parametrize(
    ("length", "content_type", "status", "words"),
    [
        (None, TYPE, 411, "needs a Content-Length"),
        (b"2000000000", TYPE, 413, "LLMGW_ROUTER_MAX_UPLOAD"),
        (b"10", b"application/json", 400, "send multipart/form-data"),
        (b"10", b"multipart/form-data", 400, "names no boundary"),
    ],
)
async def test_an_upload_the_router_cannot_stream_is_refused_saying_why(
    length, content_type, status, words
):
    receive, taken = client(FIELDS)
    with pytest.raises(RouterError) as refused:
        await read_upload(receive, length, content_type, 100_000, 10**9)
    assert refused.value.status == status and words in refused.value.message
    assert taken == []  # refused before reading any of it


@pytest.mark.parametrize("chunks", [1, 3])
async def test_a_model_field_past_the_limit_is_refused_however_the_bytes_arrive(chunks):
    late = (
        b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        + b"a" * 5000
        + b'\r\n--xyz\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper'
        + END
    )
    size = -(-len(late) // chunks)
    receive, _taken = client(*(late[i : i + size] for i in range(0, len(late), size)))
    with pytest.raises(RouterError) as refused:
        await read_upload(receive, str(len(late)).encode(), TYPE, 1000, 10**9)
    assert refused.value.status == 400 and "before the file" in refused.value.message


async def test_a_model_field_first_in_one_large_message_is_taken():
    whole = FIELDS + b"a" * 5000 + END
    receive, _taken = client(whole)
    upload = await read_upload(receive, str(len(whole)).encode(), TYPE, 1000, 10**9)
    assert upload is not None and upload.head == whole
