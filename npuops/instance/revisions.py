"""An instance's revisions: what it served, what changed, when and by which command, and the files of each.

Beside the instance's own files in `<state_dir>/<name>/`:
- `revisions.json` (0644, no secret): the history, oldest first; each entry a `Revision`.
- `revisions/<N>/`: `launch.json` (0600: the plan request and the launch choices, whose `--env` values may be
  secret) and, for each part the revision installs (a single engine, or each replica behind a router), `<part>/`
  with that part's files as they were installed (vllm.yaml, the env file at 0600, instance.json, the unit). A
  rollback and `rollout --undo` put these back as they were: no planning, no model loading can fail on the way back.
  So they keep the secrets the revision ran with: every directory from `revisions/` down is 0700, `remove` deletes
  them with the instance. What is read back is checked (types, names, regular files only) before a rollout uses it.
- `rollout.json` (0644): a rollout in progress (its pid, the revisions, the part being switched and its step), for
  `status`; stale once its pid is gone.
- `<part>/rollout-hold` (0644): a replica a rollout holds out of its router until it is verified. The replica's
  supervisor does not join the router on its own while the holder's pid lives (a rollout killed half-way holds
  nothing: the next start joins as usual).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from npuops.atomic import write_files_as_one_set, write_text_atomic
from npuops.errors import BadInputError, ConfigError
from npuops.instance.control import pid_alive
from npuops.instance.record import (
    HOLD_FILE,
    REVISIONS_DIR,
    REVISIONS_FILE,
    ROLLOUT_FILE,
    InstanceRecord,
    validate_instance_name,
)
from npuops.safefiles import ConfinedPath, NotRead, printable, read_tail
from npuops.wire import WireFormatError, WireObject, loads_json

HISTORY_FORMAT = "npuops-revisions/1"
LAUNCH_FILE = "launch.json"
# How many revisions keep their files (for rollback and --undo); the history keeps every entry.
KEEP_FILES = 5

OUTCOME_SERVING = "serving"
OUTCOME_SUPERSEDED = "superseded"
OUTCOME_STOPPED = "stopped"  # a rollout that stopped half-way: some parts serve it, the rest the one before
OUTCOME_ROLLED_BACK = "rolled back"  # its first part failed and went back: nothing serves it
OUTCOME_ROLLING_OUT = "rolling out"  # its rollout is under way (or was killed)
OUTCOMES = (OUTCOME_SERVING, OUTCOME_SUPERSEDED, OUTCOME_STOPPED, OUTCOME_ROLLED_BACK, OUTCOME_ROLLING_OUT)
# The range of a revision's number and time as a record keeps them (npuops.instance.record): a number names a
# directory, a time is shown as a date (localtime fails beyond year 9999, and on nan).
MAX_REVISION = 10**9
MAX_TIME = 10**11
# What npuops reads of a revision (revisions.json, a revision's launch.json and files): the history grows by one
# entry of well under a KiB per launch or rollout, a revision's files are a few KiB. Nothing npuops writes nests
# deeper than a few levels; Python's parser gives up with a RecursionError at about a thousand, and what walks a
# document after it would recurse as deep.
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_JSON_DEPTH = 32
HOLD_MAX_BYTES = 4096


def loads_checked(text: str) -> Any:
    """json.loads of a document npuops wrote; a document nested deeper than MAX_JSON_DEPTH is a ValueError too."""
    return loads_json(text, MAX_JSON_DEPTH)


def read_state_json(state_dir: Path, relative: PurePosixPath, fix: str) -> Any:
    """The JSON document at `relative` below the state dir, or None when it does not exist. What is there is read
    as data that may be hostile: a regular file only (a FIFO would hang the command forever), no link followed
    below the state dir, at most MAX_FILE_BYTES, UTF-8, nested as npuops nests; else a ConfigError with `fix`."""
    path = ConfinedPath(state_dir, relative)
    try:
        tail = read_tail(path, cap=MAX_FILE_BYTES)
    except NotRead as exc:
        if exc.missing:
            return None
        raise ConfigError(printable(exc.reason), fix) from None
    if tail.left_out:
        raise ConfigError(f"{path} is {tail.size} bytes, more than the {MAX_FILE_BYTES} npuops reads of it", fix)
    try:
        return loads_checked(tail.data.decode("utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc})", fix) from None


@dataclass(frozen=True)
class Revision:
    """One entry of the history: a launch, a rollout or an undo, and how it ended."""

    number: int
    at: float
    command: str  # "launch", "rollout", "rollout --undo"
    changes: tuple[str, ...]  # from the revision before ("model: /a -> /b"), or what the launch was
    model_path: str
    served_model_name: str
    parts: tuple[str, ...]
    outcome: str = OUTCOME_SERVING
    reason: str = ""  # why a rollout stopped

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "at": self.at, "command": self.command, "changes": list(self.changes),
                "model_path": self.model_path, "served_model_name": self.served_model_name,
                "parts": list(self.parts), "outcome": self.outcome, "reason": self.reason}

    @classmethod
    def from_json(cls, data: object) -> Revision:
        """An entry as to_json wrote it; a number, a time or an outcome npuops never writes is a WireFormatError
        (a revision number names a directory, the time is shown as a date)."""
        entry = WireObject.wrap(data, "revision")
        number = entry.req_integer("number")
        if not 1 <= number <= MAX_REVISION:
            raise entry.fail("number", f"is {number}, not a revision number (1 to {MAX_REVISION})")
        at = entry.opt_number("at") or 0.0
        if not (math.isfinite(at) and 0 <= at <= MAX_TIME):
            raise entry.fail("at", f"is {at}, not a time npuops writes (seconds since 1970, up to {MAX_TIME})")
        outcome = entry.text("outcome", OUTCOME_SERVING)
        if outcome not in OUTCOMES:
            raise entry.fail("outcome", f"is {outcome!r}, not one of {', '.join(OUTCOMES)}")
        return cls(number=number, at=at, command=entry.req_text("command"), changes=entry.texts("changes"),
                   model_path=entry.text("model_path"),
                   served_model_name=entry.text("served_model_name"), parts=entry.texts("parts"),
                   outcome=outcome, reason=entry.text("reason"))


def _instance_dir(state_dir: Path, name: str) -> Path:
    return state_dir / validate_instance_name(name)


def _history_entries(state_dir: Path, name: str) -> tuple[Path, list[WireObject]]:
    """revisions.json's entries, unchecked ([] when there is none); the file itself must be a history."""
    path = _instance_dir(state_dir, name) / REVISIONS_FILE
    fix = f"move it away; the next `npuops launch` of {name} starts a new history"
    data = read_state_json(state_dir, PurePosixPath(name, REVISIONS_FILE), fix)
    if data is None:
        return path, []
    try:
        if not isinstance(data, dict) or data.get("format") != HISTORY_FORMAT:
            raise WireFormatError("revision history", f"its format is not {HISTORY_FORMAT}")
        return path, WireObject.wrap(data, "revisions").objects("revisions")
    except WireFormatError as exc:
        raise ConfigError(f"{path} is not an npuops revision history ({exc.reason})", fix) from None


