"""A catalog editor is not root on nodes (issue 39 part 6), tried through the REST API.

An operator who is no engine admin, with an API token of their own, asks the leading
control plane from the services host for what would make every node run or delete
something: an engine version that climbs out of the engines directory, a build whose apt
package is an apt option, and a profile whose ``env`` preloads a library. Each must be
refused (403, or a 400 naming the field) and change nothing.
"""

from __future__ import annotations

import ssl
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.hostile.rows import Row, attempt, run_alone
from llmgw_cli.sim import hosts, network
from llmgw_cli.sim.state import Fleet

MANAGE = str(Path(__file__).resolve().parents[2] / "manage.py")
ATTACKER = "mallory"
MAKE_OPERATOR = (
    "from django.contrib.auth.models import Group, User; "
    f"user, _ = User.objects.get_or_create(username={ATTACKER!r}); "
    "user.groups.add(Group.objects.get_or_create(name='operators')[0])"
)
TRAVERSAL = {"name": "llama.cpp", "version": "b1/../../x", "builds": []}
APT_OPTION = {
    "name": "llama.cpp", "version": "b9999",
    "builds": [{"name": "cpu", "url": "https://example.org/llama-b9999.tar.gz",
                "sha256": "ab" * 32, "packages": ["-oAPT::Update::Pre-Invoke::=touch /x"]}],
}  # fmt: skip
PRELOAD = {"env": {"LD_PRELOAD": "/tmp/evil.so"}}


def attempts(fleet: Fleet, scene: Any = None) -> Iterator[Row]:
    leader = hosts.CONTROL_PLANES[0]
    try:
        token = operator_token(fleet, leader)
    except RuntimeError as exc:
        yield Row("apply a catalog as an operator who is no engine admin", hosts.SERVICES,
                  False, f"the attempt could not be made: {exc}")  # fmt: skip
        return
    api = Api(fleet, leader, token)
    yield _attempt("add an engine version b1/../../x (a path out of the engines directory)",
                   lambda: api.refused("POST", "/engines/", TRAVERSAL))  # fmt: skip
    yield _attempt("add an engine build whose apt package is an apt option",
                   lambda: api.refused("POST", "/engines/", APT_OPTION))  # fmt: skip
    yield _attempt("set LD_PRELOAD in a profile's env", lambda: api.refused_on_profile(PRELOAD))


def _attempt(what: str, attack: Callable[[], tuple[bool, str]]) -> Row:
    return attempt(f"{what}, as an operator who is no engine admin", hosts.SERVICES, attack)


def operator_token(fleet: Fleet, leader: str) -> str:
    """An account in the operators group alone, and an API token of its own."""
    made = fleet.run(leader, [sys.executable, MANAGE, "shell", "-c", MAKE_OPERATOR])
    if made.returncode != 0:
        raise RuntimeError(f"making {ATTACKER} failed: {made.stderr[-300:]}")
    issued = fleet.run(leader, [sys.executable, MANAGE, "llmgw_ctl", "api-tokens", "create",
                                ATTACKER])  # fmt: skip
    if issued.returncode != 0 or not issued.stdout.strip():
        raise RuntimeError(f"issuing {ATTACKER} a token failed: {issued.stderr[-300:]}")
    return issued.stdout.strip().splitlines()[0].strip()


class Api:
    """The leader's REST API, reached from the services host with the attacker's token."""

    def __init__(self, fleet: Fleet, leader: str, token: str) -> None:
        tls = fleet.env[hosts.SERVICES]["REDIS_URL"].startswith("rediss://")  # the sim's TLS
        address = fleet.host(leader).address
        self.base = f"{'https' if tls else 'http'}://{address}:{hosts.CONTROL_PORT}/api/v1"
        ca = next(env["LLMGW_AGENT_CA"] for env in fleet.env.values() if "LLMGW_AGENT_CA" in env)
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca) if tls else True
        self.headers = {"Authorization": f"Token {token}"}

    def call(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        def send() -> httpx.Response:
            return httpx.request(method, self.base + path, json=body, headers=self.headers,
                                 verify=self.verify, timeout=30)  # fmt: skip

        return network.in_host(hosts.SERVICES, send)

    def refused(self, method: str, path: str, body: dict) -> tuple[bool, str]:
        answer = self.call(method, path, body)
        return answer.status_code in (400, 403), f"HTTP {answer.status_code}: {answer.text[:120]!r}"

    def refused_on_profile(self, change: dict) -> tuple[bool, str]:
        profiles = self.call("GET", "/profiles/")
        if profiles.status_code != 200:
            return False, f"listing profiles answered HTTP {profiles.status_code}"
        rows = profiles.json()
        rows = rows.get("results", rows) if isinstance(rows, dict) else rows
        if not rows:
            return False, "no profile to change"
        blocked, detail = self.refused("PATCH", f"/profiles/{rows[0]['id']}/", change)
        after = self.call("GET", f"/profiles/{rows[0]['id']}/").json()
        if "LD_PRELOAD" in (after.get("env") or {}):
            return False, f"{detail}; and the profile's env now holds LD_PRELOAD"
        return blocked, detail


if __name__ == "__main__":  # this module alone, against a running `llmgw sim up`
    run_alone(attempts)
