"""Fixtures of the service tests: a real HTTP server in a thread, and a port nothing listens on."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Seen:
    """One request the test server received."""

    method: str
    path: str
    headers: Mapping[str, str]  # lower-case names
    body: bytes


Routes = Mapping[str, tuple[int, bytes]]
Serve = Callable[[Routes], tuple[str, list[Seen]]]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """serve(routes) -> (base URL, requests seen); a path not in routes answers 404."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(routes: Routes) -> tuple[str, list[Seen]]:
        seen: list[Seen] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                seen.append(Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                status, payload = routes.get(self.path, (404, b'{"detail": "Not Found"}'))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _answer
            do_POST = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", seen

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def closed_port() -> int:
    """A port that was free a moment ago and that nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
