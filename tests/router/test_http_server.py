"""The router's own HTTP/1.1 server (router/wire/server.py) with small ASGI applications,
spoken to over real loopback sockets the way clients do, including the ways they
misbehave: pipelined, slow, gone mid-answer, with heads too large or not HTTP at all."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from router.wire.cycle import status_line
from router.wire.server import KEEP_ALIVE_SECONDS, MOST_HEAD_BYTES, Server


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


@contextlib.asynccontextmanager
async def serving(app, express=None):
    """``app`` served on a free loopback port: (the Server, its port)."""
    server = Server(app, express=express)
    listener = await asyncio.get_running_loop().create_server(server.connection, "127.0.0.1", 0)
    try:
        yield server, listener.sockets[0].getsockname()[1]
    finally:
        listener.close()
        for connection in list(server.connections):
            connection.transport.close()
        for task in list(server.tasks):
            task.cancel()


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One answer off the wire: its status line, headers and body (by length or chunks)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status, *lines = head[:-4].split(b"\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(b": ")
        headers[name] = value
    if b"content-length" in headers:
        return status, headers, await reader.readexactly(int(headers[b"content-length"]))
    if headers.get(b"transfer-encoding") != b"chunked":
        return status, headers, b""
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, headers, body
        body += chunk[:-2]


async def echo(scope, receive, send):
    """Answers with the method, path, query and the whole body it was sent."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    text = b"%s %s ?%s %s" % (scope["method"].encode(), scope["path"].encode(),
                               scope["query_string"], body)  # fmt: skip
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(text)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": text})


def request(path: str = "/", body: bytes = b"", *extra: bytes, method: bytes = b"POST") -> bytes:
    headers = b"".join(h + b"\r\n" for h in extra)
    return b"%s %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n%s" % (
        method, path.encode(), len(body), headers, body)  # fmt: skip


def test_two_requests_on_one_kept_alive_connection_and_pipelined_ones_in_order():
    async def scenario():
        async with serving(echo) as (_server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request("/first?x=1", b"one"))
            status, headers, body = await read_answer(reader)
            assert status == b"HTTP/1.1 200 OK"
            assert body == b"POST /first ?x=1 one"
            assert b"date" in headers and b"connection" not in headers
            # Three at once, in one write: answered one after the other, in order.
            writer.write(request("/a", b"1") + request("/b", b"22") + request("/c%20d", b"333"))
            answers = [(await read_answer(reader))[2] for _ in range(3)]
            assert answers == [b"POST /a ? 1", b"POST /b ? 22", b"POST /c d ? 333"]
            writer.close()

    run(scenario())


def test_a_chunked_upload_and_a_large_one_reach_the_application_whole():
    big = bytes(range(256)) * 4096  # 1 MiB, past the high water: reading pauses and resumes

    async def scenario():
        async with serving(echo) as (_server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")  # fmt: skip
            assert (await read_answer(reader))[2] == b"POST /up ? abcdefg"
            writer.write(request("/big", big))
            assert (await read_answer(reader))[2] == b"POST /big ? " + big
            writer.close()

    run(scenario())


def test_expect_100_continue_is_answered_when_the_application_reads_the_body():
    async def scenario():
        async with serving(echo) as (_server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
                         b"Expect: 100-continue\r\n\r\n")  # fmt: skip
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"hello")
            assert (await read_answer(reader))[2] == b"POST /up ? hello"
            writer.close()

    run(scenario())


def test_head_204_and_http_1_0_answers():
    async def app(scope, receive, send):
        status = 204 if scope["path"] == "/none" else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"" if status == 204 else b"text"})

    async def scenario():
        async with serving(app) as (_server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request("/none"))
            status, headers, _ = await read_answer(reader)
            assert status == b"HTTP/1.1 204 No Content"
            assert b"transfer-encoding" not in headers
            # HEAD: a head and no body, though the application gave one; the connection
            # stays in step for the next request.
            writer.write(request("/", method=b"HEAD") + request("/"))
            status, headers, body = await read_answer(reader)
            assert (status, body) == (b"HTTP/1.1 200 OK", b"")
            assert b"transfer-encoding" not in headers
            assert (await read_answer(reader))[2] == b"text"
            writer.close()
            # HTTP/1.0 without keep-alive: the answer says it closes, and does.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.0\r\n\r\n")
            whole = await reader.read()
            assert whole.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"connection: close\r\n" in whole and whole.endswith(b"text")
            writer.close()

    run(scenario())


@pytest.mark.parametrize(
    ("sent", "status"),
    [(b"NOT HTTP AT ALL\r\n\r\n", b"400"),
     (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (MOST_HEAD_BYTES + 10) + b"\r\n\r\n", b"431")],
    ids=["garbage", "head-too-large"],
)  # fmt: skip
def test_what_cannot_be_read_is_refused_and_the_connection_closed(sent, status):
    async def scenario():
        async with serving(echo) as (_server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(sent)
            whole = await reader.read()
            assert whole.startswith(b"HTTP/1.1 " + status), whole[:200]
            assert b"connection: close" in whole
            writer.close()

    run(scenario())


def test_an_application_that_fails_gets_its_client_a_500_or_a_cut_answer():
    async def app(scope, receive, send):
        if scope["path"] == "/silent":
            return  # answered nothing
        if scope["path"] == "/inject":  # a header value that would start headers of its own
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"x-a", b"1\r\nset-cookie: evil=1")]})  # fmt: skip
        if scope["path"] == "/midway":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise ValueError("broken")

    async def scenario():
        async with serving(app) as (_server, port):
            for path in ("/fails", "/silent", "/inject"):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request(path))
                whole = await reader.read()
                assert whole.startswith(b"HTTP/1.1 500 Internal Server Error"), (path, whole)
                assert b"evil" not in whole
                writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request("/midway"))
            whole = await reader.read()  # the connection closes without the last chunk
            assert whole.startswith(b"HTTP/1.1 200 OK") and whole.endswith(b"4\r\npart\r\n")
            writer.close()

    run(scenario())


