"""A replica's secret never travels on the broker in clear (issue 39 part 2): StartShard
carries it sealed to the certificate the node linked with (or, linked by token, under its
command key), and only that node opens it."""

from __future__ import annotations

import base64
import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from agent_worker.identity import NodeIdentity
from fleet import commands
from fleet.actions.certificates import issue_node_certificate, link_proven
from fleet.models import Node, NodeCertificate
from protocol.shard import ShardSpec
from protocol.signing import SealError, open_sealed, seal_to_certificate
from tests.factories import SETUP
from tests.fleet.queues import broker, clear_queue

pytestmark = pytest.mark.django_db

SECRET = "replica-secret-0123456789abcdef"


@pytest.fixture
def ca(tmp_path, settings):
    settings.LLMGW_CA_DIR = str(tmp_path / "ca")
    call_command("llmgw_ctl", "ca", "init", stdout=StringIO())


def onboarded(node_id: str, tmp_path: Path) -> NodeIdentity:
    issued = issue_node_certificate(node_id, actor=SETUP)
    (tmp_path / f"{node_id}.pem").write_bytes(issued.cert_pem)
    (tmp_path / f"{node_id}-key.pem").write_bytes(issued.key_pem)
    return NodeIdentity(str(tmp_path / f"{node_id}.pem"), str(tmp_path / f"{node_id}-key.pem"))


def spec(shard_id: str = "s-1") -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id="r-1", model="m", source="/m.gguf",
                     engine="llama.cpp", port=20000, api_key=SECRET)  # fmt: skip


def test_start_shard_on_the_wire_holds_the_secret_only_sealed_to_the_nodes_certificate(
    ca, tmp_path
):
    identity = onboarded("seal-a", tmp_path)
    other = onboarded("seal-b", tmp_path)
    serial = NodeCertificate.objects.get(node_id="seal-a").serial
    Node.objects.create(id="seal-a", key_generation=serial)
    clear_queue("seal-a")

    commands.send_start_shard("seal-a", spec())

    [raw] = broker().lrange("node-seal-a", 0, -1)
    message = json.loads(raw)
    body = base64.b64decode(message["body"])
    assert SECRET.encode() not in raw and SECRET.encode() not in body
    [spec_json], _kwargs, _embed = json.loads(body)
    sent = ShardSpec.model_validate_json(spec_json)
    assert sent.api_key == "" and sent.sealed_api_key.startswith("ec1:")
    assert open_sealed(sent.sealed_api_key, "s-1", private_key=identity.private_key) == SECRET
    with pytest.raises(SealError, match="sealed for another"):
        open_sealed(sent.sealed_api_key, "s-1", private_key=other.private_key)
    with pytest.raises(SealError, match="sealed for another"):  # moved into another shard
        open_sealed(sent.sealed_api_key, "s-2", private_key=identity.private_key)
    with pytest.raises(SealError, match="holds none"):
        open_sealed(sent.sealed_api_key, "s-1", command_key="k")
    clear_queue("seal-a")


def test_a_certificate_issued_before_is_kept_from_its_first_proven_link(ca, tmp_path):
    identity = onboarded("seal-c", tmp_path)
    NodeCertificate.objects.filter(node_id="seal-c").update(certificate_pem="")
    nonce = "n" * 32
    proof = identity.proof(nonce, "seal-c")

    link_proven(identity.cert_pem, "seal-c", nonce, base64.b64decode(proof["signature"]),
                actor=SETUP)  # fmt: skip

    kept = NodeCertificate.objects.get(node_id="seal-c").certificate_pem.encode()
    sealed = seal_to_certificate(kept, SECRET, "s-1")
    assert open_sealed(sealed, "s-1", private_key=identity.private_key) == SECRET
