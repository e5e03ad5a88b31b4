"""The floor of a proxy written in Python on the router's own parts: its server
(router/wire/server.py) and its client (router/wire/upstream.py), and nothing between
them: no key, limit, table, balance, accounting, metrics or log line.

bench/router_overhead.py's ``own+bare`` row (``--static``): what any request path in
Python pays on this machine before it does anything a router does. The router's
distance from it is what its features cost; its distance from nginx is what Python costs.
"""

from __future__ import annotations

import os

import yaml

from router.wire.upstream import Upstream


class BareProxy:
    """Every request sent to the first endpoint of LLMGW_ROUTER_STATIC's first model."""

    def __init__(self) -> None:
        with open(os.environ["LLMGW_ROUTER_STATIC"]) as file:
            endpoint = yaml.safe_load(file)["models"][0]["endpoints"][0]
        self.url = endpoint["url"]
        self.headers = [(b"authorization", b"Bearer " + endpoint["secret"].encode())]
        self.upstream = Upstream(connect_timeout=5, read_timeout=60, connections=1024)

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await self.upstream.start()
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await self.upstream.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        response = await self.upstream.request(scope["method"].encode(), self.url, scope["path"],
                                               body, self.headers)  # fmt: skip
        try:
            headers = response.headers_for_client()
            if response.is_event_stream:
                await send({"type": "http.response.start", "status": response.status,
                            "headers": headers})  # fmt: skip
                async for chunk in response.chunks():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            else:
                data = await response.read()
                headers.append((b"content-length", b"%d" % len(data)))
                await send({"type": "http.response.start", "status": response.status,
                            "headers": headers})  # fmt: skip
                await send({"type": "http.response.body", "body": data})
        finally:
            response.close()


application = BareProxy()