def test_a_client_that_leaves_mid_answer_is_told_to_a_waiting_receive():
    async def scenario():
        told = asyncio.get_running_loop().create_future()

        async def app(scope, receive, send):
            await receive()  # the body
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            told.set_result(await receive())  # waits until the client is gone

        async with serving(app) as (_server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request("/stream"))
            await reader.readuntil(b"first\r\n")
            writer.close()
            assert await told == {"type": "http.disconnect"}

    run(scenario())


def test_a_slow_reader_holds_the_writer_back_instead_of_filling_memory():
    chunk = b"x" * 65536
    most_buffered = 0

    async def scenario():
        nonlocal most_buffered

        async def app(scope, receive, send):
            nonlocal most_buffered
            await send({"type": "http.response.start", "status": 200, "headers": []})
            connection = next(iter(server.connections))
            for _ in range(200):  # 12.5 MiB, far more than the socket buffers hold
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                most_buffered = max(most_buffered, connection.transport.get_write_buffer_size())
            await send({"type": "http.response.body", "body": b""})

        async with serving(app) as (server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**20)
            writer.write(request("/"))
            received = 0
            await reader.readuntil(b"\r\n\r\n")
            while received < 200 * len(chunk):
                data = await reader.read(65536)
                assert data
                received += len(data)
                await asyncio.sleep(0.001)  # a slow client
            writer.close()

    run(scenario())
    # Without back-pressure all 12.5 MiB would sit in the transport's buffer.
    assert 0 < most_buffered < 4 * 2**20


def test_idle_connections_are_swept_and_a_stop_closes_each_after_its_answer():
    async def scenario():
        release = asyncio.Event()

        async def app(scope, receive, send):
            if scope["path"] == "/slow":
                await release.wait()
            await echo(scope, receive, send)

        async with serving(app) as (server, port):
            idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
            idle_writer.write(request("/", b"x"))
            await read_answer(idle_reader)
            for connection in server.connections:
                connection.idle_since -= KEEP_ALIVE_SECONDS + 1
            server.sweep()
            assert await idle_reader.read() == b""  # closed: idle past the keep-alive
            idle_writer.close()

            idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
            busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", port)
            idle_writer.write(request("/", b"x"))
            await read_answer(idle_reader)
            busy_writer.write(request("/slow", b"y"))
            while not any(c.answering for c in server.connections):
                await asyncio.sleep(0.01)
            server.stop_accepting()
            assert await idle_reader.read() == b""  # idle: closed at once
            release.set()
            status, headers, body = await read_answer(busy_reader)  # busy: answered, then closed
            assert (body, headers[b"connection"]) == (b"POST /slow ? y", b"close")
            assert await busy_reader.read() == b""
            idle_writer.close()
            busy_writer.close()

    run(scenario())


def test_an_express_way_answers_whole_requests_from_callbacks_and_tasks_the_rest():
    """What the router's express way stands on (router/forward/express.py): a request whose
    body is here is offered before any task is made; one it declines and one whose body
    comes later are answered in a task as before."""
    offered = []

    def express(cycle):
        offered.append(cycle.scope["path"])
        if cycle.scope["path"] != "/fast":
            return False
        body = b"fast " + b"".join(cycle.body)
        cycle.start_answer(200, [(b"content-length", str(len(body)).encode())])
        cycle.send_body(body, False)
        return True

    async def scenario():
        async with serving(echo, express) as (server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request("/fast", b"one"))
            assert (await read_answer(reader))[2] == b"fast one"
            assert not server.tasks
            writer.write(request("/slow", b"two"))  # declined: the application's, in a task
            assert (await read_answer(reader))[2] == b"POST /slow ? two"
            whole = request("/fast", b"later")
            writer.write(whole[:-3])  # its body comes in two reads: a task reads the rest
            while not server.tasks:  # the head and part of the body read, the task made
                await asyncio.sleep(0.001)
            writer.write(whole[-3:])
            assert (await read_answer(reader))[2] == b"POST /fast ? later"
            # Pipelined: the first answered at once, so the second is offered in turn.
            writer.write(request("/fast", b"a") + request("/fast", b"b"))
            assert [(await read_answer(reader))[2] for _ in range(2)] == [b"fast a", b"fast b"]
            assert offered == ["/fast", "/slow", "/fast", "/fast"]
            writer.close()

    run(scenario())


def test_every_status_has_its_line():
    assert status_line(429) == b"HTTP/1.1 429 Too Many Requests\r\n"
    assert status_line(599) == b"HTTP/1.1 599 \r\n"
