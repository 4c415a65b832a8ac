"""Fixtures of the service tests: a real HTTP server in a thread, and a port nothing listens on."""

from __future__ import annotations

import http.server
from collections.abc import Iterator

import pytest

from tests.support.http_server import Routes, Seen, Serve, free_port, start_server, stop_server


@pytest.fixture
def serve() -> Iterator[Serve]:
    """serve(routes) -> (base URL, requests seen); a path not in routes answers 404."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(routes: Routes) -> tuple[str, list[Seen]]:
        server, url, seen = start_server(routes)
        servers.append(server)
        return url, seen

    yield start
    for server in servers:
        stop_server(server)


@pytest.fixture
def closed_port() -> int:
    """A port that was free a moment ago and that nothing listens on."""
    return free_port()
