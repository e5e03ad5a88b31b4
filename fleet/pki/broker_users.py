"""Each node's own Redis user on the broker: its queue and nothing else.

A node's agent consumes its commands from the broker, a Redis the control plane also keeps
its leases, liveness, quotas, sign-in lockouts, traffic, pub/sub and its own ``control``
queue on. With the control plane's password, one compromised node could read every other
node's commands and rewrite all of that. So ``onboard`` gives each node a user of its own
(``ACL SETUSER``), allowed the commands kombu and Celery's result backend send (the
scripts they run loaded by the control plane: a node loads none) and only the keys of its
own queue (``protocol.commands.node_broker_keys``: the list and its
priority lists, its bindings, its own unacknowledged-message keys, its results) and the
channels its results are announced on. Anything else answers ``NOPERM``.

The password is the node's alone: it is written into its bundle, and the control plane
keeps only its SHA-256 (on the node's certificate row), which is what ``ACL SETUSER``
takes (``#<hex>``). So the control plane can make the user again whenever Redis forgot it
(a restart without an ACL file, a flush): ``sync_broker_users`` runs on the reconciler's
beat. Revoking a node's certificates deletes its user; a new certificate brings a new
password. A user is named for the node and the broker's database number: Redis users are
server-wide, and two fleets (or test runs) may share a server, each on a database.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterable

import redis

from audit.redis import redis_client
from fleet.models import NodeCertificate
from protocol.commands import node_broker_keys, node_result_channels

log = logging.getLogger("llmgw.fleet.pki")

USER_PREFIX = "llmgw-node-"
# What kombu's Redis transport (consuming, acknowledging, restoring unacknowledged messages
# at shutdown, its lock around that: a Lua release) and Celery's Redis result backend (read,
# store and announce a result) send; measured against a real worker with ``ACL LOG``.
NODE_COMMANDS = (
    "ping", "select", "echo",
    "brpop", "lpush", "rpush", "llen", "lrange",
    "sadd", "smembers", "srem",
    "hset", "hget", "hdel",
    "zadd", "zrem", "zrange", "zrangebyscore", "zrevrangebyscore",
    "get", "set", "setex", "del", "exists", "pexpire", "expire",
    "multi", "exec", "discard", "watch", "unwatch",
    "publish",
    "evalsha",
)  # fmt: skip


def node_scripts() -> tuple[str, ...]:
    """The Lua scripts a node's worker runs by EVALSHA: redis-py's lock (kombu's around
    restoring unacknowledged messages) and kombu's binding refresh. A node may not load a
    script (one that loops would stall the broker for the whole fleet), so the control
    plane loads these for it, with each user it makes and on every pass of
    ``sync_broker_users`` (a restarted Redis keeps no script)."""
    from kombu.transport.redis import REFRESH_BINDING, SWEEP_BINDINGS
    from redis.lock import Lock

    return (Lock.LUA_RELEASE_SCRIPT, Lock.LUA_EXTEND_SCRIPT, Lock.LUA_REACQUIRE_SCRIPT,
            REFRESH_BINDING, SWEEP_BINDINGS)  # fmt: skip


def load_node_scripts(client: redis.Redis) -> None:
    for script in node_scripts():
        client.script_load(script)


class BrokerUserError(RuntimeError):
    """The broker would not make or delete a node's user, in words naming the fix."""


def user_name(node_id: str, database: int) -> str:
    return f"{USER_PREFIX}{database}-{node_id}"


def database_of(client: redis.Redis) -> int:
    return int(client.connection_pool.connection_kwargs.get("db") or 0)


def new_password() -> tuple[str, str]:
    """A new broker password and the SHA-256 (hex) the control plane keeps of it."""
    password = secrets.token_urlsafe(32)
    return password, password_sha256(password)


def password_sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def acl_rules(node_id: str, sha256: str) -> list[str]:
    """``ACL SETUSER``'s rules for ``node_id``: from nothing (``reset``), its password, its
    keys and channels, and its commands."""
    return [
        "reset",
        "on",
        f"#{sha256}",
        "resetchannels",
        *[f"~{key}" for key in node_broker_keys(node_id)],
        *[f"&{channel}" for channel in node_result_channels(node_id)],
        "-@all",
        *[f"+{command}" for command in NODE_COMMANDS],
    ]


# redis-py names itself on every connection (CLIENT SETINFO, Redis 7.2 and later); older
# servers do not know the subcommand, and redis-py goes on without it.
NAMES_ITSELF = "+client|setinfo"


def knows_setinfo(client: redis.Redis) -> bool:
    version = str(client.info("server").get("redis_version", "0"))
    return tuple(int(part) for part in version.split(".")[:2]) >= (7, 2)


def set_user(client: redis.Redis, node_id: str, sha256: str) -> None:
    rules = acl_rules(node_id, sha256)
    try:
        if knows_setinfo(client):
            rules.append(NAMES_ITSELF)
        client.execute_command("ACL", "SETUSER", user_name(node_id, database_of(client)),
                               *rules)  # fmt: skip
        load_node_scripts(client)
    except redis.ResponseError as exc:
        raise BrokerUserError(
            f"the broker refused to make {node_id}'s user ({exc}): the control plane's "
            "REDIS_URL must name a Redis 6.2 or later, as a user allowed ACL SETUSER"
        ) from exc


def delete_user(client: redis.Redis, node_id: str) -> bool:
    """Delete ``node_id``'s broker user; whether there was one."""
    return bool(client.execute_command("ACL", "DELUSER", user_name(node_id, database_of(client))))


def expected_users() -> dict[str, str]:
    """node id -> the password SHA-256 of its newest unrevoked certificate that has one."""
    rows = (
        NodeCertificate.objects.filter(revoked_at=None)
        .exclude(broker_password_sha256="")
        .order_by("node_id", "issued_at")
        .values_list("node_id", "broker_password_sha256")
    )
    return dict(rows)  # the newest of each node comes last, and wins


def ensure_node_user(node_id: str, client: redis.Redis | None = None) -> bool:
    """Make ``node_id``'s user from its newest unrevoked certificate; False if it has none."""
    sha256 = expected_users().get(node_id)
    if sha256 is None:
        return False
    set_user(client or redis_client(), node_id, sha256)
    return True


def delete_node_user(node_id: str) -> None:
    """After a revocation: never raises (``sync_broker_users`` deletes it on its next pass
    if Redis was away)."""
    try:
        delete_user(redis_client(), node_id)
    except redis.RedisError as exc:
        log.warning("could not delete %s's broker user yet: %s", node_id, exc)


def existing_users(client: redis.Redis) -> set[str]:
    """The node ids that have a user on ``client``'s database."""
    prefix = user_name("", database_of(client))
    names: Iterable[bytes | str] = client.execute_command("ACL", "USERS")
    found = (n.decode() if isinstance(n, bytes) else n for n in names)
    return {name[len(prefix) :] for name in found if name.startswith(prefix)}


def sync_broker_users(client: redis.Redis | None = None) -> dict[str, list[str]]:
    """Make the users Redis lacks (it keeps none across a restart without an ACL file) and
    delete those of nodes no longer let in; what was made and deleted."""
    client = client or redis_client()
    expected = expected_users()
    if expected:
        load_node_scripts(client)
    present = existing_users(client)
    made = sorted(set(expected) - present)
    for node_id in made:
        set_user(client, node_id, expected[node_id])
    deleted = sorted(present - set(expected))
    for node_id in deleted:
        delete_user(client, node_id)
    return {"made": made, "deleted": deleted}
