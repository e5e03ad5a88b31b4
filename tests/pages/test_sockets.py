"""The pages' websockets through the real ASGI application, channel layer (Redis) included."""

from __future__ import annotations

import re

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from audit import notices
from fleet.link.heartbeats import write_heartbeats
from fleet.models import Node, NodeState
from fleet.transitions import transition
from tests.factories import SETUP
from tests.pages.asgi_client import application, session_cookie
from tests.pages.rows import heartbeating_node, many_nodes, stale_replica_on, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ROUTES = [
    "/ws/pages/cluster/",
    "/ws/pages/nodes/node01/",
    "/ws/pages/nodes/node01/logs/",
    "/ws/pages/models/gemma/",
]


@database_sync_to_async
def make_fleet():
    node = heartbeating_node("node01")
    return stale_replica_on(node)


def socket(path: str, session: str | None = None, origin: str = "http://testserver"):
    headers = [(b"host", b"testserver"), (b"origin", origin.encode())]
    if session:
        headers.append((b"cookie", f"sessionid={session}".encode()))
    return WebsocketCommunicator(application(), path, headers=headers)


async def connected(path: str, session: str) -> tuple[WebsocketCommunicator, str]:
    communicator = socket(path, session)
    accepted, _ = await communicator.connect(timeout=10)
    assert accepted, path
    first = await communicator.receive_from(timeout=10)
    return communicator, first


async def receive_until(communicator, text: str, attempts: int = 10) -> str:
    """Pushes until one contains ``text``: a heartbeat batch may push before our change."""
    for _ in range(attempts):
        pushed = await communicator.receive_from(timeout=10)
        if text in pushed:
            return pushed
    raise AssertionError(f"no push contained {text!r}")


async def test_anonymous_sockets_are_refused():
    await make_fleet()
    for path in ROUTES:
        communicator = socket(path)
        accepted, _ = await communicator.connect(timeout=10)
        assert not accepted, path
        await communicator.disconnect()


async def test_a_socket_from_another_site_is_refused(reader):
    await make_fleet()
    session = await session_cookie(reader)
    communicator = socket("/ws/pages/cluster/", session, origin="https://evil.example")
    accepted, _ = await communicator.connect(timeout=10)
    assert not accepted
    await communicator.disconnect()


async def test_every_page_socket_pushes_its_whole_page_on_connect(reader):
    await make_fleet()
    session = await session_cookie(reader)
    expected = {
        "/ws/pages/cluster/": ['<section id="nodes">', '<section id="models">'],
        "/ws/pages/nodes/node01/": [
            '<section id="node-summary">',
            '<section id="node-history" class="history">',
        ],
        "/ws/pages/nodes/node01/logs/": ['<p id="node-state">'],
        "/ws/pages/models/gemma/": [
            '<section id="model-profiles">',
            '<section id="model-replicas">',
            '<section id="model-traffic" class="history"',
        ],
    }
    for path, fragments in expected.items():
        communicator, first = await connected(path, session)
        for fragment in fragments:
            assert fragment in first, (path, fragment)
        assert "hx-post" not in first, path  # a reader's push has no buttons
        await communicator.disconnect()


async def test_an_operators_push_has_the_buttons(operator):
    await make_fleet()
    session = await session_cookie(operator)
    communicator, first = await connected("/ws/pages/cluster/", session)
    assert "/restart/" in first and "hx-post" in first
    await communicator.disconnect()


async def test_a_node_going_unreachable_is_pushed_to_the_cluster_page(reader):
    await make_fleet()
    session = await session_cookie(reader)
    communicator, first = await connected("/ws/pages/cluster/", session)
    assert 'data-state="connected"' in first
    await database_sync_to_async(transition)(
        Node, "node01", NodeState.UNREACHABLE, "silent", actor=SETUP
    )
    pushed = await receive_until(communicator, 'class="badge state-unreachable"')
    assert pushed.lstrip().startswith('<section id="nodes">')
    await communicator.disconnect()


async def test_heartbeats_push_the_node_page_but_not_other_nodes_pages(reader):
    await make_fleet()
    session = await session_cookie(reader)
    communicator, _first = await connected("/ws/pages/nodes/node01/", session)
    await database_sync_to_async(notices.usage_changed)(["node02"])
    assert await communicator.receive_nothing(timeout=1.5)
    await database_sync_to_async(Node.objects.filter(id="node01").update)(
        usage={
            "cpu_percent": 77.0,
            "memory_total": 10,
            "memory_used": 5,
            "memory_available": 5,
            "load": [1, 1, 1],
        }
    )
    await database_sync_to_async(notices.usage_changed)(["node01"])
    pushed = await receive_until(communicator, "77%")
    assert '<section id="node-summary">' in pushed
    await communicator.disconnect()


