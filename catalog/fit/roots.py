"""Where the control plane may read a model's files for the fit estimate: a local file (its
header, its adapters' sizes) only under the model roots (settings.LLMGW_MODEL_ROOTS), a URL
only from the download hosts (settings.LLMGW_FIT_DOWNLOAD_HOSTS), so that a catalog entry
cannot make the estimate an oracle for this host's files or a way into the network the
control plane sits in (review finding 24).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings


class OutsideModelRoots(ValueError):
    """A source the control plane does not read; the message names it and the fix."""


def under_a_model_root(source: str, roots: list[Path] | None = None) -> Path:
    """``source`` as a path under one of the model roots (LLMGW_MODEL_ROOTS), or
    OutsideModelRoots saying it is not: decided by the name before the file is looked at, then
    by where links lead (a link out of a root is refused too)."""
    roots = settings.LLMGW_MODEL_ROOTS if roots is None else roots
    named = os.path.normpath(source)
    if not any(_within(named, os.path.normpath(root)) for root in roots):
        raise OutsideModelRoots(
            f"{source} is not under a model root of the control plane "
            f"({os.pathsep.join(map(str, roots))}); add its directory to LLMGW_MODEL_ROOTS "
            "to have its size estimated, or declare memory: or gpu_memory: for its profiles"
        )
    real = os.path.realpath(named)
    if not any(_within(real, os.path.realpath(root)) for root in roots):
        raise OutsideModelRoots(
            f"{source} is a link that leads out of the control plane's model roots; name the "
            "file it leads to, under a root, or add that directory to LLMGW_MODEL_ROOTS"
        )
    return Path(real)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def from_a_download_host(url: str, hosts: list[str] | None = None) -> str:
    """``url``, when its host is one of the fit's download hosts (LLMGW_FIT_DOWNLOAD_HOSTS:
    a name, or ``*.name`` for its subdomains), else OutsideModelRoots saying so. By name
    only: an address is allowed where it is listed itself."""
    hosts = settings.LLMGW_FIT_DOWNLOAD_HOSTS if hosts is None else hosts
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    if not host or not any(_host_matches(host, allowed) for allowed in hosts):
        raise OutsideModelRoots(
            f"{url}: the control plane downloads models for the fit estimate only from "
            f"{', '.join(hosts)}; add {host or 'its host'} to LLMGW_FIT_DOWNLOAD_HOSTS to have "
            "its size estimated, or declare memory: or gpu_memory: for its profiles"
        )
    return url


def _host_matches(host: str, allowed: str) -> bool:
    if allowed.startswith("*.") and not _is_address(host):
        return host.endswith(allowed[1:])
    return host == allowed


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
