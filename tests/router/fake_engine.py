#!/usr/bin/env python3
"""A fake OpenAI-compatible engine for router tests and the router benchmark.

    fake_engine.py --port P [--api-key K] [--name N] [--chunks 3] [--delay 0] [--no-record]

Serves /v1/chat/completions, /v1/completions (both streaming as SSE), /v1/embeddings,
/v1/models and /health, answering for whatever model a request names; every other
endpoint the router routes (/v1/responses, /v1/messages, /v1/rerank, /v1/audio/*,
/tokenize, ...) gets a small answer in that endpoint's shape, with its usage, so a test
sees what reached the engine. Like llama-server, every answer carries an empty
``Access-Control-Allow-Origin`` header. With --api-key,
a request without ``Authorization: Bearer K`` gets 401, as engines started by llmgw do.
--name goes into each answer's ``system_fingerprint``, so a test can tell which engine
answered. Port 0 picks a free port; the first line on stdout is ``listening on PORT``.

Tests steer it over HTTP:

- ``POST /_control`` with any of ``{"fail_next": N, "fail_status": 500, "gate": true,
  "chunks": N, "delay": S, "tail_delay": S, "break_next": N, "lacks": [paths]}``: fail the next N
  requests, or make streams wait after each chunk until ``POST /_release`` (one release
  lets one more chunk out; a gated answer that does not stream waits for chunks - 1
  releases before it is sent); wait ``tail_delay`` seconds after a stream's last text
  chunk (the one with its ``finish_reason``) before its usage and ``[DONE]``; break off
  the next N answers after their first bytes (the request read whole, the connection
  closed mid-answer); answer ``lacks``' paths 404 as a
  llama-server build without them does;
- ``GET /_state``: every request seen, with ``cancelled`` (the client hung up before the
  answer was whole), ``finished``, ``body`` and ``authorization``;
- ``POST /_reset``: forget requests and settings.

It also loads and unloads LoRA adapters as vLLM does (``/v1/load_lora_adapter``,
``/v1/unload_lora_adapter``); ``/_state`` lists them and each call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid

from aiohttp import web


class Engine:
    def __init__(self, api_key: str, name: str, chunks: int, delay: float, record: bool) -> None:
        self.api_key = api_key
        self.name = name
        self.default_chunks = chunks
        self.default_delay = delay
        self.record = record
        self.reset()

    def reset(self) -> None:
        self.requests: list[dict] = []
        self.fail_next = 0
        self.fail_status = 500
        self.gate = False
        self.chunks = self.default_chunks
        self.delay = self.default_delay
        self.releases = asyncio.Semaphore(0)
        self.responses_made = 0
        self.break_next = 0
        self.lacks: list[str] = []
        self.tail_delay = 0.0
        # Tokens this engine processed (prompts) and generated (each text chunk written).
        self.counted = {"prompt_tokens": 0, "completion_tokens": 0}
        # LoRA adapters loaded while it runs, as vLLM's API does: name -> path, and each
        # ["load" | "unload", name] call in order.
        self.loras: dict[str, str] = {}
        self.lora_calls: list[list[str]] = []

    # -- steering ---------------------------------------------------------------------

    async def control(self, request: web.Request) -> web.Response:
        settings = await request.json()
        self.fail_next = settings.get("fail_next", self.fail_next)
        self.fail_status = settings.get("fail_status", self.fail_status)
        self.gate = settings.get("gate", self.gate)
        self.chunks = settings.get("chunks", self.chunks)
        self.delay = settings.get("delay", self.delay)
        self.break_next = settings.get("break_next", self.break_next)
        self.lacks = settings.get("lacks", self.lacks)
        self.tail_delay = settings.get("tail_delay", self.tail_delay)
        return web.json_response({"ok": True})

    async def release(self, request: web.Request) -> web.Response:
        self.releases.release()
        return web.json_response({"ok": True})

    async def state(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"name": self.name, "requests": self.requests, "counted": self.counted,
             "loras": self.loras, "lora_calls": self.lora_calls}
        )  # fmt: skip

    async def reset_handler(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})

    # -- the OpenAI surface --------------------------------------------------------------

    def _refused(self, request: web.Request) -> web.Response | None:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response(
                {"error": {"message": "Invalid API Key", "type": "authentication_error"}},
                status=401,
            )
        return None

    async def lora(self, request: web.Request) -> web.Response:
        """vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter, with its answers."""
        refused = self._refused(request)
        if refused:
            return refused
        body = await request.json()
        name, loading = body["lora_name"], request.path.endswith("/load_lora_adapter")
        self.lora_calls.append(["load" if loading else "unload", name])
        if loading and name in self.loras:
            message = f"The lora adapter '{name}' has already been loaded."
            return web.json_response({"error": {"message": message}}, status=400)
        if not loading and name not in self.loras:
            message = f"The lora adapter '{name}' cannot be found."
            return web.json_response({"error": {"message": message}}, status=404)
        if loading:
            self.loras[name] = body["lora_path"]
        else:
            del self.loras[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' done")

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused:
            return refused
        return web.json_response(
            {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "x"}]}
        )

    async def inference(self, request: web.Request) -> web.StreamResponse:
        refused = self._refused(request)
        if refused:
            return refused
        raw = await request.read()
        if request.content_type == "multipart/form-data":
            body = {"upload_bytes": len(raw), "content_type": request.headers["Content-Type"]}
        else:
            body = json.loads(raw) if raw else {}
        seen = {
            "path": request.path,
            "query": request.query_string,
            "method": request.method,
            "model": body.get("model"),
            "body": body,
            "authorization": request.headers.get("Authorization", ""),
            "session": request.headers.get("x-session-id", ""),
            "request_id": request.headers.get("x-request-id", ""),
            "cancelled": False,
            "finished": False,
        }
        if self.record:
            self.requests.append(seen)
        if request.path in self.lacks:
            seen["finished"] = True
            # As a llama-server build older than the endpoint answers it.
            return web.json_response(
                {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}},
                status=404,
            )
        if self.break_next > 0:
            self.break_next -= 1
            seen["finished"] = True
            return await self._broken_off(request)
        if self.fail_next > 0:
            self.fail_next -= 1
            seen["finished"] = True
            return web.json_response(
                # As llama-server words it: the status as a number in ``code``.
                {
                    "error": {
                        "code": self.fail_status,
                        "message": "engine failure (fake)",
                        "type": "not_supported_error"
                        if self.fail_status == 501
                        else "server_error",
                    }
                },  # fmt: skip
                status=self.fail_status,
            )
        try:
            if request.path == "/v1/embeddings":
                response: web.StreamResponse = web.json_response(self._embeddings(body))
            elif request.path in OTHER_ANSWERS:
                response = web.json_response(OTHER_ANSWERS[request.path](self, body))
            elif request.path.startswith("/v1/responses/"):
                response = web.json_response({"id": request.path.split("/")[3], "deleted": True})
            elif body.get("stream"):
                response = await self._stream(request, body)
            else:
                if self.gate:  # a long generation: one release per chunk but the last
                    for _ in range(self.chunks - 1):
                        await self.releases.acquire()
                response = web.json_response(self._completion(request.path, body))
                self.counted["prompt_tokens"] += self._prompt_tokens(body)
                self.counted["completion_tokens"] += self.chunks
        except (asyncio.CancelledError, ConnectionResetError):
            seen["cancelled"] = True
            raise
        seen["finished"] = True
        return response

    async def _broken_off(self, request: web.Request) -> web.StreamResponse:
        """The status and the first bytes of an answer, then the connection closed."""
        response = web.StreamResponse(
            headers={"Content-Type": "application/json", "Content-Length": "1000"}
        )
        await response.prepare(request)
        await response.write(b'{"text": "the answer bro')
        assert request.transport is not None
        request.transport.close()
        return response

    def _prompt_tokens(self, body: dict) -> int:
        text = json.dumps(body.get("messages") or body.get("prompt") or body.get("input") or "")
        return max(1, len(text.split()))

    def _usage(self, body: dict, completion: int) -> dict:
        prompt = self._prompt_tokens(body)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _completion(self, path: str, body: dict) -> dict:
        text = "".join(f"tok{i} " for i in range(self.chunks))
        if path == "/v1/chat/completions":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
            kind = "text_completion"
        return {
            "id": "cmpl-fake",
            "object": kind,
            "created": int(time.time()),
            "model": body.get("model"),
            "system_fingerprint": self.name,
            "choices": [choice],
            "usage": self._usage(body, self.chunks),
        }

    def _embeddings(self, body: dict) -> dict:
        inputs = body.get("input")
        count = len(inputs) if isinstance(inputs, list) else 1
        prompt = self._prompt_tokens(body)
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": [0.1 * i, 0.2, 0.3]}
                for i in range(count)
            ],
            "model": body.get("model"),
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
        }

    def _chunk(self, path: str, body: dict, index: int, last: bool) -> dict:
        finish = "stop" if last else None
        if path == "/v1/chat/completions":
            choice = {"index": 0, "delta": {"content": f"tok{index} "}, "finish_reason": finish}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": f"tok{index} ", "finish_reason": finish}
            kind = "text_completion"
        return {
            "id": "cmpl-fake",
            "object": kind,
            "created": int(time.time()),
            "model": body.get("model"),
            "system_fingerprint": self.name,
            "choices": [choice],
        }

    async def _stream(self, request: web.Request, body: dict) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunks = self.chunks
        self.counted["prompt_tokens"] += self._prompt_tokens(body)
        for index in range(chunks):
            chunk = self._chunk(request.path, body, index, last=index == chunks - 1)
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.counted["completion_tokens"] += 1
            if index < chunks - 1:
                if self.gate:
                    await self.releases.acquire()
                elif self.delay:
                    await asyncio.sleep(self.delay)
        if self.tail_delay:
            await asyncio.sleep(self.tail_delay)
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            usage_chunk = self._chunk(request.path, body, 0, last=True)
            usage_chunk["choices"] = []
            usage_chunk["usage"] = self._usage(body, chunks)
            await response.write(b"data: " + json.dumps(usage_chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _response(engine: Engine, body: dict) -> dict:
    engine.responses_made += 1
    return {
        # Unique across resets, as an engine's are: a router keeps the ids it has seen.
        "id": f"resp_{engine.name}_{engine.responses_made}_{uuid.uuid4().hex[:8]}",
        "object": "response",
        "model": body.get("model"),
        "status": "completed",
        "output": [{"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                    "content": [{"type": "output_text", "text": "tok0 ", "annotations": []}]}],
        "usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10},
    }  # fmt: skip


def _words(body: dict) -> int:
    """Tokens of a /tokenize request: its content's words, or (vLLM's form) its messages'."""
    if "messages" in body:
        return max(1, len(json.dumps(body["messages"]).split()))
    return len(str(body.get("content") or "").split())