async def test_a_replica_change_is_pushed_to_its_model_page(reader):
    _profile, stale, _fetching, _unplaceable = await make_fleet()
    session = await session_cookie(reader)
    communicator, _first = await connected("/ws/pages/models/gemma/", session)
    await database_sync_to_async(transition)(
        type(stale), stale.id, "stopping", "restart requested by test", actor=SETUP
    )
    pushed = await receive_until(communicator, "restart requested by test")
    assert '<section id="model-replicas">' in pushed
    await communicator.disconnect()


async def test_a_page_whose_node_is_gone_says_so(reader):
    session = await session_cookie(reader)
    communicator, first = await connected("/ws/pages/nodes/nowhere/", session)
    assert '<div id="page-notice"' in first and "is gone" in first
    await communicator.disconnect()


def node_rows(html: str) -> list[str]:
    return re.findall(r'<tr id="node-([^"]+)"', html)


async def test_the_cluster_socket_shows_the_page_its_url_asks_for(reader):
    await database_sync_to_async(many_nodes)(120, unreachable_every=10)
    session = await session_cookie(reader)
    communicator, first = await connected("/ws/pages/cluster/?state=unreachable&page=2", session)
    # 12 unreachable make one page only: it shows, with a word on why.
    assert node_rows(first) == [f"gpu{i:05d}" for i in range(9, 120, 10)]
    assert "page 2 is past the last (1); showing the last" in first
    await communicator.disconnect()
    communicator, first = await connected("/ws/pages/cluster/?pool=b&page=2", session)
    assert node_rows(first) == [f"gpu{i:05d}" for i in range(101, 120, 2)]
    assert "showing 51–60 of 60 matching" in first
    await communicator.disconnect()


async def test_heartbeats_push_the_cluster_page_only_for_the_rows_it_shows(reader):
    await database_sync_to_async(many_nodes)(60)
    session = await session_cookie(reader)
    communicator, first = await connected("/ws/pages/cluster/", session)
    assert len(node_rows(first)) == 50
    now = timezone.now()
    off_page = {"gpu00055": (now, usage(cpu_percent=77.0))}
    await database_sync_to_async(write_heartbeats)(off_page)
    assert await communicator.receive_nothing(timeout=1.5)
    await database_sync_to_async(write_heartbeats)({"gpu00001": (now, usage(cpu_percent=77.0))})
    pushed = await receive_until(communicator, "77%")
    # Only the row that changed: the page swaps it in by its id.
    assert node_rows(pushed) == ["gpu00001"]
    assert '<section id="nodes">' not in pushed and '<section id="models">' not in pushed
    await communicator.disconnect()


async def test_heartbeats_push_their_own_rows_each_once_a_push(reader):
    await database_sync_to_async(many_nodes)(60)
    session = await session_cookie(reader)
    communicator, _first = await connected("/ws/pages/cluster/", session)
    now = timezone.now()
    for node_id, cpu in (("gpu00002", 61.0), ("gpu00007", 62.0), ("gpu00002", 63.0)):
        await database_sync_to_async(write_heartbeats)({node_id: (now, usage(cpu_percent=cpu))})
    pushes: list[str] = []
    while len(pushes) < 10 and not all(cpu in "".join(pushes) for cpu in ("62%", "63%")):
        pushes.append(await communicator.receive_from(timeout=10))
    assert "63%" in pushes[-1] or "62%" in pushes[-1]
    for pushed in pushes:
        rows = node_rows(pushed)
        assert "<section" not in pushed and rows, pushed[:300]
        assert len(rows) == len(set(rows)) and set(rows) <= {"gpu00002", "gpu00007"}
    await communicator.disconnect()


async def test_a_change_off_the_page_is_pushed_only_if_it_moves_the_counts(reader):
    await database_sync_to_async(many_nodes)(60)
    session = await session_cookie(reader)
    communicator, _first = await connected("/ws/pages/cluster/", session)
    # Said of a node off the page, changing nothing this page shows: the models may be
    # redrawn (a node's change can touch replicas), the nodes are not.
    await database_sync_to_async(notices.pages_changed)("node", "gpu00055")
    pushed = await communicator.receive_from(timeout=10)
    assert '<section id="nodes">' not in pushed and '<section id="models">' in pushed
    await database_sync_to_async(transition)(
        Node, "gpu00055", NodeState.UNREACHABLE, "silent", actor=SETUP
    )
    pushed = await receive_until(communicator, "1 unreachable")
    assert node_rows(pushed) == [f"gpu{i:05d}" for i in range(50)]
    await communicator.disconnect()
