"""A node's self-reported address is an IP address of the node, or its link is refused:
the router posts prompts with the replica secret there, and engines bind it."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from fleet.models import Node
from protocol import messages
from tests.fleet.inventories import inventory
from tests.fleet.link_sockets import communicator, consumer_ended

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def register_from(peer: str | None, address: str) -> dict:
    ws = communicator("node01")
    if peer is not None:
        ws.scope["client"] = [peer, 40000]
    connected, _ = await ws.connect()
    assert connected
    register = messages.Register(inventory=inventory("node01", address=address),
                                 engines_probed=True)  # fmt: skip
    await ws.send_to(text_data=register.model_dump_json())
    answer = json.loads(await ws.receive_from())
    if answer["type"] == "refused":
        assert await consumer_ended(ws)
    else:
        await ws.disconnect()
    return answer


@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("evil.example.com", "'evil.example.com', which is not an IP address"),
        ("0.0.0.0", "'0.0.0.0', which is no one host's address"),  # noqa: S104
        ("169.254.169.254", "'169.254.169.254', a link-local address"),
        ("224.0.0.1", "'224.0.0.1', which is no one host's address"),
    ],
)
async def test_an_address_that_is_no_hosts_own_is_refused_with_the_fix(address, said):
    answer = await register_from(None, address)

    assert answer["type"] == "refused"
    assert f"node node01 reports its address as {said}" in answer["reason"]
    assert "address: in its agent file" in answer["reason"]
    assert not await sync_to_async(Node.objects.exists)()


async def test_an_address_other_than_the_links_own_is_refused():
    answer = await register_from("10.0.0.7", "10.0.0.9")

    assert answer["type"] == "refused"
    assert "its link comes from 10.0.0.7" in answer["reason"]
    assert "LLMGW_LINK_PROXIES" in answer["reason"]
    assert not await sync_to_async(Node.objects.exists)()


async def test_the_links_own_address_is_taken():
    assert (await register_from("10.0.0.9", "10.0.0.9"))["type"] == "linked"
    assert (await sync_to_async(Node.objects.get)(id="node01")).address == "10.0.0.9"


async def test_loopback_is_taken_only_from_a_link_over_loopback():
    assert (await register_from("127.0.0.1", "127.0.0.1"))["type"] == "linked"
    refused = await register_from("10.0.0.7", "127.0.0.1")
    assert "its link comes from 10.0.0.7" in refused["reason"]


async def test_a_link_through_a_named_proxy_may_report_another_address(settings):
    settings.LINK_PROXIES = ["10.0.0.250"]

    assert (await register_from("10.0.0.250", "10.0.0.9"))["type"] == "linked"
    refused = await register_from("10.0.0.250", "dns.example")
    assert "not an IP address" in refused["reason"]
