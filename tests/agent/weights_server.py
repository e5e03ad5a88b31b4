"""A real HTTP server of weights for the agent's tests: a ThreadingHTTPServer on 127.0.0.1
serving a generated file; it can leave out Content-Length, ignore Range, break off
mid-stream once, and hold the body."""

from __future__ import annotations

import hashlib
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"bytes=(\d+)-")


@dataclass
class WeightsServer:
    """Serves ``data`` at /files/<name> and counts what it sent."""

    data: bytes
    name: str = "model.gguf"
    send_length: bool = True
    honour_range: bool = True
    break_after: int | None = None  # close the connection after this many body bytes, once
    gate: threading.Event | None = None  # hold every body until set
    requests: list[dict[str, str]] = field(default_factory=list)
    body_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/files/{self.name}"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def stop(self) -> None:
        if self.gate is not None:
            self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(server: WeightsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            with server.lock:
                server.requests.append(dict(self.headers.items()))
            if self.path.split("?")[0] != f"/files/{server.name}":
                self.send_error(404)
                return
            size = len(server.data)
            match = _RANGE.fullmatch(self.headers.get("Range", ""))
            start = int(match.group(1)) if match and server.honour_range else 0
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            if server.send_length:
                self.send_header("Content-Length", str(size - start))
            self.send_header("ETag", '"v1"')
            self.end_headers()
            if server.gate is not None:
                server.gate.wait(10)
            limit = size
            if server.break_after is not None:
                limit, server.break_after = min(size, start + server.break_after), None
            for position in range(start, limit, 8192):
                piece = server.data[position : min(limit, position + 8192)]
                self.wfile.write(piece)
                with server.lock:
                    server.body_bytes += len(piece)
            self.wfile.flush()
            if limit < size:
                self.connection.shutdown(socket.SHUT_RDWR)

    return Handler
