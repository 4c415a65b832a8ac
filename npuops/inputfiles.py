"""Files npuops reads as input (an API key file, an env file, a checksum list, a config): checked for type, size and
encoding before their contents are used, each problem one line naming the path and the fix.

A FIFO or a device would block a read forever or never end, a multi-megabyte "key" would be copied into an env
file, and bytes that are not UTF-8 would end in a traceback: the file is opened without blocking, must be a regular
file, is read up to a bound, and is decoded strictly.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from npuops.errors import BadInputError

KIB = 1024
MIB = 1024 * KIB

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_input_bytes(path: Path, what: str, *, max_bytes: int, fix: str) -> bytes:
    """The bytes of `path`, a regular file of at most `max_bytes`; else BadInputError naming `what` and `path`."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BadInputError(f"{what} {path} does not exist", fix) from None
    except IsADirectoryError:
        raise BadInputError(f"{what} {path} is a directory, not a file", fix) from None
    except OSError as exc:
        raise BadInputError(f"cannot read {what} {path}: {exc.strerror}", fix) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInputError(f"{what} {path} is {_kind(info.st_mode)}, not a regular file", fix)
        if info.st_size > max_bytes:
            raise BadInputError(f"{what} {path} is {info.st_size} bytes, more than the {max_bytes} it may have", fix)
        try:
            data = os.read(fd, max_bytes + 1)
        except OSError as exc:
            raise BadInputError(f"cannot read {what} {path}: {exc.strerror}", fix) from None
        if len(data) > max_bytes:  # it grew since fstat
            raise BadInputError(f"{what} {path} is more than the {max_bytes} bytes it may have", fix)
        return data
    finally:
        os.close(fd)


def read_input_text(path: Path, what: str, *, max_bytes: int = MIB, fix: str) -> str:
    """The text of `path` (UTF-8, a regular file of at most `max_bytes`); else one BadInputError naming the path."""
    data = read_input_bytes(path, what, max_bytes=max_bytes, fix=fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInputError(f"{what} {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                            fix) from None


API_KEY_MAX_BYTES = 4 * KIB


def read_api_key_file(path: Path) -> str:
    """An API key from a file only its owner can read (it must never reach a command line)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise BadInputError(f"cannot read API key file {path}: {exc.strerror}", "create it with mode 0600") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise BadInputError(f"API key file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o})",
                            f"chmod 600 {path}")
    fix = "write only the key into it, one line of printable ASCII, at most 4 KiB"
    key = read_input_text(path, "API key file", max_bytes=API_KEY_MAX_BYTES, fix=fix).strip()
    # The key travels as an HTTP header value and an env file line: printable ASCII without spaces only.
    if not key or any(not ("!" <= c <= "~") for c in key):
        raise BadInputError(f"API key file {path} must hold one key on one line", fix)
    return key
