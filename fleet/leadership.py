"""One leader among control planes, elected through a Redis lease with an epoch.

The lease (15 s, renewed every few seconds by the reconciler's beat) names the
holder and carries an epoch that grows with every new holder. Commands and state
writes carry the epoch; a leader that lost its lease sees a newer epoch and stops
writing. A standby refuses agent links and names the leader, so agents move on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis
from django.conf import settings

from audit.redis import redis_client

log = logging.getLogger("llmgw.leadership")

LEASE_SECONDS = 15
# Outlives any grace it gives; a control plane that stopped for good leaves no key behind.
LINKS_SINCE_TTL = 24 * 3600

# Take the lease if free, or extend it if we hold it; answer holder and epoch. A new
# epoch is above ARGV[3], the highest the database knows was granted.
_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder == false then
    local epoch = redis.call('INCR', KEYS[2])
    local floor = tonumber(ARGV[3])
    if epoch <= floor then
        epoch = floor + 1
        redis.call('SET', KEYS[2], epoch)
    end
    redis.call('SET', KEYS[1], ARGV[1] .. '|' .. epoch, 'PX', ARGV[2])
    return {ARGV[1] .. '|' .. epoch, 1}
end
local name = string.match(holder, '^(.*)|')
if name == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {holder, 0}
end
return {holder, 0}
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Lease:
    holder: str
    epoch: int
    acquired_now: bool = False


def _keys() -> tuple[str, str]:
    """The lease and epoch keys; one cluster's control planes share them."""
    return settings.LEADER_LEASE_KEY, settings.LEADER_LEASE_KEY + ":epoch"


def identity() -> str:
    """This control plane's name in the lease: the address agents should use to reach it."""
    return settings.CONTROL_PLANE_ID


def client() -> redis.Redis:
    return redis_client()


def acquire_or_renew(me: str | None = None, conn: redis.Redis | None = None) -> Lease:
    """Take or extend the lease; the answer says who holds it and at which epoch."""
    me = me or identity()
    conn = conn or client()
    lease_key, epoch_key = _keys()
    floor = _highest_granted(lease_key)
    raw, fresh = conn.eval(_ACQUIRE, 2, lease_key, epoch_key, me, LEASE_SECONDS * 1000, floor)
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    holder, _, epoch = text.rpartition("|")
    lease = Lease(holder=holder, epoch=int(epoch), acquired_now=bool(fresh))
    if lease.holder == me and lease.epoch > floor:
        _record_granted(lease_key, lease.epoch)
    if lease.acquired_now:
        log.warning("%s is now the leader (epoch %d)", me, lease.epoch)
        conn.set(f"{lease_key}:since:{lease.epoch}", str(time.time()), ex=3600)
    return lease


def _highest_granted(lease_key: str) -> int:
    from fleet.models import LeaderEpoch

    row = LeaderEpoch.objects.filter(lease_key=lease_key).values_list("highest", flat=True)
    return row.first() or 0


def _record_granted(lease_key: str, epoch: int) -> None:
    """Remember ``epoch`` before acting under it (on every renewal until it is written)."""
    from fleet.models import LeaderEpoch

    LeaderEpoch.objects.get_or_create(lease_key=lease_key)
    LeaderEpoch.objects.filter(lease_key=lease_key, highest__lt=epoch).update(highest=epoch)


def current(conn: redis.Redis | None = None) -> Lease | None:
    raw = (conn or client()).get(_keys()[0])
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    holder, _, epoch = text.rpartition("|")
    return Lease(holder=holder, epoch=int(epoch))


def still_leading(epoch: int, me: str | None = None, conn: redis.Redis | None = None) -> bool:
    """Check before a write: a stale leader's writes are refused."""
    lease = current(conn)
    return lease is not None and lease.holder == (me or identity()) and lease.epoch == epoch


def release(me: str | None = None, conn: redis.Redis | None = None) -> None:
    conn = conn or client()
    lease = current(conn)
    if lease and lease.holder == (me or identity()):
        conn.eval(_RELEASE, 1, _keys()[0], f"{lease.holder}|{lease.epoch}")


def leader_since(epoch: int, conn: redis.Redis | None = None) -> float | None:
    return _float((conn or client()).get(f"{_keys()[0]}:since:{epoch}"))


def record_links_opened(at: float | None = None, me: str | None = None) -> None:
    """Say when this control plane began taking agent links: once per leader term.

    Only the first start under a term's lease counts. Every start ran this, and gave every
    node a fresh NODE_LOST_AFTER: a process that crash-looped faster than that (or a
    second process starting) held lost-node detection off for the whole fleet. Without a
    lease there is no term yet, and the leader's own start will give the grace.

    Never raises: without Redis there is no lease either, and the next leader's grace
    covers the silence.
    """
    try:
        conn = client()
        lease = current(conn)
        if lease is None:
            return
        key = _links_since_key(me or identity(), lease.epoch)
        conn.set(key, str(time.time() if at is None else at), ex=LINKS_SINCE_TTL, nx=True)
    except redis.RedisError as exc:
        log.warning("could not record when this control plane began taking links: %s", exc)


def record_deaf(at: float | None = None, me: str | None = None) -> None:
    """Say that this control plane heard no node at all just now (a mass silence it held
    back for): until it hears them again, nobody could be heard."""
    client().set(_deaf_key(me or identity()), str(time.time() if at is None else at),
                 ex=LINKS_SINCE_TTL)  # fmt: skip


def listening_since(lease: Lease, now: float | None = None) -> float | None:
    """Since when the nodes could be heard without a break: the latest of when this
    epoch's leader took the lease, when its control plane first took links in this term,
    and when it last heard no node at all. A node still reconnecting after any of them (on
    its own jittered backoff) is given a full NODE_LOST_AFTER from then.

    A time in the future is no time any of them happened: anything that can write to
    Redis could set one to hold detection off for good, so it is ignored.
    """
    now = time.time() if now is None else now
    conn = client()
    times = [
        leader_since(lease.epoch, conn),
        _float(conn.get(_links_since_key(lease.holder, lease.epoch))),
        _float(conn.get(_deaf_key(lease.holder))),
    ]
    known = [at for at in times if at is not None and at <= now]
    return max(known) if known else None


def _links_since_key(holder: str, epoch: int) -> str:
    return f"{_keys()[0]}:links-since:{holder}:{epoch}"


def _deaf_key(holder: str) -> str:
    return f"{_keys()[0]}:deaf-at:{holder}"


def _float(raw: bytes | str | None) -> float | None:
    return float(raw) if raw else None


def leader_for_links() -> str | None:
    """None when this control plane may accept agent links; else who leads.

    With no lease at all (the reconciler not yet up), links are accepted: refusing
    every node while nobody leads would help no one.
    """
    try:
        lease = current()
    except redis.RedisError:
        return None
    if lease is None or lease.holder == identity():
        return None
    return lease.holder
