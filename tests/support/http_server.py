"""A real HTTP server in a thread that answers from a table of routes, free ports, and a stdlib HTTP client."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from npuops.instance.control import port_taken


@dataclass(frozen=True)
class Seen:
    """One request the test server received."""

    method: str
    path: str
    headers: Mapping[str, str]  # lower-case names
    body: bytes


Routes = Mapping[str, tuple[int, bytes]]
# What the `serve` fixture gives: serve(routes) -> (base URL, requests seen).
Serve = Callable[[Routes], tuple[str, list[Seen]]]


def start_server(routes: Routes) -> tuple[http.server.ThreadingHTTPServer, str, list[Seen]]:
    """A server on 127.0.0.1 (a free port) answering GET and POST from `routes` (a path not in it: 404), in a daemon
    thread; returns (server, base URL, requests seen). Stop it with `stop_server`."""
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
    return server, f"http://127.0.0.1:{server.server_address[1]}", seen


def stop_server(server: http.server.ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now, that nothing listens on (the kernel's pick; another process could still
    take it before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive TCP ports free on `host` right now (an instance with a router: the router's
    port, its parts' after it, then the router's metrics)."""
    while True:
        base = free_port(host)
        if base < 65535 - count and not any(port_taken(host, base + i) for i in range(1, count)):
            return base


def http_request(url: str, *, data: Mapping[str, Any] | None = None, timeout: float = 30.0) -> tuple[int, bytes]:
    """GET (or POST JSON when `data` is given) with the stdlib; HTTP errors are returned, not raised."""
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, method="GET" if data is None else "POST")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
