"""The sd_notify protocol against real AF_UNIX datagram sockets, and the watchdog interval."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from npuops.service.notify import Notifier, watchdog_interval_s


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # sun_path holds 108 bytes; pytest's tmp_path can be longer than that.
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="npn-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def listener(short_dir: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(short_dir / "notify")
    assert len(path) < 100
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    try:
        yield path, sock
    finally:
        sock.close()


def _received(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_ready_status_watchdog_stopping_on_a_path_socket(listener: tuple[str, socket.socket]) -> None:
    path, sock = listener
    notifier = Notifier(path)
    try:
        assert notifier.enabled
        assert notifier.ready("demo: healthy on http://127.0.0.1:8000") is True
        assert _received(sock) == f"READY=1\nSTATUS=demo: healthy on http://127.0.0.1:8000\nMAINPID={os.getpid()}"
        assert notifier.status("demo: loading weights") is True
        assert _received(sock) == "STATUS=demo: loading weights"
        assert notifier.watchdog() is True
        assert _received(sock) == "WATCHDOG=1"
        assert notifier.stopping("demo: stopping") is True
        assert _received(sock) == "STOPPING=1\nSTATUS=demo: stopping"
    finally:
        notifier.close()
    assert not notifier.enabled
    assert notifier.watchdog() is False


def test_abstract_namespace_address() -> None:
    name = f"npuops-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": "@" + name})
    try:
        assert notifier.watchdog() is True
        assert _received(sock) == "WATCHDOG=1"
        assert notifier.ready("up") is True
        assert _received(sock) == f"READY=1\nSTATUS=up\nMAINPID={os.getpid()}"
    finally:
        notifier.close()
        sock.close()


@pytest.mark.parametrize("environ", [{}, {"NOTIFY_SOCKET": ""}], ids=["unset", "empty"])
def test_without_notify_socket_every_call_is_a_quiet_no(environ: dict[str, str]) -> None:
    notifier = Notifier.from_environ(environ)
    assert not notifier.enabled
    assert notifier.ready("x") is False
    assert notifier.status("x") is False
    assert notifier.watchdog() is False
    assert notifier.stopping("x") is False
    assert notifier.send(ANY=1) is False
    notifier.close()


def test_listener_gone_returns_false(short_dir: Path) -> None:
    path = str(short_dir / "gone")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.close()  # the socket file stays, nobody reads it: ECONNREFUSED
    notifier = Notifier(path)
    try:
        assert notifier.watchdog() is False
        assert notifier.ready("x") is False
    finally:
        notifier.close()


def test_missing_socket_path_returns_false(short_dir: Path) -> None:
    notifier = Notifier(str(short_dir / "never-bound"))
    try:
        assert notifier.enabled
        assert notifier.status("x") is False
    finally:
        notifier.close()


@pytest.mark.parametrize(("environ", "expected"), [
    ({"WATCHDOG_USEC": "30000000"}, 15.0),
    ({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "4242"}, 0.5),
    ({"WATCHDOG_USEC": "3"}, 1.5e-6),
    ({}, None),
    ({"WATCHDOG_USEC": ""}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "30s"}, None),
    ({"WATCHDOG_USEC": "-1000000"}, None),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4243"}, None),
], ids=["usec", "own-pid", "tiny", "unset", "empty", "zero", "non-numeric", "negative", "other-pid"])
def test_watchdog_interval(environ: dict[str, str], expected: float | None) -> None:
    result = watchdog_interval_s(environ, 4242)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)
