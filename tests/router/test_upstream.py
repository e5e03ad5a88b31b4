"""The outbound client against small asyncio servers that misbehave on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from router.wire.connection import UpstreamBroken
from router.wire.upstream import Upstream, UpstreamUnreachable, encode_headers

BODY = b'{"model": "m"}'


async def serve(handler):
    """A TCP server on a free port running ``handler(reader, writer)`` per connection."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
            b"content-length")
    )  # fmt: skip
    return head, await reader.readexactly(length)


def answer(body: bytes, *extra: bytes) -> bytes:
    headers = b"".join(h + b"\r\n" for h in extra)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), headers, body)


async def client(**options) -> Upstream:
    upstream = Upstream(
        connect_timeout=options.get("connect_timeout", 5),
        read_timeout=options.get("read_timeout", 30),
        connections=options.get("connections", 8),
    )
    await upstream.start()
    return upstream


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_requests_reuse_one_kept_alive_connection_and_carry_headers():
    async def scenario():
        connections = 0
        requests = []

        async def handler(reader, writer):
            nonlocal connections
            connections += 1
            while True:
                try:
                    head, body = await read_request(reader)
                except asyncio.IncompleteReadError:
                    return
                requests.append((head, body))
                writer.write(answer(b"ok", b"Content-Type: application/json"))
                await writer.drain()

        server, url = await serve(handler)
        upstream = await client()
        for _ in range(3):
            response = await upstream.post(url, "/v1/x", BODY, [(b"authorization", b"Bearer s")])
            assert response.status == 200
            assert await response.read() == b"ok"
            assert not response.is_event_stream
            response.close()
        await upstream.close()
        server.close()
        return connections, requests

    connections, requests = run(scenario())
    assert connections == 1
    head, body = requests[0]
    assert head.startswith(b"POST /v1/x HTTP/1.1\r\n")
    assert b"authorization: Bearer s\r\n" in head
    assert body == BODY


def test_a_connection_the_engine_closed_while_idle_is_not_reused():
    async def scenario():
        async def handler(reader, writer):
            await read_request(reader)
            writer.write(answer(b"once"))
            await writer.drain()
            writer.close()  # the engine's keep-alive ran out

        server, url = await serve(handler)
        upstream = await client()
        for _ in range(2):
            response = await upstream.post(url, "/", BODY, [])
            assert await response.read() == b"once"
            response.close()
            # As after idle time: the engine's close has arrived before the next request.
            for _ in range(1000):
                if all(c.closed for idle in upstream._idle.values() for c in idle):
                    break
                await asyncio.sleep(0.01)
        server.close()

    run(scenario())


def test_chunked_and_close_delimited_answers_are_read_whole():
    async def scenario():
        async def chunked(reader, writer):
            await read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
            await writer.drain()

        async def until_close(reader, writer):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
            await writer.drain()
            writer.close()

        results = []
        for handler in (chunked, until_close):
            server, url = await serve(handler)
            upstream = await client()
            response = await upstream.post(url, "/", BODY, [])
            results.append((response.is_event_stream, await response.read()))
            response.close()
            server.close()
        return results

    assert run(scenario()) == [(True, b"hello world"), (False, b"until the end")]


def test_a_big_answer_to_a_slow_reader_arrives_whole():
    size = 3 * 1024 * 1024  # over the high-water mark, so reading pauses and resumes

    async def scenario():
        async def handler(reader, writer):
            await read_request(reader)
            writer.write(answer(b"x" * size))
            await writer.drain()

        server, url = await serve(handler)
        upstream = await client()
        response = await upstream.post(url, "/", BODY, [])
        received = 0
        async for data in response.chunks():
            received += len(data)
            await asyncio.sleep(0.001)
        response.close()
        server.close()
        return received

    assert run(scenario()) == size


def test_nothing_listening_is_unreachable_connect():
    async def scenario():
        server, url = await serve(lambda r, w: None)
        server.close()
        await server.wait_closed()
        upstream = await client()
        with pytest.raises(UpstreamUnreachable) as refused:
            await upstream.post(url, "/", BODY, [])
        return refused.value

    error = run(scenario())
    assert error.kind == "connect"
    assert "cannot connect to http://127.0.0.1:" in str(error)


def test_an_engine_hanging_up_before_answering_is_unreachable_disconnected():
    async def scenario():
        async def handler(reader, writer):
            await read_request(reader)
            writer.close()

        server, url = await serve(handler)
        upstream = await client()
        with pytest.raises(UpstreamUnreachable) as refused:
            await upstream.post(url, "/", BODY, [])
        server.close()
        return refused.value.kind

    assert run(scenario()) == "disconnected"


def test_silence_past_the_read_timeout_is_unreachable_timeout():
    async def scenario():
        async def handler(reader, writer):
            await read_request(reader)
            await asyncio.sleep(30)

        server, url = await serve(handler)
        upstream = await client(read_timeout=0.2)
        with pytest.raises(UpstreamUnreachable) as refused:
            await upstream.post(url, "/", BODY, [])
        server.close()
        return refused.value.kind

    assert run(scenario()) == "timeout"


