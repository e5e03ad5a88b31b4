"""/metrics is nobody's without the token (review finding 20), tried from a node host.

The router's /metrics sits on the public /v1 port and lists every model, replica and
breaker; the control plane's lists nodes and GPUs. An anonymous scrape of either, and one
with a made-up token, must get 401 and no metric.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

from bench.hostile.rows import Row, attempt
from llmgw_cli.sim import hosts, network
from llmgw_cli.sim.state import Fleet


def attempts(fleet: Fleet, scene: Any = None) -> Iterator[Row]:
    node = fleet.nodes[0].name
    leader = fleet.host(hosts.CONTROL_PLANES[0]).address
    tls = fleet.env[hosts.SERVICES]["REDIS_URL"].startswith("rediss://")  # the sim's TLS
    control = f"{'https' if tls else 'http'}://{leader}:{hosts.CONTROL_PORT}/metrics"
    targets = [("the router's", f"{fleet.router_url}/metrics"),
               ("the leading control plane's", control)]  # fmt: skip
    tries = [({}, "without a token"), ({"Authorization": "Bearer guessed"}, "with a made-up token")]
    for name, url in targets:
        for headers, how in tries:
            yield attempt(
                f"scrape {name} /metrics {how}", node,
                lambda u=url, h=headers: network.in_host(node, lambda: refused(u, h)),
            )  # fmt: skip


def refused(url: str, headers: dict[str, str]) -> tuple[bool, str]:
    # verify=False: the wall is the token, not the certificate this probe would check.
    answer = httpx.get(url, headers=headers, timeout=10, verify=False)  # noqa: S501
    leaked = "llmgw_" in answer.text
    return answer.status_code == 401 and not leaked, f"HTTP {answer.status_code}" + (
        ", metrics in the body" if leaked else ""
    )


if __name__ == "__main__":  # this module alone, against a running `llmgw sim up`
    from bench.hostile.rows import run_alone

    run_alone(attempts)