def read_history(state_dir: Path, name: str) -> list[Revision]:
    """The instance's revisions, oldest first ([] for an instance launched before npuops kept them). Every entry
    must be one npuops writes, each number once: the next revision's number and directory come from them."""
    listing = read_history_listing(state_dir, name)
    if listing.unreadable:
        first = listing.unreadable[0]
        raise ConfigError(f"{listing.path} is not an npuops revision history (entry {first.position}: "
                          f"{first.problem})",
                          f"`npuops rollout {name} --history` lists what it holds; move it away, and the next "
                          f"`npuops launch` of {name} starts a new history")
    return list(listing.revisions)


@dataclass(frozen=True)
class UnreadableEntry:
    """An entry of revisions.json that is not one npuops writes: its place in the file (from 1) and why."""

    position: int
    problem: str

    def to_json(self) -> dict[str, Any]:
        return {"entry": self.position, "problem": self.problem}


@dataclass(frozen=True)
class HistoryListing:
    """What `rollout --history` shows: the entries that read, and the ones that do not (a rollout refuses those)."""

    path: Path
    revisions: tuple[Revision, ...]
    unreadable: tuple[UnreadableEntry, ...] = ()


def read_history_listing(state_dir: Path, name: str) -> HistoryListing:
    """Every entry of the history, each read on its own: one damaged entry does not hide the others."""
    path, entries = _history_entries(state_dir, name)
    revisions: list[Revision] = []
    unreadable: list[UnreadableEntry] = []
    for position, entry in enumerate(entries, start=1):
        try:
            revision = Revision.from_json(entry.data)
        except WireFormatError as exc:
            unreadable.append(UnreadableEntry(position, exc.reason))
            continue
        if any(r.number == revision.number for r in revisions):
            unreadable.append(UnreadableEntry(position, f"revision {revision.number} is in the history twice"))
            continue
        revisions.append(revision)
    return HistoryListing(path, tuple(revisions), tuple(unreadable))


def write_history(state_dir: Path, name: str, revisions: Sequence[Revision]) -> None:
    path = _instance_dir(state_dir, name) / REVISIONS_FILE
    data = {"format": HISTORY_FORMAT, "revisions": [r.to_json() for r in revisions]}
    with _writing(state_dir, path):
        write_text_atomic(path, json.dumps(data, indent=1) + "\n", mode=0o644)


