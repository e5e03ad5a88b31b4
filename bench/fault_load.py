"""The load of bench/faults.py and bench/partitions.py: streaming chat clients that count
what failed and why."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from llmgw_cli.demo import DEMO_MODEL

# A request still unanswered after this long is hung: the router must end it before.
REQUEST_TIMEOUT = 120.0


@dataclass
class Request:
    started: float
    ended: float = 0.0
    error: str = ""  # "" when the stream ended with [DONE]


class Load:
    """Streaming clients in a thread of their own, each one request after another."""

    def __init__(
        self,
        url: str,
        key: str,
        clients: int,
        max_requests: int = 100_000,
        enter: Callable[[], None] | None = None,
        hang_after: float = REQUEST_TIMEOUT,
        models: tuple[str, ...] = (DEMO_MODEL,),
        pause: float = 0.0,
    ) -> None:
        """``enter`` runs first in the load's thread: bench/partitions.py moves it into a
        simulated host's network namespace, so every request leaves from that host.
        Client ``n`` asks for ``models[n % len(models)]``, waiting ``pause`` seconds
        after each answer: the suite's short runs keep traffic in flight through every
        fault without keeping the engines (and the machine's cores) busy throughout."""
        self.url, self.key, self.clients = url, key, clients
        self.models = models
        self.max_requests = max_requests
        self.hang_after = hang_after
        self.pause = pause
        self.requests: list[Request] = []
        self._stop = threading.Event()
        self._enter = enter
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        if self._enter is not None:
            self._enter()
        asyncio.run(self._run())

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.hang_after + 10)

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.clients * 2)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0)) as client:
            await asyncio.gather(*(self._client(client, n) for n in range(self.clients)))

    async def _client(self, client: httpx.AsyncClient, n: int) -> None:
        while not self._stop.is_set() and len(self.requests) < self.max_requests:
            request = Request(started=time.monotonic())
            self.requests.append(request)
            try:
                request.error = await asyncio.wait_for(self._one(client, n), self.hang_after)
            except TimeoutError:
                request.error = f"hung past {self.hang_after:.0f}s"
            except httpx.HTTPError as exc:
                request.error = type(exc).__name__
            request.ended = time.monotonic()
            if request.error:
                await asyncio.sleep(max(0.2, self.pause))  # a retry, but not in a tight loop
            elif self.pause:
                await asyncio.sleep(self.pause)

    async def _one(self, client: httpx.AsyncClient, n: int) -> str:
        body = {
            "model": self.models[n % len(self.models)],
            "messages": [{"role": "user", "content": f"Count to five, client {n}."}],
            "max_tokens": 24,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {self.key}"}
        async with client.stream("POST", f"{self.url}/v1/chat/completions", json=body,
                                 headers=headers) as response:  # fmt: skip
            if response.status_code != 200:
                await response.aread()
                try:
                    kind = response.json()["error"].get("code") or response.json()["error"]["type"]
                except (ValueError, KeyError, TypeError):
                    kind = "no OpenAI error body"
                return f"HTTP {response.status_code} {kind}"
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    return ""
                if line.startswith("data: ") and '"error"' in line[:20]:
                    error = json.loads(line.removeprefix("data: "))["error"]
                    return f"stream error {error.get('code') or error.get('type')}"
            return "stream ended without [DONE]"

    def between(self, start: float, end: float) -> list[Request]:
        return [r for r in list(self.requests) if start <= r.started <= end]
