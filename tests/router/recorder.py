#!/usr/bin/env python3
"""A recording pass-through in front of a real engine, so a test sees what the engine was
asked (llama-server does not say):

    recorder.py --to http://127.0.0.1:PORT [--port 0]

Every request is forwarded as it came and its answer relayed as the engine sends it,
streamed or not. ``GET /_state`` lists the requests seen (``path``, ``method``, ``body``
parsed as JSON when it is JSON); ``POST /_reset`` forgets them. The first line on stdout
is ``listening on PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import aiohttp
from aiohttp import web

HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class Recorder:
    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.requests: list[dict] = []
        self.session: aiohttp.ClientSession | None = None

    async def state(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": self.requests})

    async def reset(self, request: web.Request) -> web.Response:
        self.requests.clear()
        return web.json_response({"ok": True})

    async def forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.requests.append({"path": request.path, "method": request.method, "body": body})
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with self.session.request(
            request.method, self.target + request.path_qs, data=raw, headers=headers
        ) as upstream:
            answer = web.StreamResponse(status=upstream.status)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP:
                    answer.headers[name] = value
            await answer.prepare(request)
            async for piece in upstream.content.iter_any():
                await answer.write(piece)
            await answer.write_eof()
            return answer


async def serve(args: argparse.Namespace) -> None:
    recorder = Recorder(args.to)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/_state", recorder.state)
    app.router.add_post("/_reset", recorder.reset)
    app.router.add_route("*", "/{tail:.*}", recorder.forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    print(f"listening on {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--to", required=True)
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
