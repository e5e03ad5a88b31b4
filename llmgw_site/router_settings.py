"""The router's Django settings: only what it reads, and no secret of the fleet's.

The router faces the internet. It reads the routing snapshot (replicas, their shards and
nodes' addresses, the catalog's models and profiles) and the keys, and adds to its usage
table; it needs no SECRET_KEY (no sessions, no signing), no fleet key (replica secrets
come in the snapshot, command keys are none of its business), and makes no secret file
under the home. Its DATABASE_URL should name a role that may read those tables and write
``router_usage`` only (``llmgw_ctl router-role``, which ``llmgw up`` and the simulated
fleet use). The router picks this module itself (``router.table.sources``), whatever
DJANGO_SETTINGS_MODULE its environment names.
"""

from __future__ import annotations

from core.env import env_int
from llmgw_site.services import database, logging_config, read_redis_url, required_url

# The models the snapshot reads, and the apps their foreign keys reach.
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "audit",
    "catalog",
    "fleet",
    "router",
]

DATABASE_URL = required_url("DATABASE_URL", "PostgreSQL")
DATABASES = {"default": database(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = required_url("REDIS_URL", "Redis")
read_redis_url(REDIS_URL)  # a missing TLS file stops the router here, named

USE_I18N = False
# The default cap on a key's requests in flight, as the control plane's settings read it.
KEY_CONCURRENCY = env_int("LLMGW_KEY_CONCURRENCY", 64)

USE_TZ = True
TIME_ZONE = "UTC"

LOGGING = logging_config()
