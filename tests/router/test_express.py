"""The express way (router/forward/express.py): requests answered from the sockets'
callbacks once a kept-alive connection to an engine is free, and handed to the task path
the moment they must wait: a failing replica, an answer broken off, a client gone.

In one event loop: fake engines (tests/router/fake_engine.py, aiohttp, keep-alive), the
router on its own server (router/wire/server.py, with its express way, as router/serve.py
runs it) and an HTTP client over loopback sockets."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json

import httpx
import pytest
import yaml
from aiohttp import web

from router.app import Router
from router.config import RouterConfig
from router.table.sources import StaticSource
from router.wire.server import Server
from tests.router.fake_engine import Engine, make_app

KEY = "sk-express-test"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 60))


class Fleet:
    """Fake engines, a router in front of them on its own server, and a client."""

    def __init__(self, engines: list[Engine], router: Router, server: Server,
                 client: httpx.AsyncClient) -> None:  # fmt: skip
        self.engines = engines
        self.router = router
        self.server = server
        self.client = client

    async def chat(self, **extra) -> httpx.Response:
        return await self.client.post("/v1/chat/completions", json={**CHAT, **extra})

    async def warm(self) -> None:
        """Every engine with a kept-alive connection from the router: concurrent requests
        spread over the replicas (least outstanding), each then left idle in the pool."""
        for _ in range(3):
            answers = await asyncio.gather(*(self.chat() for _ in range(4 * len(self.engines))))
            assert all(a.status_code == 200 for a in answers)
            if all(e.requests for e in self.engines):
                return
        raise AssertionError("a replica got no request while warming")

    def metric(self, text: str) -> float:
        """The sum of the router's metric lines that contain ``text``."""
        rendered = self.router.metrics.render().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in rendered.splitlines()
                   if text in line and not line.startswith("#"))  # fmt: skip