@contextlib.contextmanager
def _writing(state_dir: Path, what: Path) -> Iterator[None]:
    """An OSError writing `what` (a read-only or full file system, a directory that is a file) as one line."""
    try:
        yield
    except OSError as exc:
        where = exc.filename or what
        problem = "permission denied" if isinstance(exc, PermissionError) else exc.strerror
        raise BadInputError(f"cannot write {where}: {problem}",
                            f"make {state_dir} writable: npuops keeps the instances' records and revisions there "
                            "(setting state_dir; a group's revisions: the controller's --artifacts)") from None


def revision_dir(state_dir: Path, name: str, number: int) -> Path:
    return _instance_dir(state_dir, name) / REVISIONS_DIR / str(number)


@dataclass(frozen=True)
class StoredFile:
    name: str
    text: str
    mode: int


def store_revision(state_dir: Path, name: str, number: int, launch: Mapping[str, Any],
                   parts: Mapping[str, Sequence[StoredFile]]) -> Path:
    """A revision's launch (request and choices) and each part's files, as one set; older revisions' files beyond
    KEEP_FILES are removed (their history entries stay). The request's --env values and the env files may be
    secret: every directory is 0700 and those files 0600. A set that cannot be written leaves nothing."""
    directory = revision_dir(state_dir, name, number)
    files = [(directory / LAUNCH_FILE, json.dumps(dict(launch), indent=1) + "\n", 0o600)]
    for part, stored in parts.items():
        files += [(directory / validate_instance_name(part) / f.name, f.text, f.mode) for f in stored]
    private = [directory.parent, directory, *(directory / part for part in parts)]
    created = [d for d in private if not d.exists()]
    with _writing(state_dir, directory):
        try:
            for each in private:
                each.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(each, 0o700)
            write_files_as_one_set(files)
        except BaseException:
            for each in reversed(created):  # the set's temporaries are gone already: these hold nothing
                shutil.rmtree(each, ignore_errors=True)
            raise
    _prune(directory.parent, keep_from=number - KEEP_FILES + 1)
    return directory


def _prune(revisions: Path, keep_from: int) -> None:
    with contextlib.suppress(OSError):
        for entry in os.scandir(revisions):
            if entry.name.isdigit() and int(entry.name) < keep_from:
                shutil.rmtree(entry.path, ignore_errors=True)


def _damaged_revision_fix(name: str, directory: Path) -> str:
    return (f"move {directory} away (`npuops rollout {name} --undo` then returns to the revision before it), or "
            f"launch {name} again with the configuration you want")


def stored_launch(state_dir: Path, name: str, number: int) -> dict[str, Any] | None:
    """The request and choices revision `number` was made from, each a JSON object as LaunchOrigin wrote them
    (None: its files were pruned or never kept; ConfigError: they are there and damaged)."""
    directory = revision_dir(state_dir, name, number)
    path = directory / LAUNCH_FILE
    fix = _damaged_revision_fix(name, directory)
    data = read_state_json(state_dir, PurePosixPath(name, REVISIONS_DIR, str(number), LAUNCH_FILE), fix)
    if data is None:
        return None
    try:
        kept = WireObject.wrap(data, "revision's launch")
        kept.require("request", "choices")
        return {"request": dict(kept.obj("request").data), "choices": dict(kept.obj("choices").data)}
    except WireFormatError as exc:
        raise ConfigError(f"{path} is not what npuops keeps of a revision ({exc.reason})", fix) from None


def stored_parts(state_dir: Path, name: str, number: int) -> dict[str, list[StoredFile]]:
    """Each part's files of revision `number`, by part name ({} when they are gone)."""
    directory = revision_dir(state_dir, name, number)
    return read_parts(directory, _damaged_revision_fix(name, directory))


def read_parts(directory: Path, fix: str) -> dict[str, list[StoredFile]]:
    """Each part's files in `directory`/<part>/ (a stored revision, or the files a group rollout staged here):
    regular files only, never through a link; a part not named as an instance, a file that is not UTF-8 or
    cannot be read is a ConfigError with `fix`."""
    parts: dict[str, list[StoredFile]] = {}
    try:
        entries = sorted(directory.iterdir())
    except FileNotFoundError:
        return parts
    except OSError as exc:
        raise ConfigError(f"cannot read {directory} ({exc.strerror})", fix) from None
    for part in entries:
        if part.is_symlink() or not part.is_dir():
            continue  # launch.json beside the parts
        try:
            validate_instance_name(part.name)
        except BadInputError:
            raise ConfigError(f"{part} is not named as a part of an instance", fix) from None
        parts[part.name] = [_stored_file(f, fix) for f in _entries(part, fix)]
    return parts


