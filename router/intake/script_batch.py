"""The limit scripts of requests begun or ended together, sent to Redis together: one
pipeline, one write and one read for them all.

Each request's admission and settling is a Lua script run (counters.py): a round trip
each, with redis-py's work per command, was over a third of the router's CPU, and at 64
requests in flight it ran out of redis-py's 100 connections (then every router counted
alone for a second, and places in flight it could not give back stayed taken until their
hold ran out: 429s). Batched, each script still runs whole and alone in Redis (a script is
atomic; a pipeline only shares the trip), so what routers admit is unchanged. A batch goes
at the end of the loop's turn it was asked in, or, while one is on its way
(MOST_BATCHES), as soon as that one is answered, with all that came meanwhile; a settling
may wait a little for an admission to go with (limits.py).

A script Redis does not hold yet (a restarted Redis, a flushed cache) is loaded and its
runs sent again; a batch that fails (Redis away, slower than the client's timeout) fails
every run in it, and each caller counts in its own process as before (limits.py).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from redis.exceptions import NoScriptError

# A batch this big is sent at once rather than waiting for the loop's turn to end.
MOST_RUNS = 512
# Batches on their way at once; past that, runs asked for meanwhile go in the next, when
# one is answered: the busier the router, the bigger the batches, the fewer the trips.
# Not 1: an admission would then wait behind the batch before it (a lone settling's).
MOST_BATCHES = 4

Run = tuple[str, list[str], tuple[Any, ...], asyncio.Future]


class ScriptBatch:
    """Runs Lua scripts on ``client`` (redis.asyncio), those asked for together in one
    pipeline."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._shas: dict[str, str] = {}  # script text -> its SHA-1
        self._queued: list[Run] = []
        self._tasks: set[asyncio.Task] = set()
        self._soon = False  # a send is due at the end of the loop's turn
        self._later: asyncio.TimerHandle | None = None  # a send due for runs that may wait

    async def run(
        self, script: str, keys: list[str], args: tuple[Any, ...] | list[Any],
        wait: float = 0.0,
    ) -> Any:  # fmt: skip
        """What the script returns, run with ``keys`` and ``args``; raises what Redis or
        the connection raised. ``wait``: it may wait that long for a batch to go with
        (a settling, which nobody waits for: it goes with the next admission)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if script not in self._shas:
            self._shas[script] = hashlib.sha1(script.encode()).hexdigest()  # noqa: S324 (Redis's name for it)
        self._queued.append((script, keys, tuple(args), future))
        if len(self._queued) >= MOST_RUNS and len(self._tasks) < MOST_BATCHES:
            self._send()
        elif not wait:
            if not self._soon:
                self._soon = True
                loop.call_soon(self._send)
        elif self._later is None:
            self._later = loop.call_later(wait, self._send)
        return await future

    def _send(self) -> None:
        self._soon = False
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if len(self._tasks) >= MOST_BATCHES:
            return  # sent when the batch on its way is answered, with what came meanwhile
        runs, self._queued = self._queued, []
        if not runs:
            return
        task = asyncio.get_running_loop().create_task(self._flush(runs))
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if self._queued and not self._soon:
            self._send()

    async def _flush(self, runs: list[Run]) -> None:
        try:
            replies = await self._pipeline(runs)
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                for script in {runs[i][0] for i in missing}:
                    await self.client.script_load(script)
                again = await self._pipeline([runs[i] for i in missing])
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
        except Exception as exc:  # noqa: BLE001  # every run in the batch failed alike
            for *_rest, future in runs:
                if not future.done():
                    future.set_exception(exc)
            return
        for (*_rest, future), reply in zip(runs, replies, strict=True):
            if future.done():  # its request was cancelled meanwhile
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _pipeline(self, runs: list[Run]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for script, keys, args, _future in runs:
                pipe.execute_command("EVALSHA", self._shas[script], len(keys), *keys, *args)
            return await pipe.execute(raise_on_error=False)

    async def close(self) -> None:
        """Wait for the batches on their way (their callers are answered either way)."""
        while self._queued or self._tasks:
            if not self._tasks:
                self._send()
            await asyncio.wait(list(self._tasks))


def limits_client(url: str, timeout: float) -> Any:
    """A redis.asyncio client for the limits' scripts: ``timeout`` on each command and
    connect, and a connection a restarted Redis closed made again at once, once."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    return aioredis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 1), retry_on_error=[RedisConnectionError],
    )  # fmt: skip
