"""Each node's own broker user, on the real Redis: its own queue's keys and result channels,
nothing of the control plane's and nothing of another node's (issue 39 part 1)."""

from __future__ import annotations

import time
import uuid
from io import StringIO

import pytest
import redis
import yaml
from django.conf import settings
from django.core.management import call_command

from audit.redis import redis_client
from core.redis_clients import channel_on
from core.redis_urls import parse_redis_url
from fleet.actions.certificates import revoke_node_certificates
from fleet.pki import broker_users
from protocol.commands import command_task_id, node_queue, unacked_keys
from protocol.rate_limits import counter_keys
from protocol.routing import ROUTING_CHANNEL, TRAFFIC_KEY_PREFIX
from tests.ctl import ctl

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes():
    """Two node ids of this test alone; their users deleted afterwards."""
    made = [f"bu-{uuid.uuid4().hex[:6]}", f"bu-{uuid.uuid4().hex[:6]}"]
    yield made
    for node_id in made:
        broker_users.delete_user(redis_client(), node_id)


def as_node(node_id: str, password: str) -> redis.Redis:
    client = redis_client()
    kwargs = client.connection_pool.connection_kwargs
    user = broker_users.user_name(node_id, broker_users.database_of(client))
    # The same server (TCP, TLS or the embedded Redis's unix socket), as the node's user.
    pool = redis.ConnectionPool(
        connection_class=client.connection_pool.connection_class,
        **{**kwargs, "username": user, "password": password, "socket_timeout": 5},
    )
    return redis.Redis(connection_pool=pool)


def refused(call) -> str:
    with pytest.raises(redis.exceptions.NoPermissionError) as caught:
        call()
    return str(caught.value)


def listen(client: redis.Redis, channel: str) -> None:
    pubsub = client.pubsub()
    pubsub.subscribe(channel)
    pubsub.get_message(timeout=1)  # the refusal comes as the subscription's answer


def test_a_nodes_user_reaches_its_own_queue_and_results_only(nodes):
    mine, other = nodes
    password, sha256 = broker_users.new_password()
    broker_users.set_user(redis_client(), mine, sha256)
    broker_users.set_user(redis_client(), other, broker_users.new_password()[1])
    node = as_node(mine, password)
    admin = redis_client()
    admin.lpush(node_queue(other), "another node's command")
    admin.hset("unacked", "tag", "a command in flight")

    # What its worker does: take from its queue, hold it unacknowledged, store a result.
    node.lpush(node_queue(mine), "x")
    assert node.brpop([node_queue(mine), f"{node_queue(mine)}\x06\x163"], 1)[1] == b"x"
    unacked = unacked_keys(mine)
    with node.pipeline() as pipe:
        pipe.zadd(unacked["unacked_index_key"], {"tag": time.time()})
        pipe.hset(unacked["unacked_key"], "tag", "{}").execute()
    result = f"celery-task-meta-{command_task_id(mine, uuid.uuid4().hex)}"
    node.setex(result, 60, "{}")
    node.publish(result, "{}")

    lease = settings.LEADER_LEASE_KEY
    quota = counter_keys("llmgw-abc", time.time()).day
    attempts = {
        "another node's queue": lambda: node.lrange(node_queue(other), 0, -1),
        "another node's priority queue": lambda: node.llen(f"{node_queue(other)}\x06\x163"),
        "the shared unacked hash": lambda: node.hgetall("unacked"),
        "another node's unacked": lambda: node.hgetall(unacked_keys(other)["unacked_key"]),
        "another node's result": lambda: node.get(
            f"celery-task-meta-{command_task_id(other, 'x')}"
        ),
        "the leader lease (read)": lambda: node.get(lease),
        "the leader lease (write)": lambda: node.set(lease, "me"),
        "a quota counter": lambda: node.delete(quota),
        "a quota counter by script": lambda: node.eval("return 1", 1, quota),
        "the traffic hash": lambda: node.hset(f"{TRAFFIC_KEY_PREFIX}m", "r", 1),
        "the sign-in lockouts": lambda: node.delete("llmgw:sign-in:admin"),
        "the routing channel": lambda: node.publish(channel_on(admin, ROUTING_CHANNEL), "x"),
        "the control queue": lambda: node.lpush("control", "{}"),
        "listing keys": lambda: node.keys("*"),
        "flushing": lambda: node.flushdb(),
        "its own rights": lambda: node.execute_command("ACL", "SETUSER", "x", "on"),
        "listening on the routing channel": lambda: listen(node, ROUTING_CHANNEL),
        # A script that loops stalls the broker for every node and the control plane.
        "loading a script": lambda: node.script_load("while true do end"),
        "running a script of its own": lambda: node.eval("while true do end", 0),
        "flushing the scripts": lambda: node.script_flush(),
    }
    for what, attempt in attempts.items():
        try:
            refused(attempt)
        except pytest.fail.Exception:
            pytest.fail(f"{what}: not refused")
    admin.delete(node_queue(other), "unacked", result, *unacked.values())


