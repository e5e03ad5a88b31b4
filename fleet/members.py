"""The routers and control planes: who they are, and the addresses engines must admit.

Routers say so in their in-flight reports; control planes in a key each of their own,
written by ``report_control_plane`` (a thread every daphne starts). ``heard_members``
reads both back for the leader's pass, which keeps them as ``FleetMember`` rows
(``fleet.actions.members``); ``engine_callers`` is what every node's walls then admit.

A member that stops cleanly says so and leaves at the next pass. One unheard for
MEMBER_GRACE leaves too; not sooner, because a router's report lapses whenever Redis
restarts or the router stalls for a few seconds, and walling it out then would fail its
requests.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from audit.redis import redis_client
from core.addresses import own_addresses
from protocol.members import (
    CONTROL_PLANE,
    LEFT_KEY_PREFIX,
    LEFT_TTL,
    MEMBER_KEY_PREFIX,
    MEMBER_REFRESH,
    MEMBER_TTL,
    ROUTER,
)
from protocol.routing import INFLIGHT_KEY_PREFIX

log = logging.getLogger("llmgw.fleet.members")

MEMBER_GRACE = timedelta(seconds=60)


@dataclass(frozen=True)
class Heard:
    """What Redis holds of the members now: those reporting, and those that said they left."""

    present: dict[str, list[str]]  # "<role>:<id>" -> its addresses
    left: set[str]


def member_id(role: str, own_id: str) -> str:
    return f"{role}:{own_id}"


def heard_members() -> Heard | None:
    """Every router's and control plane's latest word; None when Redis cannot be read
    (nothing is known: no member is taken out for that)."""
    try:
        client = redis_client()
        present = _addresses_under(client, INFLIGHT_KEY_PREFIX, ROUTER)
        present.update(_addresses_under(client, MEMBER_KEY_PREFIX + CONTROL_PLANE + ":",
                                        CONTROL_PLANE))  # fmt: skip
        left = {
            key.decode().removeprefix(LEFT_KEY_PREFIX)
            for key in client.scan_iter(match=LEFT_KEY_PREFIX + "*", count=100)
        }
    except Exception as exc:
        log.warning("could not read the routers' and control planes' reports: %s", exc)
        return None
    return Heard(present, left)


def _addresses_under(client, prefix: str, role: str) -> dict[str, list[str]]:
    keys = list(client.scan_iter(match=prefix + "*", count=100))
    values = client.mget(keys) if keys else []
    found = {}
    for key, value in zip(keys, values, strict=True):
        if value is None:
            continue  # expired between the scan and the read
        try:
            addresses = [str(a) for a in json.loads(value).get("addresses", [])]
        except (ValueError, TypeError, AttributeError):
            log.warning("ignoring a malformed report under %s", key)
            continue
        found[member_id(role, key.decode().removeprefix(prefix))] = _valid(addresses, key)
    return found


def _valid(addresses: list[str], key: bytes) -> list[str]:
    good = []
    for address in addresses:
        try:
            good.append(str(ipaddress.ip_address(address)))
        except ValueError:
            log.warning("ignoring %r under %s: not an IP address", address, key)
    return good


def engine_callers(now: datetime | None = None) -> list[str]:
    """The addresses (and networks) every engine's HTTP port admits: the members heard
    within MEMBER_GRACE that did not leave, and LLMGW_ENGINE_CALLERS."""
    from django.utils import timezone

    from fleet.models import FleetMember

    now = now or timezone.now()
    live = FleetMember.objects.filter(left_at__isnull=True, seen_at__gte=now - MEMBER_GRACE)
    found = {str(a) for addresses in live.values_list("addresses", flat=True) for a in addresses}
    for extra in settings.ENGINE_CALLERS:
        try:
            found.add(str(ipaddress.ip_network(extra, strict=False)))
        except ValueError:
            if extra not in _said:  # once a process, not every pass
                _said.add(extra)
                log.warning("LLMGW_ENGINE_CALLERS: %r is no address or network; left out", extra)
    return sorted(found)


_said: set[str] = set()


# The control plane's own report: one key per process, refreshed by a daemon thread.

_reporter: threading.Thread | None = None


def report_control_plane(own_id: str) -> None:
    """Write this control plane's addresses now and every MEMBER_REFRESH seconds, and that
    it left as the process exits; once per process."""
    global _reporter
    if _reporter is not None:
        return
    key = MEMBER_KEY_PREFIX + member_id(CONTROL_PLANE, own_id)
    _reporter = threading.Thread(target=_keep_reporting, args=(key,), daemon=True,
                                 name="llmgw-member")  # fmt: skip
    _reporter.start()
    atexit.register(_say_left, CONTROL_PLANE, own_id)


def _keep_reporting(key: str) -> None:
    complained = False
    while True:
        body = json.dumps({"at": time.time(), "addresses": own_addresses()})
        try:
            redis_client().set(key, body, ex=MEMBER_TTL)
            complained = False
        except Exception as exc:
            if not complained:
                log.warning("could not report this control plane's addresses: %s", exc)
                complained = True
        time.sleep(MEMBER_REFRESH)


def _say_left(role: str, own_id: str) -> None:
    try:
        client = redis_client()
        client.delete(MEMBER_KEY_PREFIX + member_id(role, own_id))
        client.set(LEFT_KEY_PREFIX + member_id(role, own_id), str(time.time()), ex=LEFT_TTL)
    except Exception as exc:
        log.warning("could not say this control plane left: %s", exc)
