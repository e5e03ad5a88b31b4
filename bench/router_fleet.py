"""The router as a fleet runs it, for bench/router_overhead.py: reading its table and keys
from PostgreSQL, holding keys to their limits in Redis, journalling and writing usage,
routing by prefix, moving broken streams, logging a line per request; and N processes of
it sharing one listening socket, as `llmgw up` runs them (``LLMGW_ROUTER_PROCESSES``).
"""

from __future__ import annotations

import socket
from pathlib import Path

from bench.engines import ENGINE_SECRET, Served, router_argv
from bench.processes import REPO, start, wait_up

# Above the bench's 64 clients: a request's place in flight is given back just after its
# answer went out, so at the default cap (64) the next one of a client could be refused.
# The cap is enforced all the same: every request is admitted and settled in Redis.
KEY_CONCURRENCY = "256"


def make_catalog(engine_port: int, names: list[str], budget: int = 0) -> dict[str, str]:
    """One model routed by prefix, on one ready replica of the fake engine, and a key with
    the default limits for each of ``names`` (each router its own: one router's places in
    flight never count against another's cap), and ``budget`` tokens a day where it is not
    0 (each request then counted in Redis); each key's secret by name."""
    from audit.actors import SystemActor
    from catalog.actions.api_keys import create_key
    from catalog.models import ApiKey, Model, Profile
    from fleet.models import Node, Replica, ReplicaState, Shard, ShardState
    from router.models import Usage

    Usage.objects.all().delete()
    Shard.objects.all().delete()
    Replica.objects.all().delete()
    Profile.objects.all().delete()
    Model.objects.all().delete()
    ApiKey.objects.all().delete()
    node, _ = Node.objects.get_or_create(id="bench-node", defaults={"address": "127.0.0.1"})
    model = Model.objects.create(name="bench", source="/models/bench.gguf")
    profile = Profile.objects.create(model=model, name="cpu", engine="llama.cpp", replicas=1,
                                     routing="prefix")  # fmt: skip
    replica = Replica.objects.create(
        model_name="bench", profile_name="cpu", profile=profile, state=ReplicaState.READY,
        fingerprint=profile.fingerprint(), secret=ENGINE_SECRET,
    )  # fmt: skip
    Shard.objects.create(id=Shard.new_id(), replica=replica, rank=0, node=node,
                         port=engine_port, state=ShardState.READY)  # fmt: skip
    actor = SystemActor("bench router_overhead")
    limits = {"tokens_per_day": budget} if budget else None
    return {name: create_key(f"bench-{n}", [], limits=limits, actor=actor)[1]
            for n, name in enumerate(names)}  # fmt: skip


def shared_socket() -> socket.socket:
    """A listening socket on a free loopback port, for router processes to share."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    sock.set_inheritable(True)
    return sock


async def serve_fleet_routers(
    count: int, env: dict[str, str], home: Path, processes: list, sockets: list,
    server: str = "own", client: str = "lean", checkout: Path | None = None,
) -> Served:  # fmt: skip
    """``count`` router processes in database mode on one shared port; each waited for
    (a process that is not up yet leaves its connections in the backlog); ``checkout``:
    another checkout's router (an older commit's, to measure against in the same run)."""
    sock = shared_socket()
    sockets.append(sock)
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    # INFO: a log line a request, as `llmgw up` writes them (the bench's own env is quieter).
    router_env = {**env, "LLMGW_KEY_CONCURRENCY": KEY_CONCURRENCY, "LOG_LEVEL": "INFO"}
    started = []
    for index in range(count):
        log = home / f"router-{server}-{client}-{count}-{index}-{port}.log"
        argv = router_argv(server, client, port, fd=sock.fileno())
        process = start(argv, log, router_env, pass_fds=(sock.fileno(),), cwd=checkout or REPO)
        processes.append(process)
        started.append((process, log))
    for process, log in started:
        await wait_up(f"{url}/health", process, log)
    return Served(started[0][0], url)
