"""One lock per instance, taken by every command that changes it (launch, rollout, stop, remove).

The lock is an flock on `<state_dir>/.NAME.lock`: beside the instance's directory, not in it (`remove` deletes that
directory), and never deleted itself (a waiting holder would keep the old inode while a newcomer locks a new one).
Its holder writes who it is into the file once it holds the lock (the command's words, its pid, since when), so a
command refused names the one in its way. The lock goes with the process, even when it is killed; what a dead
holder wrote stays until the next one overwrites it, and is read only when a live process holds the lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from npuops.errors import BadInputError, ConfigError
from npuops.instance.record import is_instance_name, state_dir_error, validate_instance_name

LOCK_SUFFIX = ".lock"
# What a holder may call itself: npuops' command words, nothing that could carry a secret or a control character.
_COMMAND = re.compile(r"npuops [a-z][a-z -]{0,40}")
_HOLDER_BYTES = 4096


def lock_path(state_dir: Path, name: str) -> Path:
    return state_dir / f".{validate_instance_name(name)}{LOCK_SUFFIX}"


@dataclass(frozen=True)
class LockHolder:
    """Who holds an instance's lock: the command (e.g. "npuops rollout"), the instance it acts on, its pid, and
    since when (a Unix time)."""

    command: str
    instance: str
    pid: int
    since: float

    def to_json(self) -> dict[str, object]:
        return {"command": self.command, "instance": self.instance, "pid": self.pid, "since": self.since}

    @classmethod
    def from_text(cls, text: str) -> LockHolder | None:
        """What a holder wrote, or None when it is not one (empty: a holder that has not written yet, or an npuops
        that wrote nothing)."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict):
            return None
        command, instance, pid, since = (data.get(k) for k in ("command", "instance", "pid", "since"))
        if not (isinstance(command, str) and _COMMAND.fullmatch(command) and isinstance(instance, str)
                and is_instance_name(instance) and isinstance(pid, int) and not isinstance(pid, bool)
                and 0 < pid < 2**31 and isinstance(since, (int, float)) and not isinstance(since, bool)
                and 0 <= since < 10**11):
            return None
        return cls(command, instance, pid, float(since))

    def describe(self) -> str:
        started = time.localtime(self.since)
        same_day = time.localtime()[:3] == started[:3]
        return (f"{self.command} of {self.instance!r} (pid {self.pid}, since "
                f"{time.strftime('%H:%M:%S' if same_day else '%Y-%m-%d %H:%M:%S', started)})")


@contextlib.contextmanager
def instance_lock(state_dir: Path, names: Sequence[str], command: str) -> Iterator[None]:
    """Hold the locks of `names` (the instance first, then its parts) for the block, as `command` ("npuops stop");
    BadInputError naming the holder when another process holds one of them. Refused at once, never waited for:
    the operator learns what runs instead of a command that hangs."""
    if not _COMMAND.fullmatch(command):
        raise ValueError(f"{command!r} is not an npuops command")
    if not names:
        raise ValueError("no instance to lock")
    holder = LockHolder(command, validate_instance_name(names[0]), os.getpid(), time.time())
    _make_state_dir(state_dir)
    with contextlib.ExitStack() as held:
        for name in sorted(set(names)):
            fd = _open_lock(lock_path(state_dir, name))
            if fd is None:
                continue
            held.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _refusal(name, _read_holder(fd)) from None
            _write_holder(fd, holder)
        yield


def _refusal(name: str, holder: LockHolder | None) -> BadInputError:
    if holder is None:
        return BadInputError(f"another npuops command holds {name}'s lock",
                             "wait for it to finish, then run this again")
    return BadInputError(f"{holder.describe()} holds {name}'s lock",
                         f"wait for it to finish, or stop it (pid {holder.pid}), then run this again")


def _make_state_dir(state_dir: Path) -> None:
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise state_dir_error(state_dir, exc) from None


def _open_lock(path: Path) -> int | None:
    """The lock file, opened without following a link and checked to be a regular file of its own; None on a
    read-only file system where it does not exist (then nobody can have taken it)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.EROFS:  # `stop` on a read-only state dir still locks against another reader
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            except OSError as again:
                raise _unusable(path, again) from None
        else:
            raise _unusable(path, exc) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        kind = "not a regular file" if not stat.S_ISREG(info.st_mode) else "a file with other links to it"
        raise ConfigError(f"the lock file {path} is {kind}",
                          f"remove it (`rm {path}`): npuops creates its lock files itself")
    return fd


def _unusable(path: Path, exc: OSError) -> ConfigError:
    if exc.errno == errno.ELOOP:
        return ConfigError(f"the lock file {path} is a symbolic link",
                           f"remove the link (`rm {path}`): npuops creates its lock files itself")
    if exc.errno == errno.ENOTDIR:
        return state_dir_error(path.parent, exc)
    return ConfigError(f"cannot open the lock file {path}: {exc.strerror}",
                       "run as root (or the user that launched the instance)")


def _read_holder(fd: int) -> LockHolder | None:
    try:
        data = os.pread(fd, _HOLDER_BYTES, 0)
    except OSError:
        return None
    return LockHolder.from_text(data.decode("utf-8", errors="replace"))


def _write_holder(fd: int, holder: LockHolder) -> None:
    """Through the locked file itself (the lock is its inode: no rename); a read-only one keeps what it had."""
    data = (json.dumps(holder.to_json()) + "\n").encode()
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