def _entries(directory: Path, fix: str) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError as exc:
        raise ConfigError(f"cannot read {directory} ({exc.strerror})", fix) from None


def _stored_file(path: Path, fix: str) -> StoredFile:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot read {path} ({'a symbolic link' if exc.errno == errno.ELOOP else exc.strerror})",
                          fix) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path} is not a regular file", fix)
        if info.st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{path} is {info.st_size} bytes, more than the {MAX_FILE_BYTES} npuops reads of it",
                              fix)
        try:
            text = handle.read(MAX_FILE_BYTES + 1).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {path} ({exc})", fix) from None
    return StoredFile(path.name, text, info.st_mode & 0o777)


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flatten(f"{prefix}.{key}" if prefix and prefix != "fixed" else str(key), inner))
        return out
    return {prefix: value}


def request_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two plan requests (PlanRequest.to_json), one "key: old -> new" each. Pure."""
    before, after = _flatten("", old), _flatten("", new)
    changes = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a != b:
            changes.append(f"{key.removeprefix('workload.')}: {'-' if a is None else a} -> {'-' if b is None else b}")
    return changes


# --- a rollout in progress ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RolloutProgress:
    """A rollout in progress, for `status`: from and to which revision, the parts done, the one being switched."""

    pid: int
    started_at: float
    from_revision: int
    to_revision: int
    command: str
    parts: tuple[str, ...]
    done: tuple[str, ...] = ()
    current: tuple[str, ...] = ()
    step: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "started_at": self.started_at, "from_revision": self.from_revision,
                "to_revision": self.to_revision, "command": self.command, "parts": list(self.parts),
                "done": list(self.done), "current": list(self.current), "step": self.step}

    @classmethod
    def from_json(cls, data: object) -> RolloutProgress:
        state = WireObject.wrap(data, "rollout")
        return cls(pid=state.req_integer("pid"), started_at=state.opt_number("started_at") or 0.0,
                   from_revision=state.integer("from_revision"), to_revision=state.integer("to_revision"),
                   command=state.text("command"), parts=state.texts("parts"), done=state.texts("done"),
                   current=state.texts("current"), step=state.text("step"))

    def describe(self) -> str:
        doing = f"; {', '.join(self.current)}: {self.step}" if self.current else ""
        return (f"{self.command} from revision {self.from_revision} to {self.to_revision} in progress: "
                f"{len(self.done)} of {len(self.parts)} part(s) done{doing}")


def write_progress(state_dir: Path, name: str, progress: RolloutProgress) -> None:
    path = _instance_dir(state_dir, name) / ROLLOUT_FILE
    with _writing(state_dir, path):
        write_text_atomic(path, json.dumps(progress.to_json()) + "\n", mode=0o644)


def clear_progress(state_dir: Path, name: str) -> None:
    (_instance_dir(state_dir, name) / ROLLOUT_FILE).unlink(missing_ok=True)


def rollout_in_progress(state_dir: Path, name: str) -> RolloutProgress | None:
    """The rollout of `name` under way, or None (none, or its process is gone: a killed rollout holds nothing)."""
    try:
        data = read_state_json(state_dir, PurePosixPath(validate_instance_name(name), ROLLOUT_FILE), "")
        if data is None:
            return None
        progress = RolloutProgress.from_json(data)
    except (ConfigError, WireFormatError):  # `status` says nothing of a rollout whose file does not read
        return None
    return progress if pid_alive(progress.pid) else None


# --- a replica held out of its router ----------------------------------------------------------------------------

def hold_out_of_router(record: InstanceRecord, pid: int) -> None:
    write_text_atomic(record.directory / HOLD_FILE, f"{pid} {time.time():.0f}\n", mode=0o644)


def release_hold(record: InstanceRecord) -> None:
    (record.directory / HOLD_FILE).unlink(missing_ok=True)


def held_out_of_router(record: InstanceRecord) -> int | None:
    """The pid of the rollout holding this replica out of its router until it is verified, or None."""
    try:
        # Read as the state dir's other files: a FIFO put there must not hang the replica's supervisor.
        pid = int(read_tail(ConfinedPath(record.directory, PurePosixPath(HOLD_FILE)), cap=HOLD_MAX_BYTES)
                  .data.decode("ascii").split()[0])
    except (NotRead, ValueError, IndexError):
        return None
    return pid if pid_alive(pid) else None


@dataclass(frozen=True)
class LaunchOrigin:
    """What a launch or a rollout was made from, kept with its revision: the plan request (PlanRequest.to_json),
    the launch choices (LaunchChoices.to_json) and the command line that made it."""

    request: Mapping[str, Any]
    choices: Mapping[str, Any]
    command: str = "launch"
    changes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"request": dict(self.request), "choices": dict(self.choices)}
