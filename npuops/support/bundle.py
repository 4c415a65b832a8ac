"""A support bundle: files gathered for diagnosis, each redacted and capped, with a manifest, as one .tar.gz.

The manifest (manifest.json, the bundle's first member) lists every file with its sha256, size and the command or
path it came from, whether it was cut to the per-file cap (logs keep their end, where a failure is), and every item
that was skipped with why (a tool not installed, a file absent or unreadable, a link or a FIFO not followed, the
bundle's own cap reached). The archive is written to a temporary file beside its destination and renamed into place
(0600: it holds logs); the destination is checked first (`check_destination`): a bundle replaces only a bundle, or
with --force a file, a FIFO or a link to a file (the link itself), never a device, a directory, a link to anything
else or anything under /proc, /sys, /dev or /run.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from npuops.errors import BadInputError
from npuops.safefiles import ConfinedPath, NotRead, kind, open_regular
from npuops.support.redact import Redactor

MANIFEST = "manifest.json"
FILE_CAP_BYTES = 8 * 2**20
BUNDLE_CAP_BYTES = 256 * 2**20
TRUNCATED_NOTE = b"[... cut by npuops collect: the file's first %d bytes are left out, its end is kept ...]\n"
BUNDLE_SUFFIX = ".tar.gz"
# Bounds on a bundle read back (another host's, or the file an --output would replace): its manifest, its members.
MANIFEST_READ_CAP = 64 * 2**20
MAX_MEMBERS = 100_000
# Where a bundle is never written, whatever --force says: the kernel's pseudo-filesystems, and the trees of devices
# and runtime state, whose entries are devices, sockets and links to them (/dev/stdout names a pipe or a terminal).
NEVER_UNDER = (Path("/proc"), Path("/sys"), Path("/dev"), Path("/run"))
# A bundle is a file renamed into place: it cannot go into a pipe, a terminal or a device.
NOT_A_FILE_FIX = "give --output a file name in a directory on a disk, e.g. ./bundle.tar.gz (a bundle is written " \
                 "as a file and renamed into place: it is never streamed into a pipe, a terminal or a device)"


@dataclass(frozen=True)
class BundleFile:
    path: str  # inside the bundle
    source: str  # the command or file it came from
    sha256: str
    size: int
    truncated: bool

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "sha256": self.sha256, "size": self.size,
                "truncated": self.truncated}


@dataclass(frozen=True)
class Skipped:
    what: str
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"what": self.what, "why": self.why}


def _member_path(path: str) -> str:
    """A relative POSIX path inside the bundle, never escaping it."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise ValueError(f"bundle path {path!r} is not a relative path inside the bundle")
    return str(pure)


