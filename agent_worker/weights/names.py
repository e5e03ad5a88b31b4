"""What kind of source a catalog names, and the cache name of a file llmgw fetched.

A fetched file's name is derived from a hash of its source plus a checked basename, never
taken from the URL path as given: a URL can say anything, and the weights directory is
where the agent deletes things.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal
from urllib.parse import unquote, urlsplit

from protocol.sources import is_loopback_url

SourceKind = Literal["local", "fetched", "hub"]

PARTIAL_SUFFIX = ".partial"
SIDECAR_SUFFIX = ".source.json"
HASH_LENGTH = 16
_BASENAME = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}"
_BASENAME_RE = re.compile(_BASENAME)
_CACHE_NAME_RE = re.compile(rf"([0-9a-f]{{{HASH_LENGTH}}})-({_BASENAME})")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
# Plain http only from this machine: a test server or a local mirror, never the network.


class WeightSourceError(ValueError):
    """A source the agent cannot use, naming it and what to write instead."""


def source_kind(source: str) -> SourceKind:
    """Say how a source is served: a local path as is, a URL fetched, a hub id passed on."""
    if not source or source != source.strip() or any(ord(c) < 32 for c in source):
        raise WeightSourceError(
            f"weights source {source!r} is empty or holds blanks or control characters; "
            "give an absolute path, an https:// URL or a hub id such as Qwen/Qwen2.5-7B"
        )
    if "://" in source:
        url_basename(source)
        return "fetched"
    if source.startswith("/"):
        return "local"
    if source in (".", "..") or source.startswith(("./", "../", "~")):
        raise WeightSourceError(
            f"weights source {source!r} is a relative path, which means nothing on a node; "
            "give an absolute path"
        )
    # Anything else is a hub id that vLLM and SGLang resolve themselves.
    return "hub"


def url_basename(source: str) -> str:
    """Return the checked file name a URL ends in, or raise saying why it cannot be used."""
    parts = urlsplit(source)
    scheme = parts.scheme.lower()
    if scheme == "http" and not is_loopback_url(source):
        raise WeightSourceError(
            f"weights source {source} uses plain http; use https (plain http is allowed "
            "only from 127.0.0.1, for a local mirror or a test)"
        )
    if scheme not in ("https", "http"):
        raise WeightSourceError(
            f"weights source {source} has scheme {scheme or 'none'!r}; the agent fetches "
            "only https:// URLs (or use an absolute path to weights already on the node)"
        )
    if not parts.hostname:
        raise WeightSourceError(f"weights source {source} names no host")
    name = unquote(parts.path.rsplit("/", 1)[-1])
    if not _BASENAME_RE.fullmatch(name) or name.endswith((PARTIAL_SUFFIX, SIDECAR_SUFFIX)):
        raise WeightSourceError(
            f"weights source {source} does not end in a usable file name ({name!r}); "
            "the URL must name one file such as model-q4_k_m.gguf (letters, digits, . _ + -)"
        )
    return name


def source_hash(source: str) -> str:
    """Return the short hash of a source that prefixes its cache name."""
    return hashlib.sha256(source.encode()).hexdigest()[:HASH_LENGTH]


def cache_name(source: str) -> str:
    """Return the file name a URL's weights get in the weights directory."""
    return f"{source_hash(source)}-{url_basename(source)}"


def parse_cache_name(name: str) -> str | None:
    """Return the source hash a cache name carries, or None for any other name."""
    if name.endswith((PARTIAL_SUFFIX, SIDECAR_SUFFIX)):
        return None
    match = _CACHE_NAME_RE.fullmatch(name)
    return match.group(1) if match else None


def normalize_sha256(sha256: str) -> str:
    """Return a hex digest in lower case (or ""), refusing anything that is not one."""
    digest = sha256.strip().lower().removeprefix("sha256:")
    if digest and not _SHA256_RE.fullmatch(digest):
        raise WeightSourceError(
            f"sha256 {sha256!r} is not a hex SHA-256 digest (64 characters 0-9a-f)"
        )
    return digest
