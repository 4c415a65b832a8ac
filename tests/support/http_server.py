"""A real HTTP server in a thread that answers from a table of routes, free ports, and a stdlib HTTP client."""

from __future__ import annotations

import http.server
import itertools
import json
import os
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


# Under pytest-xdist each worker takes its ports from a block of its own, below the kernel's ephemeral range
# (32768-60999 here), so two workers never pick the same port for two engines, and no client connection's
# ephemeral port lands on one a test is about to hand out. Outside xdist the kernel picks.
PORT_BLOCK_BASE = 20000
PORT_BLOCK_SIZE = 3000
_next_in_block = itertools.count()


def worker_index() -> int | None:
    """This pytest-xdist worker's number (gw0 -> 0), or None outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def port_block(index: int) -> range:
    """The ports of worker `index`."""
    start = PORT_BLOCK_BASE + index * PORT_BLOCK_SIZE
    return range(start, start + PORT_BLOCK_SIZE)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now, that nothing listens on: the kernel's pick, or under xdist the next free
    one of this worker's block (walked round-robin, so a port is not handed out again soon after its last use).
    Another process could still take it before use."""
    index = worker_index()
    if index is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    block = port_block(index)
    for _ in range(len(block)):
        port = block[next(_next_in_block) % len(block)]
        if _bindable(host, port):
            return port
    raise RuntimeError(f"no free port in {block} on {host} (worker {index})")


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive TCP ports free on `host` right now (an instance with a router: the router's
    port, its parts' after it, then the router's metrics)."""
    for _ in range(PORT_BLOCK_SIZE):
        base = free_port(host)
        index = worker_index()
        in_block = index is None or base + count - 1 in port_block(index)
        if in_block and base < 65535 - count and not any(port_taken(host, base + i) for i in range(1, count)):
            if index is not None:  # the rest of the run is this caller's: the next free_port starts after it
                for _ in range(count - 1):
                    next(_next_in_block)
            return base
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


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
