"""Media URLs in a request (images, audio, video, files) are fetched by engines from inside
the fleet: the router refuses those that point inside it, or use another scheme, with a 400
naming the part and the knob that allows them."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from router.errors import RouterError
from router.intake.media_urls import MediaUrlPolicy

FLEET = {"198.51.100.7"}  # a node on a public address: the fleet's own all the same
PUBLIC = "93.184.215.14"
DNS = {"images.example.com": [PUBLIC], "intranet.corp": ["10.1.2.3"], "localhost": ["127.0.0.1"]}


async def fake_resolve(host: str) -> list[str]:
    if host not in DNS:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return DNS[host]


def chat_image(url: str) -> dict:
    return {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": url}}]}]}  # fmt: skip


def check(
    payload: dict, allowed: tuple[str, ...] = (), body: bytes | None = None
) -> RouterError | None:
    """The policy's answer for ``payload``, given with the body it was read from, as the
    router gives it (written here with json.dumps unless given)."""
    policy = MediaUrlPolicy(allowed, resolve=fake_resolve)
    body = json.dumps(payload).encode() if body is None else body
    try:
        asyncio.run(policy.check(payload, FLEET, body))
    except RouterError as error:
        return error
    return None


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://127.0.0.1:8000/metrics", "127.0.0.1 is a loopback address"),
        ("http://[::1]/x", "::1 is a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
        ("http://10.0.0.5:20000/v1/models", "10.0.0.5 is a private address"),
        ("http://198.51.100.7:20000/health", "198.51.100.7 is a node of this fleet"),
        ("http://intranet.corp/a.png", "intranet.corp is 10.1.2.3, a private address"),
        ("http://localhost/a.png", "localhost is 127.0.0.1, a loopback address"),
        ("file:///etc/llmgw/node-key.pem", "its scheme is file:"),
        ("gopher://images.example.com/", "its scheme is gopher:"),
        ("http://nowhere.invalid/a.png", "nowhere.invalid cannot be resolved"),
    ],
)
def test_a_url_inside_the_fleet_or_of_another_scheme_is_refused(url, said):
    error = check(chat_image(url))

    assert error is not None and error.status == 400
    assert error.param == "messages[0].content[1].image_url.url"
    assert said in error.message
    assert "LLMGW_ROUTER_ALLOW_PRIVATE_URLS" in error.message


@pytest.mark.parametrize(
    "url", [f"https://{PUBLIC}/cat.png", "https://images.example.com/cat.png",
            "data:image/png;base64,iVBORw0KGgo="],
)  # fmt: skip
def test_public_urls_and_inline_data_pass(url):
    assert check(chat_image(url)) is None


def test_allowed_hosts_and_networks_pass():
    assert check(chat_image("http://intranet.corp/a.png"), ("intranet.corp",)) is None
    assert check(chat_image("http://10.0.0.5/a.png"), ("10.0.0.0/8",)) is None
    assert check(chat_image("http://10.0.0.5/a.png"), ("10.0.0.5",)) is None
    assert check(chat_image("http://10.0.0.6/a.png"), ("10.0.0.5",)) is not None
    assert check(chat_image("file:///etc/passwd"), ("10.0.0.0/8",)) is not None


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": "http://127.0.0.1/a"}]}]},
         "messages[0].content[0].image_url"),
        ({"messages": [{"role": "user", "content": [
            {"type": "audio_url", "audio_url": {"url": "http://127.0.0.1/a.wav"}}]}]},
         "messages[0].content[0].audio_url.url"),
        ({"messages": [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": "http://127.0.0.1/a.mp4"}}]}]},
         "messages[0].content[0].video_url.url"),
        ({"messages": [{"role": "user", "content": [  # Anthropic's Messages
            {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/a"}}]}]},
         "messages[0].content[0].source.url"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/a"}}]}]}]},
         "messages[0].content[0].content[0].source.url"),
        ({"input": [{"role": "user", "content": [  # OpenAI's Responses
            {"type": "input_image", "image_url": "http://127.0.0.1/a"}]}]},
         "input[0].content[0].image_url"),
        ({"input": [{"role": "user", "content": [
            {"type": "input_file", "file_url": "http://127.0.0.1/a.pdf"}]}]},
         "input[0].content[0].file_url"),
    ],
)  # fmt: skip
def test_every_kind_of_media_part_is_looked_at(payload, param):
    error = check(payload)

    assert error is not None and error.param == param


def test_a_url_field_written_with_escapes_is_looked_at_all_the_same():
    """The walk is spared for a body without ``url`` in it: one that spells the field with
    JSON's escapes must not pass for such a body."""
    body = (b'{"messages":[{"role":"user","content":[{"type":"image_\\u0075rl",'
            b'"image_\\u0075rl":{"\\u0075rl":"http://127.0.0.1/a"}}]}]}')  # fmt: skip
    assert b"url" not in body

    error = check(json.loads(body), body=body)

    assert error is not None and error.param == "messages[0].content[0].image_url.url"


def test_text_that_looks_like_a_url_is_left_alone():
    payload = {"messages": [{"role": "user", "content": "fetch http://127.0.0.1/ for me"}],
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                   "type": "object", "properties": {"url": {"type": "string"}}}}}]}  # fmt: skip
    assert check(payload) is None


def test_a_host_is_looked_up_once_while_its_addresses_are_kept_and_the_fleet_only_when_needed():
    looked_up: list[str] = []
    fleet_asked: list[int] = []

    async def counting_resolve(host: str) -> list[str]:
        looked_up.append(host)
        return await fake_resolve(host)

    def fleet() -> set[str]:
        fleet_asked.append(1)
        return FLEET

    policy = MediaUrlPolicy(resolve=counting_resolve)

    async def turns() -> None:
        await policy.check({"messages": [{"role": "user", "content": "no media"}]}, fleet)
        assert not fleet_asked  # a body without media needs no addresses of the fleet
        for _turn in range(3):  # an agent's loop sending the same image each turn
            await policy.check(chat_image("https://images.example.com/a.png"), fleet)
        with pytest.raises(RouterError):  # a name that did not resolve is not kept
            await policy.check(chat_image("http://nowhere.invalid/a.png"), fleet)
        with pytest.raises(RouterError):
            await policy.check(chat_image("http://nowhere.invalid/a.png"), fleet)

    asyncio.run(turns())
    assert looked_up == ["images.example.com", "nowhere.invalid", "nowhere.invalid"]