def _message(engine: Engine, body: dict) -> dict:
    return {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": body.get("model"),
        "content": [{"type": "text", "text": "tok0 "}], "stop_reason": "end_turn",
        "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 2},
    }  # fmt: skip


OTHER_ANSWERS = {
    "/v1/responses": _response,
    "/v1/messages": _message,
    "/v1/messages/count_tokens": lambda engine, body: {"input_tokens": 5},
    "/v1/rerank": lambda engine, body: {
        "results": [{"index": 0, "relevance_score": 0.9}],
        "usage": {"prompt_tokens": 4, "total_tokens": 4},
    },
    "/v1/audio/transcriptions": lambda engine, body: {
        "text": "hello",
        "usage": {"type": "tokens", "input_tokens": 6, "output_tokens": 1},
    },
    "/v1/audio/speech": lambda engine, body: {"audio": "", "format": "wav"},
    "/v1/images/generations": lambda engine, body: {"data": [{"b64_json": ""}]},
    # A word is a token, as the fake counts prompts: a chat's template is its messages' JSON.
    "/tokenize": lambda engine, body: {"tokens": list(range(_words(body)))},
    "/apply-template": lambda engine, body: {"prompt": json.dumps(body.get("messages") or "")},
    "/detokenize": lambda engine, body: {"content": "a b c"},
}
OTHER_ANSWERS["/rerank"] = OTHER_ANSWERS["/v1/score"] = OTHER_ANSWERS["/v1/rerank"]
OTHER_ANSWERS["/v1/audio/translations"] = OTHER_ANSWERS["/v1/audio/transcriptions"]


