"""The router's entry point, an ASGI application, served by router/serve.py (one process
or several on one port: what `llmgw up` and the systemd unit run)::

    python -m router.serve --host 127.0.0.1 --port 8080 --processes 1

router/serve.py serves it with the router's own server (router/wire/server.py); uvicorn
and daphne still serve it too (daphne has no lifespan protocol, so the router then starts
on its first request). bench/router_overhead.py measured the choices.

With ``LLMGW_ROUTER_STATIC=path.yaml`` the router serves the models that file names and
touches no database; the file is checked here, so a bad one stops the server at once
with the problem named. Otherwise it reads replicas and keys from the database and
listens for changes on Redis, keeping its last table in ``LLMGW_ROUTER_TABLE_FILE`` to
start from when the database is down.

The lifespan protocol starts the router before the first request and flushes accounting
at shutdown; under daphne, accounting is flushed at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
from pathlib import Path

from core.collector import collect_rarely
from router.app import Router
from router.config import RouterConfig
from router.intake.request_ids import LINE_FORMAT, batch_request_lines
from router.table.routes import load_static
from router.table.saved import TableFile
from router.table.sources import DatabaseSource, StaticSource

logging.basicConfig(level=logging.INFO, format=LINE_FORMAT)
# Nothing the format writes needs the caller's file and line, thread or process: a record
# without them costs a request's log line a quarter less (the stack walk above all).
logging._srcfile = None  # type: ignore[attr-defined]
logging.logThreads = False
logging.logProcesses = False
logging.logMultiprocessing = False


def build_router(config: RouterConfig | None = None) -> Router:
    config = config or RouterConfig.from_env()
    if config.static_path:
        load_static(config.static_path)  # refuse a bad file now, not on the first request
        return Router(config, StaticSource(config.static_path))
    source = DatabaseSource(TableFile(Path(config.table_file)) if config.table_file else None)
    router = Router(config, source)

    def flush_at_exit() -> None:
        rows = router.accounting.take()
        if rows:
            with contextlib.suppress(Exception):
                source.write_usage_now(rows)
                router.accounting.close()

    atexit.register(flush_at_exit)
    return router


application = build_router()
batch_request_lines()

# What the router imported and built lives as long as the process (Django's ORM, the
# table), and a request leaves almost nothing for the collector (its objects go when it
# is answered): at 64 clients its passes were the p99 (bench/router_overhead.py, the same
# run: 84 -> 34 ms not streamed, 93 -> 52 ms streamed) and 8-15% of the CPU an answer.
collect_rarely()
