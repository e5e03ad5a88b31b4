"""A logs page waiting on a silent agent holds up nothing else the control plane does.

The node's queue has no worker, so the agent never answers and the page waits out
REPLY_TIMEOUT (Redis broker and result backend real). Django gives every HTTP request
its own thread-sensitive context (ASGIHandler enters ThreadSensitiveContext), so the
sync view waits on a thread of its own, never on the one thread that Channels'
database_sync_to_async shares among the agents' and pages' consumers. This test keeps
it so: a change that moved the wait onto that thread would stall every agent.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
from channels.db import database_sync_to_async
from channels.testing import HttpCommunicator
from django.conf import settings
from django.db import connections

from fleet import commands
from fleet.models import Node
from tests.factories import make_node
from tests.pages.asgi_client import application, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

SILENT = "silent01"


@pytest.fixture
def broker():
    """The broker's Redis; the silent node's queue is emptied before and after."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(commands.node_queue(SILENT))
    yield client
    client.delete(commands.node_queue(SILENT))
    client.close()


async def command_queued(broker: redis.Redis, timeout: float = 10) -> None:
    """Wait until the page's read_logs is on the node's queue: the page now awaits the answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await asyncio.to_thread(broker.llen, commands.node_queue(SILENT)):
        assert loop.time() < deadline, "the logs page never sent read_logs"
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_a_logs_page_waiting_on_a_silent_agent_leaves_the_agents_database_work_alone(
    reader, broker, monkeypatch
):
    monkeypatch.setattr(commands, "REPLY_TIMEOUT", 3.0)
    finished: list[str] = []
    read_logs = commands.read_logs

    def read_logs_noting_the_end(*args, **kwargs):
        try:
            return read_logs(*args, **kwargs)
        finally:
            finished.append("the page's wait for the agent")

    monkeypatch.setattr(commands, "read_logs", read_logs_noting_the_end)
    await database_sync_to_async(make_node)(SILENT)
    session = await session_cookie(reader)
    page = HttpCommunicator(
        application(),
        "GET",
        f"/nodes/{SILENT}/logs/?follow=1",
        headers=[(b"host", b"testserver"), (b"cookie", f"sessionid={session}".encode())],
    )

    async def load_page() -> dict:
        response = await page.get_response(timeout=30)
        finished.append("logs page")
        await page.wait(timeout=10)  # response.close(): the request's connection is closed
        return response

    waiting = asyncio.create_task(load_page())
    await command_queued(broker)
    # What the agents' consumer does for every message: ORM work on Channels' sync thread.
    assert await database_sync_to_async(Node.objects.filter(id=SILENT).exists)()
    finished.append("agent's database work")
    response = await waiting
    # Channels' sync thread keeps its connection past the test; the flush needs it gone.
    await database_sync_to_async(connections.close_all)()

    assert finished == ["agent's database work", "the page's wait for the agent", "logs page"]
    assert response["status"] == 200
    assert b"did not answer in 3 s" in response["body"]
