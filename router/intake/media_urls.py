"""Media URLs a request asks an engine to fetch: refused when they point inside the fleet.

vLLM and SGLang fetch an ``image_url`` (audio, video, a file) themselves, from the node
they run on, inside the fleet's network: a URL at loopback, a link-local address (the
cloud's metadata service), a private network or one of the fleet's own nodes would have
an engine fetch what only the fleet may reach, and tell the client what answered. So
every media part of a chat, Messages or Responses body is looked at before a replica sees
it: ``data:`` (inline) passes, ``http``/``https`` pass when every address the host has is
public and not a node of the fleet, anything else is a 400 naming the part. A name is
resolved here, bounded by RESOLVE_TIMEOUT; one that does not resolve is refused too (the
engine's resolver might know it as an inside host). ``LLMGW_ROUTER_ALLOW_PRIVATE_URLS``
names the hosts, addresses and networks (CIDR) that may be fetched all the same.

Cost: a walk of the messages' parts, and one lookup per distinct media host (none for
literal addresses and inline data), kept for RESOLVE_CACHE_SECONDS.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from router import errors

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str], Awaitable[list[str]]]

RESOLVE_TIMEOUT = 2.0
# A name's addresses are looked up again after this long (a failed lookup: at once); the
# engine's own lookup follows the name's changes anyway, the check is of where it points.
RESOLVE_CACHE_SECONDS = 10.0
RESOLVE_CACHE_SIZE = 1024
ALLOW_ENV = "LLMGW_ROUTER_ALLOW_PRIVATE_URLS"
# Part type -> the field that holds its URL: a string, or an object with "url".
_URL_FIELDS = {
    "image_url": "image_url",  # chat completions
    "audio_url": "audio_url",  # vLLM's
    "video_url": "video_url",  # vLLM's
    "input_image": "image_url",  # Responses
    "input_file": "file_url",  # Responses
}
_SOURCE_PARTS = ("image", "document")  # Anthropic's Messages: {"source": {"type": "url"}}


class MediaUrlPolicy:
    """Which media URLs engines may be asked to fetch; ``allowed`` as the knob lists them."""

    def __init__(self, allowed: Iterable[str] = (), resolve: Resolver | None = None) -> None:
        self.names: set[str] = set()
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in (item.strip() for item in allowed):
            if not entry:
                continue
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self.names.add(entry.lower().rstrip("."))
        self._resolve = resolve or _resolve
        self._resolved: dict[str, tuple[float, list[str]]] = {}  # host -> (until, addresses)

    async def check(
        self, payload: dict[str, Any],
        fleet_hosts: Collection[str] | Callable[[], Collection[str]],
        body: bytes | None = None,
    ) -> None:  # fmt: skip
        """Raise a 400 for the first media URL an engine must not fetch. ``fleet_hosts``
        may be a callable: asked only when a body has a media URL (most have none).
        ``body``: the JSON ``payload`` was read from, to skip the walk when it cannot
        name one."""
        if body is not None and not may_name_media(body):
            return
        fleet: set[IpAddress | None] | None = None
        for param, url in media_urls(payload):
            if fleet is None:
                hosts = fleet_hosts() if callable(fleet_hosts) else fleet_hosts
                fleet = {_address(host) for host in hosts} - {None}
            problem = await self._problem(url, fleet)
            if problem:
                raise errors.invalid_field(
                    param,
                    f"`{param}` cannot be fetched: {problem}. Engines fetch media from inside "
                    f"the fleet, where this would reach what only the fleet may; send the "
                    f"media inline (a data: URL), or list the host or network in {ALLOW_ENV}.",
                )

    async def _problem(self, url: str, fleet: set[IpAddress | None]) -> str:
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").rstrip(".")
        except ValueError:
            return "it is not a URL"
        scheme = parts.scheme.lower()
        if scheme == "data":
            return ""
        if scheme not in ("http", "https"):
            return f"its scheme is {scheme or '(none)'}: (only http, https and data are fetched)"
        if not host:
            return "it names no host"
        if host in self.names:
            return ""
        literal = _address(host)
        if literal is not None:
            return self._address_problem(str(literal), literal, fleet)
        try:
            found = await self._addresses(host)
        except (OSError, TimeoutError, UnicodeError) as exc:
            return f"{host} cannot be resolved from the router ({exc or type(exc).__name__})"
        for text in found:
            address = _address(text)
            if address is None:
                return f"{host} resolves to {text!r}, which is not an address"
            problem = self._address_problem(f"{host} is {address},", address, fleet)
            if problem:
                return problem
        return "" if found else f"{host} resolves to no address"

    async def _addresses(self, host: str) -> list[str]:
        """The host's addresses: looked up, or as looked up within RESOLVE_CACHE_SECONDS
        (an agent's tool loop sends the same image URL on every turn)."""
        now = time.monotonic()
        cached = self._resolved.get(host)
        if cached is not None and cached[0] > now:
            return cached[1]
        found = await asyncio.wait_for(self._resolve(host), RESOLVE_TIMEOUT)
        if len(self._resolved) >= RESOLVE_CACHE_SIZE:
            self._resolved.clear()
        self._resolved[host] = (now + RESOLVE_CACHE_SECONDS, found)
        return found

    def _address_problem(self, said: str, address: IpAddress, fleet: set[IpAddress | None]) -> str:
        if any(address in network for network in self.networks):
            return ""
        said = said if said.endswith(",") else f"{said} is"
        if address.is_loopback:
            return f"{said} a loopback address"
        if address.is_link_local:
            return f"{said} a link-local address"
        if address in fleet:
            return f"{said} a node of this fleet"
        if address.is_private:
            return f"{said} a private address"
        if not address.is_global:
            return f"{said} not a public address"
        return ""


def may_name_media(body: bytes) -> bool:
    """Whether a JSON body may hold a media URL: every field that names one, and
    Anthropic's ``"type": "url"``, has ``url`` in it, written as it is or with an escape
    (``\\u0075rl``): a body with neither holds none, and its walk is spared."""
    return b"url" in body or b"\\u" in body


def media_urls(payload: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(param, url) of every media part in the messages (chat, Messages) or input
    (Responses), parts within parts (a tool result's) included. A part's path is written
    only for a part with media or parts (most messages are a string: nothing to write)."""
    # (the path of the list holding the node, or the node's own; its index; the node)
    stack: list[tuple[str, int, Any]] = []
    for key in ("input", "messages"):
        if isinstance(payload.get(key), list):
            stack.append((key, -1, payload[key]))
    while stack:
        parent, index, node = stack.pop()
        if isinstance(node, list):
            path = parent if index < 0 else f"{parent}[{index}]"
            stack.extend((path, i, node[i]) for i in range(len(node) - 1, -1, -1))
            continue
        if not isinstance(node, dict):
            continue
        kind = node.get("type")
        content = node.get("content")
        if kind is None and not isinstance(content, list):
            continue
        path = parent if index < 0 else f"{parent}[{index}]"
        field = _URL_FIELDS.get(kind) if isinstance(kind, str) else None
        if field is not None:
            value = node.get(field)
            if isinstance(value, str):
                yield f"{path}.{field}", value
            elif isinstance(value, dict) and isinstance(value.get("url"), str):
                yield f"{path}.{field}.url", value["url"]
        elif kind in _SOURCE_PARTS:
            source = node.get("source")
            if isinstance(source, dict) and isinstance(source.get("url"), str):
                yield f"{path}.source.url", source["url"]
        if isinstance(content, list):
            stack.append((f"{path}.content", -1, content))


def _address(text: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0].strip("[]"))
    except ValueError:
        return None


async def _resolve(host: str) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})
