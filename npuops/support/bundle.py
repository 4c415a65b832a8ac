"""A support bundle: files gathered for diagnosis, each redacted and capped, with a manifest, as one .tar.gz.

The manifest (manifest.json, the bundle's first member) lists every file with its sha256, size and the command or
path it came from, whether it was cut to the per-file cap (logs keep their end, where a failure is), and every item
that was skipped with why (a tool not installed, a file absent or unreadable, the bundle's own cap reached). The
archive is written to a temporary file beside its destination and renamed into place (0600: it holds logs).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from npuops.support.redact import Redactor

MANIFEST = "manifest.json"
FILE_CAP_BYTES = 8 * 2**20
BUNDLE_CAP_BYTES = 256 * 2**20
TRUNCATED_NOTE = b"[... cut by npuops collect: the file's first %d bytes are left out, its end is kept ...]\n"


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

    def add(self, path: str, data: bytes | str, source: str) -> bool:
        """Add a file (redacted, then cut to the file cap keeping its end); False, with the reason in `skipped`,
        where the bundle's cap has no room for it."""
        path = _member_path(path)
        raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
        clean = self.redactor.data(raw)
        truncated = len(clean) > self.file_cap
        if truncated:
            dropped = len(clean) - self.file_cap
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

    def manifest(self) -> dict[str, Any]:
        return {**self.meta, "files": [f.as_dict() for f in self.files],
                "skipped": [s.as_dict() for s in self.skipped]}

    def write(self, destination: Path) -> Path:
        """The bundle as a .tar.gz at `destination` (0600), written atomically."""
        destination.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{destination.name}.", dir=destination.parent)
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
            os.replace(tmp_name, destination)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
        return destination


def read_bundle(path: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A bundle's manifest and files (for merging host bundles and for tests); refuses members that would land
    outside the bundle or are not regular files."""
    files: dict[str, bytes] = {}
    with tarfile.open(path, mode="r:gz") as tar:
        for member in tar.getmembers():
            name = _member_path(member.name)
            if not member.isfile():
                raise ValueError(f"{path}: member {name!r} is not a regular file")
            extracted = tar.extractfile(member)
            assert extracted is not None
            files[name] = extracted.read()
    manifest = json.loads(files.pop(MANIFEST))
    return manifest, files
