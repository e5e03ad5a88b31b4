"""nginx in front of an engine: the ceiling a proxy reaches on this machine, for the router
benches to measure against in the same run.

One worker process (as the router's one process), keep-alive connections to the engine,
no buffering (a stream goes out chunk by chunk, as the router relays it), no access log,
and the engine's key put in place of the client's, as the router does. Debian's
``nginx-light`` is installed with apt-get where nginx is absent and this runs as root;
elsewhere the caller skips the row with the reason ``nginx_binary`` gives.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from bench.engines import Served, serve

PACKAGE = "nginx-light"
# Where Debian puts it; PATH may lack /usr/sbin for a user's shell.
CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")

CONFIG = """\
worker_processes 1;
daemon off;
pid {home}/nginx.pid;
error_log {home}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {home}/body;
    proxy_temp_path {home}/proxy;
    fastcgi_temp_path {home}/fastcgi;
    uwsgi_temp_path {home}/uwsgi;
    scgi_temp_path {home}/scgi;
    upstream engine {{
        server {engine};
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{{port}};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "Bearer {secret}";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def nginx_binary(install: bool = True) -> tuple[str | None, str]:
    """nginx's path (installing Debian's nginx-light first where it is absent, when
    ``install`` and this runs as root with apt-get), or None and why there is none."""
    found = _found()
    if found:
        return found, ""
    if not install:
        return None, "nginx is not installed (--no-install-nginx)"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None, f"nginx is not installed, and installing {PACKAGE} needs root and apt-get"
    done = subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", PACKAGE],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    found = _found()
    if found:
        return found, ""
    said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return None, f"apt-get install {PACKAGE} failed ({done.returncode}): {said[0]}"


def _found() -> str | None:
    return shutil.which("nginx") or next((c for c in CANDIDATES if Path(c).exists()), None)


async def serve_nginx(binary: str, engine_url: str, secret: str, home: Path,
                      processes: list) -> Served:  # fmt: skip
    """nginx proxying every path to ``engine_url``, with ``secret`` as the engine's key; a
    ``/health`` through it answers once it is up."""
    home.mkdir(parents=True, exist_ok=True)
    engine = engine_url.removeprefix("http://")
    template = CONFIG.format(home=home, engine=engine, secret=secret)

    def argv(port: int) -> list[str]:
        conf = home / "nginx.conf"
        conf.write_text(template.replace("{port}", str(port)))
        return [binary, "-p", str(home), "-c", str(conf)]

    return await serve(argv, home / "nginx.log", processes)