@dataclass
class Bundle:
    """The files of one bundle in memory (each redacted and capped as it is added), then written as a .tar.gz."""

    redactor: Redactor
    file_cap: int = FILE_CAP_BYTES
    bundle_cap: int = BUNDLE_CAP_BYTES
    files: list[BundleFile] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    _data: dict[str, bytes] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(len(d) for d in self._data.values())

    def add(self, path: str, data: bytes | str, source: str, *, left_out: int = 0) -> bool:
        """Add a file (redacted, then cut to the file cap keeping its end): a file's `data` comes already bounded,
        its tail read from the end with `left_out` bytes before it unread (npuops.safefiles.read_tail); a command's
        output is cut here. False, with the reason in `skipped`, where the bundle's cap has no room for it. Its path
        is redacted too (a file name can hold a token)."""
        original, path = path, _member_path(self.redactor.text(path))
        if path != original:  # two names that differ only in a secret stay two files
            stem, n = path, 1
            while path in self._data:
                n += 1
                path = f"{stem}.{n}"
        raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
        clean = self.redactor.data(raw)
        dropped = left_out + max(0, len(clean) - self.file_cap)
        truncated = dropped > 0
        if truncated:
            clean = (TRUNCATED_NOTE % dropped) + clean[-self.file_cap:]
        if self.size + len(clean) > self.bundle_cap:
            self.skipped.append(Skipped(path, f"the bundle's cap of {self.bundle_cap // 2**20} MiB is reached "
                                              "(--max-mib raises it)"))
            return False
        self._data[path] = clean
        self.files = [f for f in self.files if f.path != path]
        self.files.append(BundleFile(path, source, hashlib.sha256(clean).hexdigest(), len(clean), truncated))
        return True

    def skip(self, what: str, why: str) -> None:
        self.skipped.append(Skipped(what, why))

    def data(self, path: str) -> bytes:
        return self._data[path]

    def redacted(self, value: Any) -> Any:
        """A JSON value with every string in it (keys too) passed through the bundle's redactor: what the manifest
        and the summary printed say (a reason quotes a record's value, a source names a file) is text like the
        files'."""
        if isinstance(value, str):
            return self.redactor.text(value)
        if isinstance(value, dict):
            return {self.redacted(k): self.redacted(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.redacted(v) for v in value]
        return value

    def manifest(self) -> dict[str, Any]:
        """The manifest, redacted like the files."""
        return dict(self.redacted({**self.meta, "files": [f.as_dict() for f in self.files],
                                   "skipped": [s.as_dict() for s in self.skipped]}))

    def write(self, destination: Path, *, force: bool = False) -> Path:
        """The bundle as a .tar.gz at `destination` (0600), written atomically, where check_destination allows."""
        check_destination(destination, force=force)
        try:
            destination.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{destination.name}.", dir=destination.parent)
        except OSError as exc:
            raise BadInputError(f"cannot write the bundle in {destination.parent}: {exc.strerror}",
                                "give --output a path in a directory you can write") from None
        try:
            with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
                now = time.time()
                members = [(MANIFEST, json.dumps(self.manifest(), indent=1).encode() + b"\n")]
                members += [(f.path, self._data[f.path]) for f in self.files]
                for name, payload in members:
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = len(payload), int(now), 0o600
                    tar.addfile(info, io.BytesIO(payload))
            os.chmod(tmp_name, 0o600)
            os.replace(tmp_name, destination)  # a rename: replaces a link or a FIFO there, never follows or opens it
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            if isinstance(exc, OSError):
                raise BadInputError(f"cannot write the bundle {destination}: {exc.strerror}",
                                    "give --output a path on a disk with room for it") from None
            raise
        return destination


def _existing_ancestor(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _never_under(path: Path) -> Path | None:
    return next((p for p in NEVER_UNDER if path == p or p in path.parents), None)


def _check_link(destination: Path, *, force: bool) -> None:
    """A link at --output is replaced itself (never written through), and only with --force and when it names a
    regular file outside NEVER_UNDER: a link to a device, a pipe (/proc/self/fd/1), a directory, or nothing is not
    an operator's file to overwrite, and --force does not change that."""
    real = Path(os.path.realpath(destination))
    # /proc/self/fd/1 names whatever the process's stdout is (a pipe, a terminal, pytest's capture file): the first
    # step of the link counts as much as where it ends.
    first = Path(os.path.normpath(destination.parent / os.readlink(destination)))
    under = _never_under(first) or _never_under(real)
    try:
        target: os.stat_result | None = os.stat(destination)  # stat, not open: a FIFO there is not opened
    except OSError:
        target = None
    if target is None or not stat.S_ISREG(target.st_mode) or under is not None:
        what = ("a link that names nothing (or a loop)" if target is None else
                f"a link to {kind(target.st_mode)} ({real})" if not stat.S_ISREG(target.st_mode) else
                f"a link to {first}, under {under}")
        raise BadInputError(f"--output {destination} is {what}; a bundle never replaces it", NOT_A_FILE_FIX)
    if not force:
        raise BadInputError(f"--output {destination} exists and is a link to the file {real}",
                            "choose another --output, or add --force to replace the link itself (the file it names "
                            "is left as it is)")


def check_destination(destination: Path, *, force: bool) -> None:
    """Refuse, in one line with the fix, a destination a bundle must not be written to: under /proc, /sys, /dev or
    /run, in a directory that is a file, over a directory, a device, a socket or a link to anything but a regular
    file (always), or over anything that is not a bundle of ours (a FIFO, a link to a file, another file) unless
    `force`. A bundle of ours is replaced."""
    destination = destination.absolute()
    ancestor = _existing_ancestor(destination.parent)
    if not ancestor.is_dir():
        raise BadInputError(f"--output {destination} cannot be written: {ancestor} is not a directory",
                            "give --output a path in a directory")
    real = Path(os.path.realpath(ancestor))
    under = _never_under(real) or _never_under(destination.parent)
    if under is not None:
        raise BadInputError(f"--output {destination} is under {under}, which holds devices and the kernel's or "
                            "services' runtime state, not files", NOT_A_FILE_FIX)
    try:
        info = os.lstat(destination)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BadInputError(f"--output {destination} cannot be checked: {exc.strerror}",
                            "give --output another path") from None
    mode = info.st_mode
    if stat.S_ISDIR(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
        raise BadInputError(f"--output {destination} is {kind(mode)}; a bundle never replaces one", NOT_A_FILE_FIX)
    if stat.S_ISLNK(mode):
        _check_link(destination, force=force)
        return
    if stat.S_ISREG(mode) and is_our_bundle(destination):
        return
    if not force:
        what = "a file that is not an npuops bundle" if stat.S_ISREG(mode) else kind(mode)
        raise BadInputError(f"--output {destination} exists and is {what}",
                            "choose another --output, or add --force to replace it")


def is_our_bundle(path: Path) -> bool:
    """Whether `path` is a bundle npuops wrote: a .tar.gz whose first member is our manifest (read in bounded memory,
    without following a link)."""
    if not path.name.endswith(BUNDLE_SUFFIX):
        return False
    try:
        with open_regular(ConfinedPath(path.parent, PurePosixPath(path.name))) as (fd, _info), \
                os.fdopen(os.dup(fd), "rb") as raw, tarfile.open(fileobj=raw, mode="r:gz") as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST or not first.isfile() or first.size > MANIFEST_READ_CAP:
                return False
            extracted = tar.extractfile(first)
            manifest = json.loads(extracted.read(MANIFEST_READ_CAP)) if extracted is not None else None
    except (NotRead, OSError, EOFError, tarfile.TarError, zlib.error, ValueError, RecursionError):
        return False
    return isinstance(manifest, dict) and isinstance(manifest.get("files"), list) and \
        isinstance(manifest.get("skipped"), list)


def read_bundle(path: Path, *, max_bytes: int = 2 * BUNDLE_CAP_BYTES) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A bundle's manifest and files (for merging host bundles and for tests); refuses (ValueError) members that
    would land outside the bundle or are not regular files, and more than `max_bytes` or MAX_MEMBERS (another
    host's bundle is read in bounded memory)."""
    files: dict[str, bytes] = {}
    total = 0
    with tarfile.open(path, mode="r:gz") as tar:
        for count, member in enumerate(tar, start=1):
            name = _member_path(member.name)
            if not member.isfile():
                raise ValueError(f"{path}: member {name!r} is not a regular file")
            total += member.size
            if count > MAX_MEMBERS or total > max_bytes:
                raise ValueError(f"{path} holds more than {MAX_MEMBERS} files or {max_bytes // 2**20} MiB")
            extracted = tar.extractfile(member)
            assert extracted is not None
            files[name] = extracted.read(member.size)
    if MANIFEST not in files:
        raise ValueError(f"{path} has no {MANIFEST}")
    manifest = json.loads(files.pop(MANIFEST))
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: its {MANIFEST} is not an object")
    return manifest, files