def test_a_nodes_worker_runs_the_scripts_it_needs_though_it_may_load_none(nodes):
    """kombu holds a lock around restoring unacknowledged messages; redis-py releases it
    by EVALSHA, which works on the scripts the control plane loaded, also after Redis
    forgot them (the next sync loads them again)."""
    mine = nodes[0]
    password, sha256 = broker_users.new_password()
    admin = redis_client()
    broker_users.set_user(admin, mine, sha256)
    node = as_node(mine, password)
    mutex = unacked_keys(mine)["unacked_mutex_key"]
    admin.script_flush()  # as a restarted Redis: no script cached
    lock = node.lock(mutex, timeout=10)
    assert lock.acquire(blocking=False)
    refused(lock.release)  # not cached, and the node may not load it
    broker_users.load_node_scripts(admin)  # what each pass of sync_broker_users does
    lock.release()  # EVALSHA of redis-py's release script, loaded for the node
    assert node.get(mutex) is None


def onboard(node_id: str, bundle, *extra: str) -> dict:
    ctl("onboard", node_id, "--servers", "wss://cp:8443", "--broker",
        "rediss://:control-plane-secret@r:6380/0", "--out", str(bundle), "--certificate-only",
        *extra)  # fmt: skip
    return yaml.safe_load((bundle / "agent.yaml").read_text())


@pytest.fixture
def ca(tmp_path, settings):
    settings.LLMGW_CA_DIR = str(tmp_path / "ca")
    call_command("llmgw_ctl", "ca", "init", stdout=StringIO())


def test_onboarding_makes_the_nodes_user_and_revoking_deletes_it(
    ca, nodes, tmp_path, django_capture_on_commit_callbacks
):
    node_id = nodes[0]
    agent = onboard(node_id, tmp_path / "b")

    url = parse_redis_url(agent["broker"])
    assert "control-plane-secret" not in agent["broker"]
    password = agent["broker"].split("@")[0].rsplit(":", 1)[1]
    user = broker_users.user_name(node_id, broker_users.database_of(redis_client()))
    assert agent["broker"].startswith(f"rediss://{user}:") and url.scheme == "rediss"
    assert (tmp_path / "b" / "agent.yaml").stat().st_mode & 0o077 == 0
    assert as_node(node_id, password).ping()
    assert node_id in broker_users.existing_users(redis_client())

    with django_capture_on_commit_callbacks(execute=True):
        revoke_node_certificates(node_id, actor=None)
    assert node_id not in broker_users.existing_users(redis_client())
    with pytest.raises(redis.exceptions.AuthenticationError):
        as_node(node_id, password).ping()


def test_a_forgotten_user_is_made_again_and_a_revoked_ones_deleted(ca, nodes, tmp_path):
    kept, revoked = nodes
    password = onboard(kept, tmp_path / "a")["broker"].split("@")[0].rsplit(":", 1)[1]
    onboard(revoked, tmp_path / "b")
    revoke_node_certificates(revoked, actor=None)
    client = redis_client()
    broker_users.delete_user(client, kept)  # as a Redis restart without an ACL file does
    broker_users.set_user(client, revoked, "0" * 64)  # a deletion that did not happen

    done = broker_users.sync_broker_users()

    assert kept in done["made"] and revoked in done["deleted"]
    assert as_node(kept, password).ping()
    assert revoked not in broker_users.existing_users(client)


def test_reusing_a_bundle_renews_its_broker_password(ca, nodes, tmp_path):
    node_id = nodes[0]
    first = onboard(node_id, tmp_path / "b")["broker"]
    again = onboard(node_id, tmp_path / "b", "--reuse")["broker"]
    assert again != first
    assert as_node(node_id, again.split("@")[0].rsplit(":", 1)[1]).ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        as_node(node_id, first.split("@")[0].rsplit(":", 1)[1]).ping()
