"""Stand-in engines in the test's own event loop, and a router in front of them, in-process.

Each stand-in answers an OpenAI request with the words ``w0 w1 … w{TOTAL-1}`` (one per
event), carrying on from the words already in the request (a final assistant message
with ``continue_final_message``, or the end of a completion's prompt), as llama-server
and vLLM do. A ``Script`` shared by the stand-ins says, request by request in the order
they arrive (whichever stand-in gets it), how the answer goes: whole, or broken off
after some words by a reset connection or by silence. No sleeps: a silent stand-in
waits until the router hangs up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import yaml

from router.app import Router
from router.config import RouterConfig
from router.table.sources import StaticSource

TOTAL = 12  # words in a whole answer
PROMPT_TOKENS = 10  # what a stand-in counts for a request's own prompt
_WORD = re.compile(r"w\d+ ")


@dataclass
class Turn:
    """How one request is answered: whole, or broken off after ``words`` words."""

    words: int | None = None  # None: the whole answer
    how: str = "reset"  # "reset" (the connection), "silent" (nothing more is sent)
    tool_call: bool = False  # the answer starts with a tool call delta
    on_break: Callable[[], None] | None = None  # runs just before the answer breaks off


@dataclass
class Seen:
    engine: str
    path: str
    body: dict[str, Any]


@dataclass
class Script:
    """The turns of the requests in the order they arrive; past its end, answers are whole."""

    turns: list[Turn] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    def next_turn(self) -> Turn:
        index = len(self.seen) - 1
        return self.turns[index] if index < len(self.turns) else Turn()


class StandIn:
    """One stand-in engine on a port of its own."""

    def __init__(self, name: str, script: Script, created: int) -> None:
        self.name = name
        self.script = script
        self.created = created
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> StandIn:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        lines = head.decode().split("\r\n")
        path = lines[0].split()[1]
        length = next(int(v) for k, _, v in (x.partition(":") for x in lines[1:])
                      if k.lower() == "content-length")  # fmt: skip
        body = json.loads(await reader.readexactly(length))
        if path in ("/tokenize", "/apply-template"):
            # /tokenize as llama-server's (a word of the stand-ins' is a token); no templates.
            count = len(_WORD.findall(body.get("content") or ""))
            answer = json.dumps({"tokens": list(range(count))}).encode()
            status = b"200 OK" if path == "/tokenize" else b"404 Not Found"
            head = b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n" % (status, len(answer))
            writer.write(head + answer)
            await writer.drain()
            await self._serve(reader, writer)  # the connection is kept alive
            return
        self.script.seen.append(Seen(self.name, path, body))
        turn = self.script.next_turn()
        with contextlib.suppress(ConnectionError):
            if body.get("stream"):
                await self._stream(writer, path, body, turn)
            else:
                await self._whole(writer, path, body, turn)

    # -- answers ------------------------------------------------------------------------

    def _words(self, path: str, body: dict[str, Any]) -> tuple[int, list[str], str]:
        """The words already given, those to give now, and the finish reason."""
        if path.endswith("/chat/completions"):
            last = body["messages"][-1]
            given = last["content"] if last["role"] == "assistant" else ""
        else:
            given = body["prompt"]
        start = len(_WORD.findall(given))
        end = TOTAL
        budget = body.get("max_tokens")
        if budget is not None and start + budget < TOTAL:
            end = start + budget
        return start, [f"w{i} " for i in range(start, end)], "stop" if end == TOTAL else "length"

    def _chunk(self, path: str, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chat = path.endswith("/chat/completions")
        chunk = {
            "id": f"cmpl-{self.name}", "created": self.created, "model": "m",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "system_fingerprint": self.name, "choices": choices, **extra,
        }  # fmt: skip
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    def _piece(self, path: str, text: str, finish: str | None = None) -> dict[str, Any]:
        if path.endswith("/chat/completions"):
            return {"index": 0, "delta": {"content": text} if text else {},
                    "finish_reason": finish}  # fmt: skip
        return {"index": 0, "text": text, "finish_reason": finish}

    async def _stream(self, writer, path: str, body: dict[str, Any], turn: Turn) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")  # fmt: skip

        async def send(data: bytes) -> None:
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()

        start, words, finish = self._words(path, body)
        if path.endswith("/chat/completions"):
            await send(self._chunk(path, [{"index": 0, "delta": {"role": "assistant",
                                           "content": ""}, "finish_reason": None}]))  # fmt: skip
        if turn.tool_call:
            call = {"index": 0, "id": "call-1", "type": "function",
                    "function": {"name": "lookup", "arguments": ""}}  # fmt: skip
            await send(self._chunk(path, [{"index": 0, "delta": {"tool_calls": [call]},
                                           "finish_reason": None}]))  # fmt: skip
        for sent, word in enumerate(words):
            if turn.words is not None and sent == turn.words:
                await self._break(writer, turn)
                return
            await send(self._chunk(path, [self._piece(path, word)]))
        await send(self._chunk(path, [self._piece(path, "", finish)]))
        if (body.get("stream_options") or {}).get("include_usage"):
            prompt = PROMPT_TOKENS + start
            usage = {"prompt_tokens": prompt, "completion_tokens": len(words),
                     "total_tokens": prompt + len(words)}  # fmt: skip
            await send(self._chunk(path, [], usage=usage))
        await send(b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def _whole(self, writer, path: str, body: dict[str, Any], turn: Turn) -> None:
        start, words, finish = self._words(path, body)
        text = "".join(words)
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            if path.endswith("/chat/completions")
            else {"index": 0, "text": text, "finish_reason": finish}
        )
        answer = json.dumps({
            "id": f"cmpl-{self.name}", "object": "chat.completion", "created": self.created,
            "model": "m", "system_fingerprint": self.name, "choices": [choice],
            "usage": {"prompt_tokens": PROMPT_TOKENS + start, "completion_tokens": len(words),
                      "total_tokens": PROMPT_TOKENS + start + len(words)},
        }).encode()  # fmt: skip
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(answer))  # fmt: skip
        if turn.words is not None:  # the head and part of the body, then the engine dies
            writer.write(answer[: len(answer) // 2])
            await self._break(writer, turn)
            return
        writer.write(answer)
        await writer.drain()
        writer.close()

    async def _break(self, writer, turn: Turn) -> None:
        await writer.drain()
        if turn.on_break is not None:
            turn.on_break()
        if turn.how == "silent":
            await asyncio.Event().wait()  # until the router hangs up (the task is cancelled)
        writer.transport.abort()  # a reset, as from an engine killed mid-answer


class Bench:
    """A router in this event loop over stand-ins, and a client for it."""

    def __init__(self, router: Router, engines: list[StandIn], script: Script) -> None:
        self.router = router
        self.engines = engines
        self.script = script
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=router), base_url="http://router", timeout=30
        )

    async def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self.client.post(path, json={"model": "m", **body})

    async def metrics(self) -> str:
        return (await self.client.get("/metrics")).text

    def set_engines(self, engine: str) -> None:
        """Give every endpoint an engine name, as a table that knows them would."""
        route = self.router.table.routes["m"]
        self._route(replace(route, endpoints=tuple(replace(e, engine=engine)
                                                   for e in route.endpoints)))  # fmt: skip

    def keep_endpoints(self, count: int) -> tuple:
        """Leave the first ``count`` endpoints in the table; return those it had."""
        route = self.router.table.routes["m"]
        self._route(replace(route, endpoints=route.endpoints[:count]))
        return route.endpoints

    def put_endpoints(self, endpoints: tuple) -> None:
        self._route(replace(self.router.table.routes["m"], endpoints=endpoints))

    def _route(self, route) -> None:
        tables = self.router.tables
        tables.table = replace(tables.table, routes={"m": route}, by_name={"m": route})

    async def close(self) -> None:
        await self.client.aclose()
        await self.router.stop()
        for engine in self.engines:
            await engine.close()


async def start_bench(tmp_path: Path, turns: list[Turn], engines: int = 2, **config: Any) -> Bench:
    """Stand-ins named A, B, C… behind a router in router-only mode (no keys)."""
    script = Script(turns)
    started = [await StandIn(chr(65 + n), script, 1000 * (n + 1)).start() for n in range(engines)]
    static = tmp_path / "static.yaml"
    static.write_text(yaml.safe_dump({
        "models": [{"name": "m", "endpoints": [{"url": e.url} for e in started]}], "auth": False,
    }))  # fmt: skip
    settings = RouterConfig(static_path=str(static), refresh_seconds=3600, table_file="", **config)
    router = Router(settings, StaticSource(str(static)))
    await router.start()
    return Bench(router, started, script)


def events(text: str) -> list[Any]:
    """The payloads of a stream's ``data:`` lines, [DONE] as the string."""
    found = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            found.append(data if data == "[DONE]" else json.loads(data))
    return found
