"""The agent takes its command key only from a control plane that proves itself.

Whatever answered "linked" used to hand the agent the key its commands are checked with:
anyone between the node and the control plane (or a node posing as one) could then sign
commands the agent obeys as root. The answer is now signed over the agent's own nonce:
with the node's token, or by a control plane's certificate from the node's CA.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent_worker import link as link_module
from agent_worker.identity import NodeIdentity
from agent_worker.link import AgentLink, LinkCallbacks
from fleet.pki import authority
from tests.agent.fake_control_plane import Canned, FakeControlPlane, Signer
from tests.support.polling import wait_until_async

TOKEN = "node01.the-token"


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(link_module, "backoff_delay", lambda rounds, rng=None: 0.05)


@pytest.fixture
def ca(tmp_path):
    directory = tmp_path / "ca"
    authority.init_ca(directory)
    return directory


def identity(ca, tmp_path, node_id: str = "node01") -> NodeIdentity:
    issued = authority.sign_node_certificate(node_id, directory=ca)
    (tmp_path / "node.pem").write_bytes(issued.cert_pem)
    (tmp_path / "node-key.pem").write_bytes(issued.key_pem)
    return NodeIdentity(str(tmp_path / "node.pem"), str(tmp_path / "node-key.pem"),
                        str(ca / authority.CA_CERT))  # fmt: skip


def run_against(plane: FakeControlPlane, *, token: str = "", node: NodeIdentity | None = None):
    """Link to ``plane`` until it has answered a register twice, then stop; the link."""

    async def scenario() -> AgentLink:
        await plane.start()
        link = AgentLink([plane.url], "node01", token, LinkCallbacks(
            register=lambda: Canned(type="register"), heartbeat=lambda: Canned(type="heartbeat")),
            heartbeat_interval=60, identity=node)  # fmt: skip
        task = asyncio.create_task(link.run())
        await wait_until_async(lambda: plane.links >= 2 or link.sessions >= 1)
        link.stop()
        await asyncio.wait_for(task, 5)
        await plane.stop()
        return link

    return asyncio.run(scenario())


def test_linked_without_a_proof_gives_no_command_key(caplog):
    caplog.set_level(logging.WARNING)
    plane = FakeControlPlane(command_key="the attacker's key", prove=False)
    link = run_against(plane, token=TOKEN)
    assert link.command_key == ""
    assert link.sessions == 0, "an impostor is no control plane to stay linked to"
    assert "did not prove itself (its answer carries no proof" in caplog.text
    assert "no command key taken" in caplog.text


def test_linked_proven_with_another_token_gives_no_command_key(caplog):
    plane = FakeControlPlane(command_key="the attacker's key", token="node01.a-guess")
    link = run_against(plane, token=TOKEN)
    assert link.command_key == ""
    assert "its signature does not match" in caplog.text


def test_linked_proven_with_the_nodes_token_gives_its_key():
    plane = FakeControlPlane(command_key="the real key", token=TOKEN)
    link = run_against(plane, token=TOKEN)
    assert (link.command_key, link.sessions) == ("the real key", 1)


def test_a_node_certificate_cannot_speak_for_the_control_plane(ca, tmp_path, caplog):
    # A compromised node holds a certificate from the same CA: it signs nothing for a
    # control plane, or any node could pose as one to the others.
    other = authority.sign_node_certificate("node02", directory=ca)
    plane = FakeControlPlane(command_key="the attacker's key",
                             signer=Signer(other.cert_pem, other.key_pem))  # fmt: skip
    link = run_against(plane, node=identity(ca, tmp_path))
    assert link.command_key == ""
    assert "not a control plane's" in caplog.text


def test_a_control_plane_of_another_ca_gives_no_command_key(ca, tmp_path, caplog):
    stranger_ca = tmp_path / "stranger-ca"
    authority.init_ca(stranger_ca)
    signer = Signer(*authority.link_signer(stranger_ca))
    plane = FakeControlPlane(command_key="the attacker's key", signer=signer)
    link = run_against(plane, node=identity(ca, tmp_path))
    assert link.command_key == ""
    assert "not signed by this node's llmgw CA" in caplog.text


def test_a_control_plane_of_the_nodes_ca_gives_its_key(ca, tmp_path):
    plane = FakeControlPlane(command_key="the real key", signer=Signer(*authority.link_signer(ca)))
    link = run_against(plane, node=identity(ca, tmp_path))
    assert (link.command_key, link.sessions) == ("the real key", 1)