@contextlib.asynccontextmanager
async def fleet(
    tmp_path,
    engines: int = 1,
    chunks: int = 3,
    engine_name: str = "llama.cpp",
    express: bool = True,
):
    runners = []
    started = []
    for n in range(engines):
        engine = Engine("", f"engine-{n}", chunks, 0.0, True)
        runner = web.AppRunner(make_app(engine), handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        started.append((engine, runner.addresses[0][1]))
    static = tmp_path / "static.yaml"
    key = {"name": "test", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}
    static.write_text(yaml.safe_dump({
        "models": [{"name": "m", "endpoints": [{"url": f"http://127.0.0.1:{port}",
                                                "engine": engine_name}
                                               for _engine, port in started]}],
        "keys": [key],
    }))  # fmt: skip
    config = RouterConfig(static_path=str(static), refresh_seconds=3600, table_file="",
                          express=express)  # fmt: skip
    router = Router(config, StaticSource(str(static)))
    await router.start()
    server = Server(router, express=router.express)
    listener = await asyncio.get_running_loop().create_server(server.connection, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30,
                               headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    try:
        yield Fleet([e for e, _ in started], router, server, client)
    finally:
        await client.aclose()
        listener.close()
        for connection in list(server.connections):
            connection.transport.close()
        for task in list(server.tasks):
            task.cancel()
        await router.stop()
        for runner in runners:
            await runner.cleanup()


def events(text: str) -> list:
    return [json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]"
            for line in text.splitlines() if line.startswith("data: ")]  # fmt: skip


def test_answers_on_kept_alive_connections_go_the_express_way_and_say_what_the_task_path_says(
    tmp_path,
):
    async def scenario():
        async with fleet(tmp_path) as f:
            first = await f.chat()  # no connection to the engine yet: the task path's
            assert f.router.expressed == 0
            whole = await f.chat()
            assert f.router.expressed == 1
            assert whole.json()["choices"] == first.json()["choices"]
            assert whole.json()["usage"] == first.json()["usage"]
            assert whole.headers["x-request-id"] and whole.headers["x-request-id"] != \
                first.headers["x-request-id"]  # fmt: skip
            assert whole.headers["content-type"] == first.headers["content-type"]
            streamed = await f.chat(stream=True)
            assert f.router.expressed == 2
            said = events(streamed.text)
            assert streamed.headers["content-type"].startswith("text/event-stream")
            assert said[-1] == "[DONE]"
            assert not any(e != "[DONE]" and e.get("usage") for e in said)  # asked by us: dropped
            assert "".join(e["choices"][0]["delta"].get("content", "") for e in said[:-1] if
                           e["choices"])  # fmt: skip
            asked = events((await f.chat(stream=True, stream_options={"include_usage": True})).text)
            assert asked[-2]["usage"]["completion_tokens"] == 3  # the client's own ask: kept
            embedded = await f.client.post("/v1/embeddings", json={"model": "m", "input": "x"})
            assert embedded.status_code == 200 and embedded.json()["data"]
            assert f.router.expressed == 4
            # The engine was sent what the task path sends: the catalog's name, the usage
            # option, the request id, no client key.
            sent = f.engines[0].requests[2]
            assert sent["body"]["stream_options"] == {"include_usage": True}
            assert sent["request_id"] == streamed.headers["x-request-id"]
            assert KEY not in sent["authorization"]
            # Counted like the task path's: tokens, answers by status, time to first byte.
            assert f.metric('llmgw_router_requests_total{code="200",model="m"}') == 5
            assert f.metric("llmgw_router_prompt_tokens_total") > 0
            assert f.metric('llmgw_router_completion_tokens_total{model="m"}') == 3 * 4  # 4 chats
            assert f.router.balancer.inflight(f.router.table.routes["m"].endpoints[0].replica) == 0

    run(scenario())


def test_a_failing_replica_or_a_broken_answer_is_handed_to_the_task_path_and_answered(tmp_path):
    async def scenario():
        async with fleet(tmp_path, engines=2) as f:
            await f.warm()
            before = f.router.expressed
            # Replica 0 fails a request once (500), then breaks an answer off once (its head
            # and a few bytes, then the connection closed): each time replica 1 answers.
            for fault, kind in (("fail_next", "http_500"), ("break_next", "broken_answer")):
                setattr(f.engines[0], fault, 1)
                for _ in range(30):  # until the balancer's pick lands on replica 0
                    assert (await f.chat()).status_code == 200
                    if f.metric(f'kind="{kind}"'):
                        break
                assert f.metric(f'kind="{kind}"') == 1
            assert f.router.expressed > before
            assert all(f.router.balancer.inflight(e.replica) == 0
                       for e in f.router.table.routes["m"].endpoints)  # fmt: skip

    run(scenario())


def test_a_client_that_leaves_mid_stream_is_counted_499_and_frees_its_replica(tmp_path):
    async def scenario():
        async with fleet(tmp_path, chunks=20) as f:
            await f.warm()
            engine = f.engines[0]
            tokens = f.metric('llmgw_router_completion_tokens_total{model="m"}')
            engine.gate = True  # each chunk waits for a release: the stream stays open
            async with f.client.stream("POST", "/v1/chat/completions",
                                       json={**CHAT, "stream": True}) as answer:  # fmt: skip
                engine.releases.release()
                assert answer.status_code == 200
                async for _line in answer.aiter_lines():
                    break
                assert f.router.expressed >= 1
            # The client hung up: the engine is hung up on, its replica freed, the 499 counted.
            for _ in range(100):
                if f.metric('code="499"') == 1:
                    break
                await asyncio.sleep(0.02)
            assert f.metric('code="499"') == 1
            replica = f.router.table.routes["m"].endpoints[0].replica
            assert f.router.balancer.inflight(replica) == 0
            stream = next(r for r in engine.requests if r["body"].get("stream"))
            for _ in range(100):
                if stream["cancelled"]:
                    break
                await asyncio.sleep(0.02)
            assert stream["cancelled"]
            # What reached the client was counted by the engine's tokenizer, and charged.
            assert engine.requests[-1]["path"] == "/tokenize"
            charged = f.metric('llmgw_router_completion_tokens_total{model="m"}') - tokens
            assert 1 <= charged < 20  # the words it had, not the answer's 20

    run(scenario())


def test_a_stream_whose_engine_breaks_off_is_carried_on_by_another_replica(tmp_path):
    async def scenario():
        async with fleet(tmp_path, engines=2, chunks=6) as f:
            await f.warm()
            for engine in f.engines:
                engine.gate = True  # each chunk waits for a release: the break comes mid-way
            async with f.client.stream("POST", "/v1/chat/completions",
                                       json={**CHAT, "stream": True}) as answer:  # fmt: skip
                lines = answer.aiter_lines()
                first = await anext(lines)
                while not first.startswith("data: "):
                    first = await anext(lines)
                (client,) = [c for c in f.server.connections if c.answering is not None]
                express = client.answering.express
                assert express is not None  # answered from callbacks until the break
                broken = express.endpoint
                for engine in f.engines:
                    engine.gate = False  # the replica that carries it on answers at once
                express._connection.transport.abort()  # the engine's connection, reset
                rest = [line async for line in lines if line.startswith("data: ")]
            said = events("\n".join([first, *rest]))
            assert said[-1] == "[DONE]"
            assert not any("error" in e for e in said[:-1])  # carried on, not ended in error
            assert f.metric('kind="broken_stream"') == 1
            assert f.metric("llmgw_router_migrations_total") == 1
            (other,) = [e for e in f.router.table.routes["m"].endpoints if e != broken]
            continued = [r for r in f.engines[0].requests + f.engines[1].requests
                         if r["body"].get("continue_final_message")]  # fmt: skip
            assert continued, "the other replica was asked to carry the answer on"
            assert all(f.router.balancer.inflight(e.replica) == 0
                       for e in (broken, other))  # fmt: skip

    run(scenario())


def test_with_the_express_way_off_every_request_takes_the_task_path(tmp_path):
    async def scenario():
        async with fleet(tmp_path, express=False) as f:
            await f.warm()
            answers = [await f.chat(), await f.chat(stream=True)]
            assert [a.status_code for a in answers] == [200, 200]
            assert events(answers[1].text)[-1] == "[DONE]"
            assert f.router.expressed == 0

    run(scenario())


@pytest.mark.parametrize("body", [
    {"model": "nope", "messages": []},  # an unknown model: the task path's 404
    {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://10.0.0.1/x.png"}}]}]},
])  # fmt: skip
def test_what_the_express_way_would_refuse_or_wait_on_goes_the_task_path(tmp_path, body):
    async def scenario():
        async with fleet(tmp_path) as f:
            await f.warm()
            before = f.router.expressed
            answer = await f.client.post("/v1/chat/completions", json=body)
            assert answer.status_code in (400, 404)
            assert answer.json()["error"]["message"]
            assert f.router.expressed == before

    run(scenario())
