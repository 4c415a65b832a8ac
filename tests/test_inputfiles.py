"""Input files are checked for type, size and encoding before use (npuops/inputfiles.py): a FIFO is refused at
once instead of blocking, a directory, a device, an oversized or non-UTF-8 file each get one line naming the path."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from npuops.errors import BadInputError
from npuops.inputfiles import API_KEY_MAX_BYTES, read_api_key_file, read_input_text
from npuops.provision.packages import sha256_file
from tests.support.paths import REPO


def _read(path: Path, max_bytes: int = 64) -> str:
    return read_input_text(path, "test file", max_bytes=max_bytes, fix="give a small text file")


def test_a_regular_utf8_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("héllo\n", encoding="utf-8")
    assert _read(path) == "héllo\n"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            _read(fifo)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=30)
    if reader.is_alive():  # unblock the reader so the test process can end, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("reading a FIFO blocked")
    assert len(outcome) == 1 and isinstance(outcome[0], BadInputError), outcome
    assert "is a FIFO, not a regular file" in outcome[0].problem and str(fifo) in outcome[0].problem


@pytest.mark.parametrize(("make", "expected"), [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.symlink_to("/dev/zero"), "is a character device"),
    (lambda p: p.write_bytes(b"x" * 65), "is 65 bytes, more than the 64"),
    (lambda p: p.write_bytes(b"ok \xff\xfe"), "is not UTF-8 text (byte 0xff at offset 3)"),
    (lambda p: None, "does not exist"),
])
def test_what_is_not_a_small_text_file_gets_one_line(tmp_path: Path, make: Callable[[Path], object],
                                                     expected: str) -> None:
    path = tmp_path / "input"
    make(path)
    with pytest.raises(BadInputError) as caught:
        _read(path)
    assert expected in caught.value.problem and str(path) in caught.value.problem, caught.value.problem
    assert caught.value.fix == "give a small text file"
    assert "\n" not in caught.value.one_line()


def test_an_api_key_file_is_one_line_of_printable_ascii_of_bounded_size(tmp_path: Path) -> None:
    key = tmp_path / "key"
    for content, problem in ((b"x" * (API_KEY_MAX_BYTES + 1), "more than the 4096"),
                             (b"sk-\xff", "not UTF-8"),
                             (b"sk one\n", "one key on one line"),
                             (b"sk-1\nsk-2\n", "one key on one line"),
                             ("sk-é".encode(), "one key on one line"),
                             (b"\n", "one key on one line")):
        key.write_bytes(content)
        key.chmod(0o600)
        with pytest.raises(BadInputError, match=problem):
            read_api_key_file(key)
    key.write_bytes(b"sk-0123456789abcdef\n")
    assert read_api_key_file(key) == "sk-0123456789abcdef"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(BadInputError, match="FIFO"):
        read_api_key_file(fifo)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120, check=False)


def _one_line_refusal(done: subprocess.CompletedProcess[str], problem: str) -> None:
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and problem in lines[0] and "fix:" in lines[0], done.stderr


def test_commands_refuse_broken_input_files_in_one_line(tmp_path: Path) -> None:
    """doctor --env-file with bytes that are not UTF-8, or a FIFO; a SHA256SUMS that is a directory or not UTF-8;
    a package that cannot be read in `packages index`."""
    env_file = tmp_path / "env"
    env_file.write_bytes(b"A=\xff\xfe\n")
    _one_line_refusal(_cli("doctor", "--env-file", str(env_file), cwd=tmp_path), "is not UTF-8 text")
    fifo = tmp_path / "env.fifo"
    os.mkfifo(fifo)
    _one_line_refusal(_cli("doctor", "--env-file", str(fifo), cwd=tmp_path), "is a FIFO")

    packages = tmp_path / "packages"
    packages.mkdir()
    (packages / "Ascend-cann-toolkit_8.1.RC1_linux-x86_64.run").write_bytes(b"#!/bin/sh\n")
    (packages / "SHA256SUMS").mkdir()
    argv = ("provision", "--packages", str(packages), "--host", "localhost", "--check")
    _one_line_refusal(_cli(*argv, cwd=tmp_path), "SHA256SUMS is a directory")
    (packages / "SHA256SUMS").rmdir()
    (packages / "SHA256SUMS").write_bytes(b"\xff" * 64 + b"  x.run\n")
    _one_line_refusal(_cli(*argv, cwd=tmp_path), "is not UTF-8 text")
    # A package that cannot be opened is named (root reads any file, so here it is a link whose target is gone);
    # `packages index` lists only the files that are there.
    (packages / "SHA256SUMS").unlink()
    (packages / "broken.run").symlink_to(tmp_path / "gone")
    with pytest.raises(BadInputError, match=r"cannot read the package .*broken\.run"):
        sha256_file(packages / "broken.run")
    done = _cli("packages", "index", str(packages), cwd=tmp_path)
    assert done.returncode == 0 and "broken.run" not in (packages / "SHA256SUMS").read_text(), done.stderr
