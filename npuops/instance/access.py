"""What the service user can reach under its unit's sandbox: the vLLM and npuops executables with their
interpreters, and the model's files.

A hardened unit runs as an unprivileged user with `PrivateTmp=yes` (a /tmp and /var/tmp of its own) and
`ProtectHome=yes` (no /home, /root, /run/user). A venv made from an interpreter under /root (pyenv, conda), a
model under /tmp or weights saved 0600 by root all pass when root checks them and fail in the unit: the start
with `203/EXEC`, the engine with `FileNotFoundError` on the weights. So launch and the start gate ask here, for
the service user's uid and groups, following every symlink, before anything starts.

Pure but for the stat calls: permissions are the classic owner/group/other bits (POSIX ACLs are not read).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

# Where the unit's sandbox hides the host's files, and the option that does it (templates/_hardening.j2).
SANDBOX_HIDDEN: tuple[tuple[str, str], ...] = (
    ("/tmp", "PrivateTmp=yes gives the service a /tmp of its own"),
    ("/var/tmp", "PrivateTmp=yes gives the service a /var/tmp of its own"),
    ("/home", "ProtectHome=yes hides /home from the service"),
    ("/root", "ProtectHome=yes hides /root from the service"),
    ("/run/user", "ProtectHome=yes hides /run/user from the service"),
)
SERVICE_PLACES = "/opt, /srv or /var/lib"
# Files of a Hugging Face model directory the engine reads (deeper trees are rare; one level of subdirectories).
_MODEL_DEPTH = 1
_MAX_SYMLINKS = 40


@dataclass(frozen=True)
class ServiceIdentity:
    """Who a unit runs as: its user, uid and groups (primary and supplementary), and whether the unit's sandbox
    applies (real systemd; docker-systemctl-replacement, a container's init, ignores PrivateTmp=/ProtectHome=)."""

    user: str
    uid: int
    gids: frozenset[int]
    sandboxed: bool = True

    @classmethod
    def of(cls, user: str, extra_groups: tuple[str, ...] = (), *, sandboxed: bool = True) -> ServiceIdentity | None:
        """The identity of an existing user, with the unit's SupplementaryGroups; None when there is no such user."""
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            return None
        gids = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
        for name in extra_groups:
            try:
                gids.add(grp.getgrnam(name).gr_gid)
            except KeyError:
                continue
        return cls(user, entry.pw_uid, frozenset(gids), sandboxed)


@dataclass(frozen=True)
class AccessProblem:
    """Why the service user cannot use `path` (what was asked for) at `where` (the part that fails)."""

    what: str  # "the vllm executable", "the model directory", ...
    path: str
    where: str
    why: str
    fix: str

    def problem(self) -> str:
        at = "" if self.where == self.path else f" (at {self.where})"
        return f"{self.what} {self.path}{at}: {self.why}"


def hops(path: Path) -> Iterator[Path]:
    """The path and every path its symlinks lead to, in the order a lookup follows them (all absolute); last, the
    real path when a symlinked directory on the way makes it differ."""
    current = Path(os.path.abspath(path))
    for _ in range(_MAX_SYMLINKS):
        yield current
        if not current.is_symlink():
            real = Path(os.path.realpath(current))
            if real != current:
                yield real
            return
        current = Path(os.path.abspath(current.parent / os.readlink(current)))


def sandbox_hidden(path: Path) -> tuple[Path, str] | None:
    """The first hop of `path` that the sandbox hides, and why."""
    for hop in hops(path):
        for place, why in SANDBOX_HIDDEN:
            if hop == Path(place) or Path(place) in hop.parents:
                return hop, why
    return None


def sandbox_notes(paths: Sequence[tuple[str, str]]) -> list[str]:
    """For a unit rendered but not installed (`launch --dry-run`): each (what, path) the unit's sandbox would
    hide, with an executable's interpreter, said once. Installing it as rendered would fail its start gate."""
    notes: list[str] = []
    seen: set[str] = set()
    for what, path in paths:
        candidates = [(what, Path(path))]
        interpreter = interpreter_of(Path(path))
        if interpreter is not None:
            candidates.append((f"the interpreter of {what}", interpreter))
        for name, candidate in candidates:
            hidden = sandbox_hidden(candidate)
            if hidden is None or str(candidate) in seen:
                continue
            seen.add(str(candidate))
            where, why = hidden
            notes.append(f"the unit's sandbox would hide {name} {candidate} ({why}, at {where}): move it under "
                         f"{SERVICE_PLACES} before installing the unit")
    return notes


def _allows(st: os.stat_result, identity: ServiceIdentity, bits: int) -> bool:
    """Whether the owner/group/other bits of `st` give `identity` every permission in `bits` (r=4, w=2, x=1)."""
    mode = stat.S_IMODE(st.st_mode)
    if identity.uid == 0:
        # Root reads and writes anything; it runs what any execute bit allows.
        return not bits & 1 or bool(mode & 0o111)
    if st.st_uid == identity.uid:
        granted = (mode >> 6) & 7
    elif st.st_gid in identity.gids:
        granted = (mode >> 3) & 7
    else:
        granted = mode & 7
    return granted & bits == bits


def _permission_problem(path: Path, identity: ServiceIdentity, bits: int) -> tuple[Path, str] | None:
    """The first directory the user cannot search or the file it cannot use, along every hop of `path`."""
    for hop in hops(path):
        for directory in reversed(hop.parents):
            try:
                st = os.stat(directory)
            except OSError:
                break
            if not _allows(st, identity, 1):
                return directory, f"{identity.user} may not enter {directory} (mode {stat.S_IMODE(st.st_mode):04o})"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return path, "it does not exist"
    except OSError as exc:
        return path, exc.strerror or "it cannot be read"
    if not _allows(st, identity, bits):
        kind = {4: "read", 1: "run", 5: "read and run", 7: "use"}.get(bits, "use")
        owner = _owner(st)
        return path, f"{identity.user} may not {kind} it (mode {stat.S_IMODE(st.st_mode):04o}, owner {owner})"
    return None


def _owner(st: os.stat_result) -> str:
    try:
        return pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        return str(st.st_uid)


def path_problem(what: str, path: Path, identity: ServiceIdentity, bits: int, fix: str) -> AccessProblem | None:
    """Hidden by the sandbox, or not usable by the service user: the first reason, with `fix`."""
    hidden = sandbox_hidden(path) if identity.sandboxed else None
    if hidden is not None:
        where, why = hidden
        return AccessProblem(what, str(path), str(where), why,
                             f"keep it outside /tmp, /home and /root, e.g. under {SERVICE_PLACES}; {fix}")
    problem = _permission_problem(path, identity, bits)
    if problem is not None:
        where, why = problem
        return AccessProblem(what, str(path), str(where), why, fix)
    return None


def interpreter_of(script: Path) -> Path | None:
    """The interpreter a `#!` script names (a venv's console scripts name the venv's python)."""
    try:
        with open(script, "rb") as handle:
            first = handle.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env" and len(words) > 1:
        return None  # `#!/usr/bin/env python`: found on PATH at run time, nothing fixed to check
    return Path(words[0])


def executable_problems(what: str, executable: Path, identity: ServiceIdentity) -> list[AccessProblem]:
    """The executable (read and run) and, for a script, its interpreter (run), as the service user."""
    fix = (f"make {executable} and its interpreter readable by {identity.user}, or build the serving venv from an "
           "interpreter outside /root and /home (`python3.11 -m venv /opt/npuops/venv` with the system python; "
           "`npuops provision --tags python` does this)")
    problems = [p for p in [path_problem(what, executable, identity, 5, fix)] if p is not None]
    interpreter = interpreter_of(executable) if not problems else None
    if interpreter is not None:
        found = path_problem(f"the interpreter of {what}", interpreter, identity, 1, fix)
        if found is not None:
            problems.append(found)
    return problems


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        return sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return []


def model_problems(model: Path, identity: ServiceIdentity) -> list[AccessProblem]:
    """The model directory (list it) and every file in it (read it), one level of subdirectories deep, as the
    service user; the first few problems (a directory it cannot enter stands for everything in it)."""
    fix = (f"give {identity.user} read access: `chmod -R a+rX {model}` (or `chgrp -R {identity.user}` and g+rX), "
           f"and keep the model outside /tmp, /home and /root")
    first = path_problem("the model directory", model, identity, 5, fix)
    if first is not None:
        return [first]
    problems: list[AccessProblem] = []
    pending = [(model, _MODEL_DEPTH)]
    while pending and len(problems) < 3:
        directory, depth = pending.pop(0)
        for entry in _entries(directory):
            path = Path(entry.path)
            if entry.is_dir():
                if depth == 0 or entry.name.startswith("."):
                    continue
                found = path_problem("the model directory", path, identity, 5, fix)
                if found is None:
                    pending.append((path, depth - 1))
            elif entry.is_file():
                found = path_problem("the model file", path, identity, 4, fix)
            else:
                continue
            if found is not None:
                problems.append(found)
    return problems[:3]


def service_problems(identity: ServiceIdentity, *, vllm: Path, model: Path, supervisor: Path | None = None
                     ) -> list[AccessProblem]:
    """Everything a unit's service user must reach: the vllm executable, the npuops supervisor (ExecStart=), each
    with its interpreter, and the model's files."""
    problems = executable_problems("the vllm executable", vllm, identity)
    if supervisor is not None:
        problems += executable_problems("the npuops executable (the unit's ExecStart)", supervisor, identity)
    return problems + model_problems(model, identity)
