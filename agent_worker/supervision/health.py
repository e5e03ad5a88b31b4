"""Is a port listening yet, and does an engine answer its health check.

These talk only to engines on this node (or a rendezvous point on the fabric); never
through a proxy, which an HTTP_PROXY meant for the internet would otherwise be.
"""

from __future__ import annotations

import socket

import httpx

# llama-server answers 503 "Loading model" until the weights are in; a slow answer is
# not a ready one, so a short timeout loses nothing.
DEFAULT_HEALTH_TIMEOUT = 2.0
_WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


def connect_host(host: str) -> str:
    """Return the address to reach an engine that binds ``host`` (a wildcard means loopback)."""
    return _WILDCARDS.get(host, host)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Say whether host:port accepts a TCP connection within ``timeout`` seconds."""
    try:
        with socket.create_connection((connect_host(host), port), timeout=max(timeout, 0.01)):
            return True
    except OSError:
        return False


class HealthProbe:
    """GET an engine's health path; ready means 200."""

    def __init__(self, timeout: float = DEFAULT_HEALTH_TIMEOUT) -> None:
        self._client = httpx.Client(
            timeout=timeout, trust_env=False, headers={"User-Agent": "llmgw-agent"}
        )

    def check(self, host: str, port: int, path: str, api_key: str = "") -> tuple[bool, str]:
        """Return (ready, what the engine said), e.g. (False, "503 Loading model")."""
        address = connect_host(host)
        if ":" in address:
            address = f"[{address}]"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            response = self._client.get(f"http://{address}:{port}{path}", headers=headers)
        except httpx.TimeoutException:
            return False, f"GET {path} timed out"
        except (httpx.HTTPError, httpx.InvalidURL) as err:
            return False, f"GET {path} failed: {type(err).__name__}"
        if response.status_code == 200:
            return True, f"GET {path} answered 200"
        said = " ".join(response.text.split())[:120]
        return False, f"GET {path} answered {response.status_code} {said}".rstrip()

    def close(self) -> None:
        self._client.close()
