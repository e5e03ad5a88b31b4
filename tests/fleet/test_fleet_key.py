"""Node command keys and replica secrets come from the control plane's own fleet key, never
from SECRET_KEY: the router (which no longer loads SECRET_KEY at all) and anything else
that holds Django's key derive none of them."""

from __future__ import annotations

import stat
import uuid

import pytest

from fleet import commands
from fleet.pki.keys import command_key, replica_secret
from llmgw_site.settings import _fleet_key
from protocol.commands import Drain
from protocol.signing import verify
from tests.factories import make_node

pytestmark = pytest.mark.django_db


def test_command_keys_and_replica_secrets_do_not_follow_secret_key(settings):
    replica = uuid.uuid4()
    key, secret = command_key("node01", "1234"), replica_secret(replica)
    settings.SECRET_KEY = "what the router held"
    assert (command_key("node01", "1234"), replica_secret(replica)) == (key, secret)
    settings.LLMGW_FLEET_KEY = "another fleet's key"
    assert command_key("node01", "1234") != key
    assert replica_secret(replica) != secret


def test_a_command_key_belongs_to_one_certificate_of_one_node():
    assert command_key("node01", "1234") != command_key("node01", "5678")
    assert command_key("node01", "1234") != command_key("node02", "1234")


def test_commands_are_signed_with_the_key_of_the_certificate_the_node_linked_with(monkeypatch):
    make_node("node01", key_generation="1234")
    sent = {}
    monkeypatch.setattr(commands.current_app, "send_task",
                        lambda task, **kwargs: sent.update(task=task, **kwargs))  # fmt: skip
    commands.send_drain("node01", True)
    kwargs = sent["kwargs"]
    verify(command_key("node01", "1234"), sent["task"], sent["args"], kwargs["deadline"],
           kwargs["signature"], kwargs["command_id"])  # fmt: skip
    assert Drain.task == sent["task"]


def test_the_fleet_key_is_made_once_under_the_home_readable_by_its_owner_alone(tmp_path):
    first = _fleet_key(tmp_path, environ={})
    assert _fleet_key(tmp_path, environ={}) == first
    assert len(first) >= 43
    assert stat.S_IMODE((tmp_path / "fleet_key").stat().st_mode) == 0o600
    assert _fleet_key(tmp_path, environ={"LLMGW_FLEET_KEY": "set by the operator"}) == (
        "set by the operator"
    )