def test_an_answer_broken_off_midway_raises_broken():
    async def scenario():
        async def handler(reader, writer):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
            await writer.drain()
            writer.close()

        server, url = await serve(handler)
        upstream = await client()
        response = await upstream.post(url, "/", BODY, [])
        with pytest.raises(UpstreamBroken, match="closed the connection mid-answer"):
            await response.read()
        response.close()
        server.close()

    run(scenario())


def test_closing_an_unfinished_answer_hangs_up_on_the_engine():
    async def scenario():
        hung_up = asyncio.Event()

        async def handler(reader, writer):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await writer.drain()
            if await reader.read() == b"":
                hung_up.set()

        server, url = await serve(handler)
        upstream = await client()
        response = await upstream.post(url, "/", BODY, [])
        async for _data in response.chunks():
            break
        response.close()
        await asyncio.wait_for(hung_up.wait(), 10)
        server.close()

    run(scenario())


def test_an_engine_behind_a_path_gets_the_path_before_v1():
    async def scenario():
        heads = []

        async def handler(reader, writer):
            head, _body = await read_request(reader)
            heads.append(head)
            writer.write(answer(b"ok"))
            await writer.drain()

        server, url = await serve(handler)
        upstream = await client()
        response = await upstream.post(url + "/engine-a/", "/v1/x", BODY, [])
        await response.read()
        response.close()
        server.close()
        return heads[0]

    assert run(scenario()).startswith(b"POST /engine-a/v1/x HTTP/1.1\r\n")


def test_an_address_that_is_no_url_is_unreachable_not_a_crash():
    async def scenario():
        upstream = await client()
        with pytest.raises(UpstreamUnreachable) as refused:
            await upstream.post("tcp://nowhere", "/v1/x", BODY, [])
        return refused.value.kind

    assert run(scenario()) == "connect"


def test_a_kept_alive_connection_the_engine_drops_on_reuse_is_retried_on_a_new_one():
    # llama-server says keep-alive, then closes right after a streamed answer; a request
    # that picks up that connection must not fail for it.
    async def scenario():
        connections = 0

        async def handler(reader, writer):
            nonlocal connections
            connections += 1
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(answer(b'{"ok": true}', b"Connection: keep-alive"))
            await writer.drain()
            # Take the next request, then hang up without answering it.
            with contextlib.suppress(asyncio.IncompleteReadError):
                await reader.readuntil(b"\r\n\r\n")
            writer.close()

        server, url = await serve(handler)
        upstream = await client()
        try:
            answers = []
            for _ in range(3):
                response = await upstream.post(url, "/v1/chat", BODY, [])
                answers.append(await response.read())
                response.close()
        finally:
            await upstream.close()
            server.close()
        return answers, connections

    answers, connections = run(scenario())
    assert answers == [b'{"ok": true}'] * 3
    assert connections >= 3  # each reuse was refused and redone on a fresh connection


def test_engine_connections_give_up_on_a_silent_host_in_seconds():
    # A cut link leaves no one to close the connection: keepalive probes, answered by
    # the engine host's kernel however busy the engine is, are what notice.
    async def scenario():
        async def handler(reader, writer):
            await read_request(reader)
            writer.write(answer(b"ok"))
            await writer.drain()
            await reader.read()

        server, url = await serve(handler)
        upstream = await client(read_timeout=600)
        response = await upstream.post(url, "/v1/x", BODY, [])
        await response.read()
        response.close()  # back to the pool
        [connection] = [c for idle in upstream._idle.values() for c in idle]
        sock = connection.transport.get_extra_info("socket")
        options = {
            "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "probes": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "unacknowledged_ms": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }
        await upstream.close()
        server.close()
        return options

    options = run(scenario())
    assert options["keepalive"] == 1
    # Dead within ~10 s, not the 600 s read timeout.
    assert options["idle"] + options["interval"] * options["probes"] <= 10
    assert options["unacknowledged_ms"] <= 10_000


def test_headers_go_one_a_line_and_one_with_a_line_break_is_left_out():
    usual = [(b"x-request-id", b"abc"), (b"content-type", b"application/json")]
    assert encode_headers(usual) == b"x-request-id: abc\r\ncontent-type: application/json\r\n"
    forged = [
        (b"x-request-id", b"abc"),
        (b"x-note", b"a\r\nauthorization: Bearer stolen"),  # a value that writes a header
        (b"x-bad\nname", b"b"),
        (b"x-cr", b"c\rd"),
        (b"content-type", b"application/json"),
    ]
    assert encode_headers(forged) == usual_bytes(usual)
    assert encode_headers([]) == b""


def usual_bytes(headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(name + b": " + value + b"\r\n" for name, value in headers)
