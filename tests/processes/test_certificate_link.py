"""Real TLS on loopback with certificates from `ca init`, `ca server-cert` and `onboard`:
daphne serves wss:// itself, agents prove themselves by their node certificates, and every
refusal is said, on both sides, in words that name what is wrong."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from io import StringIO
from pathlib import Path

import pytest
import yaml
from celery import current_app
from django.core.management import call_command
from django.utils import timezone

from fleet import commands
from fleet.actions.certificates import issue_node_certificate
from fleet.models import Node
from fleet.pki.authority import init_ca
from fleet.pki.keys import command_key
from fleet.pki.tokens import node_token
from protocol.commands import ENGINE_CHECK
from protocol.signing import sign
from tests.factories import SETUP
from tests.processes.support import (
    Process,
    agent,
    control_plane,
    free_port,
    listening,
    wait_until,
)

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def ctl(*args: str) -> None:
    call_command("llmgw_ctl", *args, stdout=StringIO())


def agent_file(directory: Path, server: str, ca: Path, cert: bytes, key: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "node.pem").write_bytes(cert)
    (directory / "node-key.pem").write_bytes(key)
    data = {"servers": [server], "tls": {"ca": str(ca), "cert": str(directory / "node.pem"),
                                         "key": str(directory / "node-key.pem")}}  # fmt: skip
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def start_agent(processes, tmp_path: Path, node_id: str, config: Path) -> Process:
    # No token at all: the certificate is the only proof the agent has.
    worker = agent(node_id, "", "", tmp_path / node_id, tmp_path, LLMGW_AGENT_CONFIG=str(config))
    processes.append(worker.start())
    return worker


def test_agents_link_by_certificate_and_wrong_ones_are_refused_by_name(
    processes, tmp_path, settings
):
    ca_dir = tmp_path / "ca"
    settings.LLMGW_CA_DIR = str(ca_dir)
    ctl("ca", "init")
    ctl("ca", "server-cert", "127.0.0.1", "localhost", "--out", str(tmp_path / "server"))
    port = free_port()
    server = f"wss://127.0.0.1:{port}"
    tls = (tmp_path / "server" / "server.pem", tmp_path / "server" / "server-key.pem")
    cp_env = {"LLMGW_CA_DIR": str(ca_dir), "LLMGW_NODE_AUTH": "certificate"}
    processes.append(control_plane(port, tmp_path, tls=tls, **cp_env).start())
    wait_until(lambda: listening(port), 60, "the control plane on TLS")
    ca = ca_dir / "ca.pem"
    suffix = uuid.uuid4().hex[:6]
    good, thief, stale, stranger, revoked, wary = (
        f"{name}-{suffix}" for name in ("good", "thief", "stale", "stranger", "revoked", "wary")
    )

    def issued(node_id: str, **kwargs) -> tuple[bytes, bytes]:
        made = issue_node_certificate(node_id, actor=SETUP, **kwargs)
        return made.cert_pem, made.key_pem

    configs = {
        good: agent_file(tmp_path / good, server, ca, *issued(good)),
        # Claims its own name with the good node's certificate and key.
        thief: agent_file(tmp_path / thief, server, ca, *issued(good)),
        stale: agent_file(tmp_path / stale, server, ca, *issued(
            stale, days=30, now=timezone.now() - dt.timedelta(days=60))),
        revoked: agent_file(tmp_path / revoked, server, ca, *issued(revoked)),
    }  # fmt: skip
    # Another CA: a stranger's certificate, and an agent that trusts only that CA.
    settings.LLMGW_CA_DIR = str(tmp_path / "other-ca")
    init_ca()
    configs[stranger] = agent_file(tmp_path / stranger, server, ca, *issued(stranger))
    settings.LLMGW_CA_DIR = str(ca_dir)
    configs[wary] = agent_file(tmp_path / wary, server, tmp_path / "other-ca" / "ca.pem",
                               *issued(wary))  # fmt: skip
    workers = {node: start_agent(processes, tmp_path, node, config)
               for node, config in configs.items() if node != revoked}  # fmt: skip

    wait_until(lambda: Node.objects.filter(id=good, state="connected").exists(), 60,
             "the good node to link over TLS")  # fmt: skip
    # Its commands are signed with the key the proven link gave it.
    assert commands.engine_check(good, "nothing")["output"].startswith("nothing is not installed")
    expiry = (timezone.now() - dt.timedelta(days=30)).strftime("%Y-%m-%d")
    said = {
        thief: f"the agent claims node '{thief}' with the certificate of node '{good}'",
        stale: f"certificate expired on {expiry}",
        stranger: "claims CN=llmgw CA as issuer but is not signed by this llmgw CA",
        wary: "certificate verify failed",
    }
    for node, words in said.items():
        wait_until(lambda w=workers[node], t=words: t in w.output(), 60, f"{node} to be refused")
        assert not Node.objects.filter(id=node).exists()
    for node in (thief, stale, stranger):  # the control plane says so too
        wait_until(lambda t=said[node]: t in processes[0].output(), 10, "the control plane's log")

    # Revoked: refused from then on, without restarting the control plane.
    ctl("ca", "revoke", revoked)
    workers[revoked] = start_agent(processes, tmp_path, revoked, configs[revoked])
    wait_until(lambda: "was revoked on" in workers[revoked].output(), 30, "the revoked refusal")
    assert not Node.objects.filter(id=revoked).exists()


def test_revoking_a_linked_node_closes_its_link_and_leaves_its_old_key_and_token_nothing(
    processes, tmp_path, settings
):
    """`ca revoke` of a linked node, end to end: its link closes at once (the notice; the
    database's own look comes only every 30 s), its token is refused, and once it is
    onboarded again, a command signed with the key it had before is refused."""
    settings.LLMGW_CA_DIR = str(tmp_path / "ca")
    ctl("ca", "init")
    ctl("ca", "server-cert", "127.0.0.1", "localhost", "--out", str(tmp_path / "server"))
    port = free_port()
    server = f"wss://127.0.0.1:{port}"
    tls = (tmp_path / "server" / "server.pem", tmp_path / "server" / "server-key.pem")
    # Token mode takes certificates too: a stolen node may still hold its token.
    processes.append(control_plane(port, tmp_path, tls=tls, LLMGW_CA_DIR=settings.LLMGW_CA_DIR,
                                   LLMGW_NODE_AUTH="token").start())  # fmt: skip
    wait_until(lambda: listening(port), 60, "the control plane on TLS")
    node = f"stolen-{uuid.uuid4().hex[:6]}"
    ca = tmp_path / "ca" / "ca.pem"

    def onboarded() -> Process:
        made = issue_node_certificate(node, actor=SETUP)
        config = agent_file(tmp_path / node, server, ca, made.cert_pem, made.key_pem)
        worker = start_agent(processes, tmp_path, node, config)
        wait_until(lambda: Node.objects.filter(id=node, state="connected").exclude(
            key_generation="").exists(), 60, f"{node} to link")  # fmt: skip
        return worker

    stolen = onboarded()
    old_key = command_key(node, Node.objects.get(id=node).key_generation)
    ctl("ca", "revoke", node)
    # The link's own process hears the notice and closes it: seconds, not the 30 s recheck.
    wait_until(lambda: "was revoked; the link is closed" in stolen.output(), 5,
               "the revoked node's link to close")  # fmt: skip
    wait_until(lambda: "was revoked on" in stolen.output(), 30, "its next link to be refused")
    stolen.stop()

    by_token = agent(f"{node}", server, node_token(node), tmp_path / "by-token", tmp_path,
                     LLMGW_AGENT_CA=str(ca))  # fmt: skip
    processes.append(by_token.start())
    wait_until(lambda: f"node {node} was revoked (llmgw_ctl ca revoke), and its token with it"
               in by_token.output(), 60, "its token to be refused")  # fmt: skip
    by_token.stop()

    renewed = onboarded()
    assert command_key(node, Node.objects.get(id=node).key_generation) != old_key
    deadline, command_id = time.time() + 60, uuid.uuid4().hex
    forged = sign(old_key, ENGINE_CHECK, ["llama.cpp"], deadline, command_id)
    current_app.send_task(ENGINE_CHECK, args=["llama.cpp"], queue=commands.node_queue(node),
                          kwargs={"deadline": deadline, "signature": forged,
                                  "command_id": command_id})  # fmt: skip
    wait_until(lambda: "was not signed for this node" in renewed.output(), 60,
               "the old key's command to be refused")  # fmt: skip
    # Its new key works.
    assert commands.engine_check(node, "nothing")["output"].startswith("nothing is not installed")
