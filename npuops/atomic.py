"""Atomic file writes: a reader (node_exporter, systemd, a rerun) sees the old file or the new, never half."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write to a temp file in the same directory, fsync, set the mode, then rename over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temporary(path, text, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as an interruption while files are written, so their temporaries are removed (the CLI
    reports it as interrupted)."""


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises Terminated (in the main thread; elsewhere signals cannot be handled), so a
    `finally` or `except BaseException` runs instead of the process vanishing with half-written files."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def write_files_as_one_set(files: Sequence[tuple[Path, str, int]]) -> list[Path]:
    """(path, text, mode) files that belong together (one launch's configs, env files, records and units, across
    directories): every one is written to a temporary first, then all are renamed into place. An error, SIGINT or
    SIGTERM before the renames removes the temporaries and leaves the old set whole; an OSError names the file."""
    temps: list[tuple[str, Path]] = []
    with terminate_as_interrupt():
        try:
            for path, text, mode in files:
                try:
                    if path.is_dir():  # the rename would fail after others were done: refused before any
                        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
                    path.parent.mkdir(parents=True, exist_ok=True)
                    temps.append((_write_temporary(path, text, mode), path))
                except OSError as exc:  # named by the file the set could not hold, not by a temporary's name
                    raise OSError(exc.errno, exc.strerror, str(path)) from exc
            for tmp, path in temps:
                os.replace(tmp, path)
        except BaseException:
            for tmp, _ in temps:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise
    return [path for _, path in temps]


def _write_temporary(path: Path, text: str, mode: int) -> str:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)  # before any content lands: a secret is never briefly world-readable
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp
