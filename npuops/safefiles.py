"""Reading, as root, files another user can write (an engine's log, CANN's logs, a profiler's traces): regular files
only, no symbolic link followed, tails read from the end in bounded memory.

Whoever writes a directory can put anything in it: a link to /etc/shadow named engine.log, a FIFO that blocks the
first reader forever, a sparse file of terabytes, a link to / in the middle of a log tree. So every path is opened
from a directory the caller trusts (the state dir, /var/lib, a home from the passwd file) one component at a time
with O_NOFOLLOW, each entry is lstat'ed before it is opened (a FIFO or a device is never opened) and fstat'ed after
(it must be the same regular file), and only a file's last `cap` bytes are read, seeking there first. What is left
out raises NotRead with a one-line reason, for the manifest of whatever the caller is gathering.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

READ_CHUNK = 1 << 20
# A cut text file starts at its first whole line when one begins this close to the cut (a binary file is kept).
LINE_SEARCH = 64 * 1024
# Directory walks stop here: a tree someone else writes may hold millions of entries or nest without end.
MAX_WALK_ENTRIES = 20000
MAX_WALK_DEPTH = 24
# Pseudo-filesystems whose "regular files" are kernel memory, tunables or endless: never read from a path a file
# names (a regular /proc/kcore is the machine's memory).
PSEUDO_ROOTS = (PurePosixPath("/proc"), PurePosixPath("/sys"), PurePosixPath("/dev"))

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: should a FIFO take the entry's place between the lstat and the open, the open does not wait.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS = ((stat.S_ISLNK, "a symbolic link (not followed)"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISFIFO, "a FIFO (not read: it could block forever)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotRead(Exception):
    """A file or directory that was left unread, and why (one line: the manifest says it); `missing` when it simply
    does not exist."""

    def __init__(self, reason: str, *, missing: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.missing = missing


@dataclass(frozen=True)
class ConfinedPath:
    """A path below a directory the caller trusts: `root` is opened as it is (its links are its owner's, root's),
    each component of `relative` without following a link."""

    root: Path
    relative: PurePosixPath = field(default_factory=PurePosixPath)

    def __post_init__(self) -> None:
        parts = self.relative.parts
        if (parts and parts[0] == "/") or ".." in parts:
            raise ValueError(f"{self.relative} is not a path inside {self.root}")

    def __truediv__(self, name: str | PurePosixPath) -> ConfinedPath:
        return ConfinedPath(self.root, self.relative / name)

    def __str__(self) -> str:
        return str(self.root.joinpath(*self.relative.parts))

    @property
    def name(self) -> str:
        return self.relative.name or self.root.name


def kind(mode: int) -> str:
    """What a non-regular file is, as a manifest says it."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def printable(text: str) -> str:
    """`text` with every character a terminal or a reader would not show as itself escaped (\\n, \\x1b, ...): a
    name from someone else's directory, safe to print and to list."""
    return "".join("\\\\" if c == "\\" else c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclass(frozen=True)
class Tail:
    data: bytes  # the file's last bytes, at most the cap
    size: int  # the file's size when it was opened
    left_out: int  # bytes before `data` that were not read


@dataclass(frozen=True)
class FoundFile:
    relative: PurePosixPath  # below the walked directory
    size: int
    mtime: float
    uid: int = 0  # its owner


@dataclass
class Walk:
    files: list[FoundFile] = field(default_factory=list)
    # Entries not taken, and why after their path ("is a symbolic link (not followed)").
    refused: list[tuple[PurePosixPath, str]] = field(default_factory=list)
    incomplete: str = ""  # why the walk stopped before it saw every entry ("" when it did)
    top_uid: int = 0  # the owner of the walked directory
    seen: int = 0  # entries looked at


def _why(error: OSError, dir_fd: int, name: str) -> str:
    """Why `name` in dir_fd could not be opened, after its path in a manifest (a link is named as one)."""
    if error.errno in (errno.ELOOP, errno.ENOTDIR):
        with contextlib.suppress(OSError):
            return f"is {kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)}"
    if error.errno == errno.ENOENT:
        return "does not exist"
    return f"cannot be read ({error.strerror})"


def _not_read(error: OSError, where: object, dir_fd: int, name: str) -> NotRead:
    return NotRead(f"{where} {_why(error, dir_fd, name)}", missing=error.errno == errno.ENOENT)


@contextlib.contextmanager
def _directory(root: Path, parts: tuple[str, ...]) -> Iterator[int]:
    """An fd of the directory root/parts..., every component below root opened without following a link."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the trusted root: followed
    except OSError as exc:
        raise NotRead(f"{root} does not exist" if exc.errno == errno.ENOENT else
                      f"{root} cannot be read ({exc.strerror})", missing=exc.errno == errno.ENOENT) from None
    where = root
    try:
        for part in parts:
            where = where / part
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _not_read(exc, where, fd, part) from None
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def _open_file(path: ConfinedPath, stack: contextlib.ExitStack) -> tuple[int, os.stat_result]:
    """lstat, then open: a FIFO or a device is never opened (a FIFO would block, a device could act)."""
    if not path.relative.parts:  # the trusted root is the file itself
        dir_fd, name, follow = None, str(path.root), True
    else:
        dir_fd = stack.enter_context(_directory(path.root, path.relative.parts[:-1]))
        name, follow = path.relative.parts[-1], False
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=follow)
        if not stat.S_ISREG(before.st_mode):
            raise NotRead(f"{path} is {kind(before.st_mode)}")
        fd = os.open(name, _FILE_FLAGS if not follow else os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError as exc:
        if dir_fd is None:
            raise NotRead(f"{path} does not exist" if exc.errno == errno.ENOENT else
                          f"{path} cannot be read ({exc.strerror})", missing=exc.errno == errno.ENOENT) from None
        raise _not_read(exc, path, dir_fd, name) from None
    stack.callback(os.close, fd)
    return fd, before


@contextlib.contextmanager
def open_regular(path: ConfinedPath, *, owner: int | None = None) -> Iterator[tuple[int, os.stat_result]]:
    """An fd (and its fstat) of the regular file `path`, no component below its root followed if a link; with
    `owner`, only a file that uid owns (one its writer could not have made is refused)."""
    with contextlib.ExitStack() as stack:
        fd, before = _open_file(path, stack)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != (before.st_dev, before.st_ino):
            raise NotRead(f"{path} was replaced while it was opened")
        if info.st_nlink > 1:
            # A hard link made by someone who can write the directory may be another user's file.
            raise NotRead(f"{path} has {info.st_nlink} hard links (it may be a file from elsewhere)")
        if owner is not None and info.st_uid != owner:
            raise NotRead(f"{path} is owned by uid {info.st_uid}, not {owner}: not a file its user wrote")
        yield fd, info


def read_tail(path: ConfinedPath, *, cap: int, whole_lines: bool = False, owner: int | None = None) -> Tail:
    """The last `cap` bytes of the regular file `path`, read from the end (a sparse file of terabytes costs `cap`);
    with whole_lines, a cut file starts at its first whole line (no half of a secret before the cut); with `owner`,
    only a file that uid owns."""
    with open_regular(path, owner=owner) as (fd, info):
        start = max(0, info.st_size - cap)
        chunks: list[bytes] = []
        got = 0
        try:
            os.lseek(fd, start, os.SEEK_SET)
            while got < cap:  # a file that grows meanwhile is read up to the cap, one that shrinks to its end
                chunk = os.read(fd, min(READ_CHUNK, cap - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except OSError as exc:
            raise NotRead(f"{path} cannot be read ({exc.strerror})") from None
    data = b"".join(chunks)
    left_out = start
    newline = data.find(b"\n", 0, LINE_SEARCH) if whole_lines and start else -1
    if newline >= 0:
        data, left_out = data[newline + 1:], start + newline + 1
    return Tail(data, info.st_size, left_out)


def _entry(fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None  # gone meanwhile


def _open_below(top_fd: int, below: PurePosixPath) -> int:
    """An fd of the directory `below` the walk's top, each component opened without following a link."""
    fd = os.dup(top_fd)
    try:
        for part in below.parts:
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except OSError:
        os.close(fd)
        raise
    return fd


def walk_regular_files(top: ConfinedPath, *, max_entries: int = MAX_WALK_ENTRIES,
                       max_depth: int = MAX_WALK_DEPTH) -> Walk:
    """The regular files under the directory `top` (relative to it), no link followed and no directory entered
    through one; every other entry (links, FIFOs, sockets, devices, unreadable directories) is named with why in
    `refused`. Breadth first (a directory's own files before those of its subdirectories, so a flood deep in a tree
    does not hide the files above it), each directory opened only when its turn comes (a wide tree costs one file
    descriptor at a time). Stops after max_entries entries (then `incomplete` says so)."""
    walk = Walk()
    with _directory(top.root, top.relative.parts) as top_fd:
        walk.top_uid = os.fstat(top_fd).st_uid
        queue: collections.deque[tuple[PurePosixPath, int]] = collections.deque([(PurePosixPath(), 0)])
        while queue:
            below, depth = queue.popleft()
            try:
                fd = _open_below(top_fd, below)
            except OSError as exc:  # replaced by a link, or removed, since it was listed
                walk.refused.append((below, _why(exc, top_fd, str(below))))
                continue
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        walk.seen += 1
                        if walk.seen > max_entries:
                            walk.incomplete = f"more than {max_entries} entries: the rest was not looked at"
                            return walk
                        _take(walk, queue, fd, below, entry.name, depth, max_depth)
            finally:
                os.close(fd)
    return walk


def _take(walk: Walk, queue: collections.deque[tuple[PurePosixPath, int]], fd: int, below: PurePosixPath,
          name: str, depth: int, max_depth: int) -> None:
    """One directory entry of a walk: a regular file is found, a directory queued, anything else refused."""
    path = below / name
    info = _entry(fd, name)
    if info is None:
        return
    if stat.S_ISREG(info.st_mode):
        walk.files.append(FoundFile(path, info.st_size, info.st_mtime, info.st_uid))
    elif not stat.S_ISDIR(info.st_mode):
        walk.refused.append((path, f"is {kind(info.st_mode)}"))
    elif depth + 1 > max_depth:
        walk.refused.append((path, f"is a directory deeper than {max_depth} levels (not entered)"))
    else:
        queue.append((path, depth + 1))


def directory_entries(top: ConfinedPath, *, max_entries: int = MAX_WALK_ENTRIES) -> tuple[list[tuple[str, int]], bool]:
    """The names and modes (lstat's: a link is a link) of the entries of the directory `top`, at most max_entries
    of them (True when there were more)."""
    found: list[tuple[str, int]] = []
    with _directory(top.root, top.relative.parts) as fd, os.scandir(fd) as entries:
        for entry in entries:
            if len(found) >= max_entries:
                return found, True
            info = _entry(fd, entry.name)
            if info is not None:
                found.append((entry.name, info.st_mode))
    return found, False


def untrusted_absolute(text: str) -> PurePosixPath:
    """A path a file names (not npuops), checked before anything under it is read: absolute, without `..`, and
    outside the kernel's pseudo-filesystems."""
    if "\0" in text:  # no file has one in its name; os.open would raise on it
        raise NotRead(f"{printable(text)} holds a NUL character")
    path = PurePosixPath(text)
    if not path.is_absolute():
        raise NotRead(f"{printable(text)} is not an absolute path")
    if ".." in path.parts:
        raise NotRead(f"{printable(text)} climbs with `..`")
    if path == PurePosixPath("/") or any(path == p or p in path.parents for p in PSEUDO_ROOTS):
        raise NotRead(f"{printable(text)} is / or under /proc, /sys or /dev")
    return path
