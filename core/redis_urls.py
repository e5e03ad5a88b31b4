"""A Redis URL read once, and handed to each library in the form it takes.

One convention for every process (control plane, reconciler, router, agents, channel
layer, Celery broker and result backend): the URL carries the password and, for
``rediss://``, the TLS options in its query string, spelled as redis-py spells them::

    rediss://:secret@redis.example:6380/0?ssl_ca_certs=/etc/llmgw/redis-ca.pem

redis-py (and channels_redis, which hands it the URL) reads that query itself but takes
``ssl_cert_reqs`` only as ``required``/``optional``/``none``. kombu and Celery's result
backend take TLS as a dict (``broker_use_ssl``, ``redis_backend_use_ssl``) and, given a
bare ``rediss://``, kombu would not verify the server at all while the result backend
refuses to start. So both get the dict built here, and every library verifies the
server against the system CAs unless ``ssl_ca_certs`` names others.

No Django here: the agent reads its broker URL through this module too.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

CERT_REQS = {
    "required": ssl.CERT_REQUIRED,
    "optional": ssl.CERT_OPTIONAL,
    "none": ssl.CERT_NONE,
}
# kombu's spelling, accepted so a URL written for Celery's documentation works here too.
CERT_REQS_ALIASES = {"CERT_REQUIRED": "required", "CERT_OPTIONAL": "optional", "CERT_NONE": "none"}
TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
TLS_OPTIONS = ("ssl_cert_reqs", *TLS_FILES, "ssl_check_hostname")
TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off"}
MASK = "***"

# The netloc ends at the first / ? or #; a password runs to its last @.
_PASSWORD_IN_URL = re.compile(r"(//[^/?#@:]*:)[^/?#]*@")
_PASSWORD_IN_QUERY = re.compile(r"([?&]password=)[^&#]*")  # redis-py reads one there too


class RedisURLError(ValueError):
    """A Redis URL that cannot be used, naming the setting and never the password."""


@dataclass(frozen=True, repr=False)
class RedisURL:
    """What one configured Redis URL means to each library that connects with it."""

    setting: str
    scheme: str
    #: For redis-py's ``from_url`` (sync and asyncio) and channels_redis' ``address``.
    client_url: str
    #: For kombu and Celery: ``unix://`` spelled ``redis+socket://``, no TLS query.
    celery_url: str
    #: ``broker_use_ssl`` / ``redis_backend_use_ssl``; None unless the URL is rediss://.
    celery_ssl: dict[str, Any] | None
    #: The URL with its password replaced, for logs and error messages.
    masked: str

    def __repr__(self) -> str:
        return f"RedisURL({self.setting}={self.masked})"

    def channels_host(self, **options: Any) -> dict[str, Any]:
        """A channels_redis ``hosts`` entry: it hands ``address`` to redis-py's from_url."""
        return {"address": self.client_url, **options}

    def celery_config(self) -> dict[str, Any]:
        """Celery settings (lower-case names) for a broker and result backend on this Redis."""
        config: dict[str, Any] = {"broker_url": self.celery_url, "result_backend": self.celery_url}
        if self.celery_ssl is not None:
            config["broker_use_ssl"] = dict(self.celery_ssl)
            config["redis_backend_use_ssl"] = dict(self.celery_ssl)
        return config


def with_credentials(url: str, username: str, password: str) -> str:
    """``url`` signed in as ``username`` with ``password``, in place of any user or password
    it named (``redis://:cp-secret@h:6379/0`` becomes ``redis://node:secret@h:6379/0``)."""
    parts = urlsplit(url)
    location = parts.netloc.rpartition("@")[2]
    credentials = f"{quote(username, safe='')}:{quote(password, safe='')}@"
    return urlunsplit(parts._replace(netloc=credentials + location))


def mask_password(url: str) -> str:
    """``url`` with any password replaced by ***; safe on text that is not a valid URL."""
    url = _PASSWORD_IN_URL.sub(rf"\g<1>{MASK}@", url)
    return _PASSWORD_IN_QUERY.sub(rf"\g<1>{MASK}", url)


