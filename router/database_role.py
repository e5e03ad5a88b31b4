"""The database role routers read as: the tables the routing snapshot and the keys come
from, to read; ``router_usage``, to add to; nothing else. A router an attacker took over
from ``/v1`` can then change no catalog, key, replica or user, nor read a password hash.

``llmgw_ctl router-role`` makes the role (or gives it a new password) and grants exactly
that, revoking anything else; run it as the database's owner after every ``migrate`` (a
new table the router reads needs its grant). It prints the URL routers connect with.
Roles belong to the server, not to one database, so the role is named for its database
(``llmgw_router`` for ``llmgw``): two databases on one server never share one.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg.sql
from django.core.management.base import CommandError
from django.db import connection as default_connection
from django.db import transaction

from core.secret_files import read_or_create_secret

# What routing_snapshot() and active_keys() read.
READS = ("catalog_model", "catalog_profile", "catalog_apikey", "catalog_team",
         "catalog_model_teams", "fleet_replica", "fleet_shard", "fleet_node")  # fmt: skip
# What write_usage() adds to (an upsert: it reads the row it adds to).
WRITES = ("router_usage",)
# Where the password comes from without --password-file (docker compose's .env).
PASSWORD_VARIABLE = "LLMGW_ROUTER_DB_PASSWORD"  # noqa: S105 (a variable's name)


def role_name(database: str) -> str:
    return f"{database}_router"[:63]


def grant_router_role(connection, password: str) -> str:
    """Make the router's role for ``connection``'s database (or set its password) and
    grant it exactly what a router needs; its name."""
    role = role_name(connection.settings_dict["NAME"])
    name = connection.ops.quote_name(role)
    connection.ensure_connection()
    raw = connection.connection
    # Only the SCRAM verifier reaches the server: the password itself is never in its logs.
    verifier = raw.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256")
    literal = psycopg.sql.Literal(verifier.decode()).as_string(raw)
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        exists = cursor.fetchone() is not None
        cursor.execute(f"{'ALTER' if exists else 'CREATE'} ROLE {name} LOGIN PASSWORD {literal}")
        cursor.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {name}")
        cursor.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {name}")
        database = connection.ops.quote_name(connection.settings_dict["NAME"])
        cursor.execute(f"GRANT CONNECT ON DATABASE {database} TO {name}")
        cursor.execute(f"GRANT USAGE ON SCHEMA public TO {name}")
        cursor.execute(f"GRANT SELECT ON {', '.join(READS)} TO {name}")
        cursor.execute(f"GRANT SELECT, INSERT, UPDATE ON {', '.join(WRITES)} TO {name}")
    return role


def drop_router_role(connection, role: str) -> None:
    """Take the role away again (its grants first: a role holding any cannot be dropped)."""
    name = connection.ops.quote_name(role)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP OWNED BY {name}")
        cursor.execute(f"DROP ROLE {name}")


def role_url(url: str, role: str, password: str) -> str:
    """``url`` (the control plane's DATABASE_URL) as ``role`` with ``password``."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{quote(role, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def add_parsers(subparsers) -> None:
    role = subparsers.add_parser(
        "router-role", help="the database role routers read as; prints their DATABASE_URL"
    )
    role.add_argument(
        "--password-file", default="",
        help="the role's password, made here (0600) on first use and kept; without it, "
        f"{PASSWORD_VARIABLE} from the environment",
    )  # fmt: skip
    role.set_defaults(handler=router_role_command)


def router_role_command(options, out) -> None:
    from django.conf import settings

    if options["password_file"]:
        path = Path(options["password_file"])
        password = read_or_create_secret(path, lambda: secrets.token_urlsafe(24))
    else:
        password = os.environ.get(PASSWORD_VARIABLE, "")
    if not password:
        raise CommandError(f"name the router role's password: --password-file FILE, or "
                           f"{PASSWORD_VARIABLE} in the environment")  # fmt: skip
    try:
        role = grant_router_role(default_connection, password)
    except Exception as exc:  # permission denied, most likely: say whose and what to do
        raise CommandError(
            f"could not make the router's database role: {exc}; run this as the database's "
            "owner with CREATEROLE, or make the role yourself with the grants in "
            "router/database_role.py"
        ) from None
    out.write(role_url(settings.DATABASE_URL, role, password))