async def empty_cors_header(request: web.Request, response: web.StreamResponse) -> None:
    """llama-server answers every request with its own, empty without an Origin."""
    response.headers["Access-Control-Allow-Origin"] = request.headers.get("Origin", "")


def make_app(engine: Engine) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_response_prepare.append(empty_cors_header)
    app.router.add_post("/v1/chat/completions", engine.inference)
    app.router.add_post("/v1/completions", engine.inference)
    app.router.add_post("/v1/embeddings", engine.inference)
    for path in OTHER_ANSWERS:
        app.router.add_post(path, engine.inference)
    app.router.add_get("/v1/responses/{id}", engine.inference)
    app.router.add_delete("/v1/responses/{id}", engine.inference)
    app.router.add_get("/v1/models", engine.models)
    app.router.add_get("/health", engine.health)
    app.router.add_post("/v1/load_lora_adapter", engine.lora)
    app.router.add_post("/v1/unload_lora_adapter", engine.lora)
    app.router.add_post("/_control", engine.control)
    app.router.add_post("/_release", engine.release)
    app.router.add_get("/_state", engine.state)
    app.router.add_post("/_reset", engine.reset_handler)
    return app


async def serve(args: argparse.Namespace) -> None:
    engine = Engine(args.api_key, args.name, args.chunks, args.delay, not args.no_record)
    # handler_cancellation: a client that hangs up cancels the handler, as in real engines
    # that stop generating; that is what the tests observe as "cancelled".
    runner = web.AppRunner(make_app(engine), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    print(f"listening on {port}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default="")
    parser.add_argument("--name", default="fake")
    parser.add_argument("--chunks", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--no-record", action="store_true", help="keep no request log (bench)")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