def parse_redis_url(url: str, setting: str = "REDIS_URL") -> RedisURL:
    """Read ``url`` (from ``setting``) once; raise RedisURLError saying what is wrong.

    A TLS file that is missing is reported here, at start-up, naming the file and the
    setting, rather than as a traceback from inside the first connection.
    """
    masked = mask_password(url)
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a port that is not a number
    except ValueError as exc:
        raise RedisURLError(f"{setting}={masked} is not a URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise RedisURLError(
            f"{setting}={masked}: the scheme must be redis://, rediss:// (TLS) or unix://"
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    tls_given = {name: value for name, value in query if name.startswith("ssl_")}
    others = [(name, value) for name, value in query if not name.startswith("ssl_")]
    for name in tls_given:
        if name not in TLS_OPTIONS:
            raise RedisURLError(
                f"{setting}={masked}: {name} is not a TLS option llmgw reads; use "
                + ", ".join(TLS_OPTIONS)
            )
    if tls_given and scheme != "rediss":
        raise RedisURLError(
            f"{setting}={masked}: {', '.join(tls_given)} configure TLS, which only a "
            "rediss:// URL uses; spell it rediss://"
        )
    tls = _tls_options(tls_given, setting, masked) if scheme == "rediss" else None
    client_query = others + [(name, _as_query_value(value)) for name, value in (tls or {}).items()]
    # Only the query is rewritten: urlunsplit would turn unix:///run/redis.sock into unix:/…
    base = url.split("#", 1)[0].split("?", 1)[0]
    celery_base = "redis+socket" + base[len(parts.scheme) :] if scheme == "unix" else base
    celery_ssl = None
    if tls is not None:
        celery_ssl = dict(tls, ssl_cert_reqs=CERT_REQS[tls["ssl_cert_reqs"]])
    if scheme == "unix":
        # kombu and Celery's result backend take a socket's database number from
        # virtual_host, and silently use 0 when it comes as db.
        others = [("virtual_host" if name == "db" else name, value) for name, value in others]
    return RedisURL(
        setting=setting,
        scheme=scheme,
        client_url=_with_query(base, client_query),
        celery_url=_with_query(celery_base, others),
        celery_ssl=celery_ssl,
        masked=masked,
    )


def _tls_options(given: dict[str, str], setting: str, masked: str) -> dict[str, Any]:
    """The TLS options of a rediss:// URL, checked; verification is on unless turned off."""
    cert_reqs = CERT_REQS_ALIASES.get(given.get("ssl_cert_reqs", ""), given.get("ssl_cert_reqs"))
    cert_reqs = cert_reqs or "required"
    if cert_reqs not in CERT_REQS:
        raise RedisURLError(
            f"{setting}={masked}: ssl_cert_reqs={given['ssl_cert_reqs']!r} must be "
            "required (the default), optional or none"
        )
    options: dict[str, Any] = {"ssl_cert_reqs": cert_reqs}
    for name in TLS_FILES:
        if given.get(name):
            options[name] = _existing_file(given[name], name, setting)
    if "ssl_ca_certs" in options:
        _check_ca_file(options["ssl_ca_certs"], setting)
    if "ssl_check_hostname" in given:
        word = given["ssl_check_hostname"].strip().lower()
        if word not in TRUE_WORDS | FALSE_WORDS:
            raise RedisURLError(
                f"{setting}={masked}: ssl_check_hostname="
                f"{given['ssl_check_hostname']!r} must be true or false"
            )
        options["ssl_check_hostname"] = word in TRUE_WORDS
    return options


def _existing_file(path: str, name: str, setting: str) -> str:
    file = Path(path)
    if not file.is_file():
        what = "is not a file" if file.exists() else "does not exist"
        raise RedisURLError(f"{setting}: the {name} file {path} {what}")
    try:
        with file.open("rb"):
            pass
    except OSError as exc:
        raise RedisURLError(f"{setting}: the {name} file {path} cannot be read: {exc}") from None
    return path


def _check_ca_file(path: str, setting: str) -> None:
    """Load the CA file the way every client will, so a file of garbage is named now."""
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError as exc:
        raise RedisURLError(
            f"{setting}: the ssl_ca_certs file {path} holds no CA certificate in PEM form "
            f"({exc.reason or exc})"
        ) from None


def _with_query(base: str, query: list[tuple[str, str]]) -> str:
    return f"{base}?{urlencode(query)}" if query else base


def _as_query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
