"""The least a proxy in Python can do per request: the lowest floor bench/router_overhead.py
measures (``--static --routers raw+bare``).

On uvloop with httptools' C parsers and nothing else: a client's request is parsed only to
find where it ends, sent on to the engine (first endpoint of LLMGW_ROUTER_STATIC's first
model) with the engine's key, and the engine's answer is passed back byte for byte as it
arrives, parsed only to know when it is whole so the engine's connection can be reused.
No ASGI, no tasks, no futures, no headers rewritten: what remains is the event loop, the
parsers and the four socket calls a request takes. Not a product: it forwards every
request, checks nothing, and serves one client's requests one at a time.

    python -m bench.raw_proxy --port 8080
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from collections import deque
from urllib.parse import urlsplit

import httptools
import uvloop
import yaml


class EngineSide(asyncio.Protocol):
    """One kept-alive connection to the engine, carrying one client's request at a time."""

    def __init__(self, proxy: RawProxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: ClientSide | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, client: ClientSide, request: bytes) -> None:
        self.client = client
        assert self.transport is not None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is not None:
            client.transport.write(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        self.proxy.idle.append(self)
        if client is not None:
            client.answered()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.proxy.idle:
            self.proxy.idle.remove(self)
        if self.client is not None:
            self.client.transport.close()


class ClientSide(asyncio.Protocol):
    """One client's connection: each request, once whole, sent on as it came."""

    def __init__(self, proxy: RawProxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url, self.body = b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.transport.pause_reading()  # one request at a time on this connection
        body = b"".join(self.body)
        request = self.proxy.head % (self.parser.get_method(), self.url, len(body)) + body
        if self.proxy.idle:
            self.proxy.idle.pop().send(self, request)
        else:
            asyncio.ensure_future(self.proxy.connect_and_send(self, request))

    def answered(self) -> None:
        self.transport.resume_reading()


class RawProxy:
    def __init__(self, url: str, secret: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self.head = (b"%%s %%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %%d\r\n\r\n"
                     % (parts.netloc.encode(), secret.encode()))  # fmt: skip
        self.idle: deque[EngineSide] = deque()

    async def connect_and_send(self, client: ClientSide, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _transport, engine = await loop.create_connection(lambda: EngineSide(self), self.host,
                                                          self.port)  # fmt: skip
        engine.send(client, request)


async def serve(port: int) -> None:
    with open(os.environ["LLMGW_ROUTER_STATIC"]) as file:
        endpoint = yaml.safe_load(file)["models"][0]["endpoints"][0]
    proxy = RawProxy(endpoint["url"], endpoint["secret"])
    server = await asyncio.get_running_loop().create_server(lambda: ClientSide(proxy),
                                                            "127.0.0.1", port)  # fmt: skip
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args.port))


if __name__ == "__main__":
    main()
