"""A Redis pub/sub channel listened to for as long as a process lives: subscribed again
whenever Redis goes away, so a restart of Redis costs the messages sent meanwhile (each
listener says what covers those), never the listening."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

import redis.asyncio as aioredis

from core.redis_clients import channel_on

# After a lost Redis connection, subscribe again this soon.
RETRY_SECONDS = 1.0


async def listen_forever(
    url: Callable[[], str],
    channel: str,
    on_message: Callable[[bytes], Awaitable[None]],
    on_subscribed: Callable[[], None],
    log: logging.Logger,
    what: str,
) -> NoReturn:
    """Await ``on_message(data)`` for each message on ``channel`` of the Redis at ``url()``
    ("" while it is not known yet), calling ``on_subscribed()`` each time the subscription
    is made; ``what`` names the messages in the log when the connection is lost."""
    while True:
        address = url()
        if not address:
            await asyncio.sleep(RETRY_SECONDS)
            continue
        client = None
        try:
            # Pings an idle subscription, so a silently dropped connection is noticed.
            client = aioredis.Redis.from_url(address, health_check_interval=30)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe(channel_on(client, channel))
            on_subscribed()
            async for message in pubsub.listen():
                await on_message(message["data"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s lost (%s); listening again", what, exc)
        finally:
            if client is not None:
                await client.aclose()
        await asyncio.sleep(RETRY_SECONDS)
