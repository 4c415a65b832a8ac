"""An instance's revisions: what it served, what changed, when and by which command, and the files of each.

Beside the instance's own files in `<state_dir>/<name>/`:
- `revisions.json` (0644, no secret): the history, oldest first; each entry a `Revision`.
- `revisions/<N>/` (0700): `launch.json` (0600: the plan request and the launch choices, whose `--env` values may be
  secret) and, for each part the revision installs (a single engine, or each replica behind a router), `<part>/`
  with that part's files as they were installed (vllm.yaml, the env file at 0600, instance.json, the unit). A
  rollback and `rollout --undo` put these back as they were: no planning, no model loading can fail on the way back.
- `rollout.json` (0644): a rollout in progress (its pid, the revisions, the part being switched and its step), for
  `status`; stale once its pid is gone.
- `<part>/rollout-hold` (0644): a replica a rollout holds out of its router until it is verified. The replica's
  supervisor does not join the router on its own while the holder's pid lives (a rollout killed half-way holds
  nothing: the next start joins as usual).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuops.atomic import write_files_as_one_set, write_text_atomic
from npuops.errors import ConfigError
from npuops.instance.control import pid_alive
from npuops.instance.record import (
    HOLD_FILE,
    REVISIONS_DIR,
    REVISIONS_FILE,
    ROLLOUT_FILE,
    InstanceRecord,
    validate_instance_name,
)
from npuops.wire import WireFormatError, WireObject

HISTORY_FORMAT = "npuops-revisions/1"
LAUNCH_FILE = "launch.json"
# How many revisions keep their files (for rollback and --undo); the history keeps every entry.
KEEP_FILES = 5

OUTCOME_SERVING = "serving"
OUTCOME_SUPERSEDED = "superseded"
OUTCOME_STOPPED = "stopped"  # a rollout that stopped half-way: some parts serve it, the rest the one before
OUTCOME_ROLLED_BACK = "rolled back"  # its first part failed and went back: nothing serves it
OUTCOME_ROLLING_OUT = "rolling out"  # its rollout is under way (or was killed)


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
        entry = WireObject.wrap(data, "revision")
        return cls(number=entry.req_integer("number"), at=entry.opt_number("at") or 0.0,
                   command=entry.req_text("command"), changes=entry.texts("changes"),
                   model_path=entry.text("model_path"),
                   served_model_name=entry.text("served_model_name"), parts=entry.texts("parts"),
                   outcome=entry.text("outcome", OUTCOME_SERVING), reason=entry.text("reason"))


def _instance_dir(state_dir: Path, name: str) -> Path:
    return state_dir / validate_instance_name(name)


def read_history(state_dir: Path, name: str) -> list[Revision]:
    """The instance's revisions, oldest first ([] for an instance launched before npuops kept them)."""
    path = _instance_dir(state_dir, name) / REVISIONS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc})",
                          f"move it away; the next `npuops launch` of {name} starts a new history") from None
    try:
        if not isinstance(data, dict) or data.get("format") != HISTORY_FORMAT:
            raise WireFormatError("revision history", f"its format is not {HISTORY_FORMAT}")
        return [Revision.from_json(entry.data) for entry in WireObject.wrap(data, "revisions").objects("revisions")]
    except WireFormatError as exc:
        raise ConfigError(f"{path} is not an npuops revision history ({exc.reason})",
                          f"move it away; the next `npuops launch` of {name} starts a new history") from None


def write_history(state_dir: Path, name: str, revisions: Sequence[Revision]) -> None:
    path = _instance_dir(state_dir, name) / REVISIONS_FILE
    data = {"format": HISTORY_FORMAT, "revisions": [r.to_json() for r in revisions]}
    write_text_atomic(path, json.dumps(data, indent=1) + "\n", mode=0o644)


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
    KEEP_FILES are removed (their history entries stay)."""
    directory = revision_dir(state_dir, name, number)
    directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory.parent, 0o700)  # the env files below may hold the API key
    files = [(directory / LAUNCH_FILE, json.dumps(dict(launch), indent=1) + "\n", 0o600)]
    for part, stored in parts.items():
        files += [(directory / validate_instance_name(part) / f.name, f.text, f.mode) for f in stored]
    write_files_as_one_set(files)
    _prune(directory.parent, keep_from=number - KEEP_FILES + 1)
    return directory


def _prune(revisions: Path, keep_from: int) -> None:
    with contextlib.suppress(OSError):
        for entry in os.scandir(revisions):
            if entry.name.isdigit() and int(entry.name) < keep_from:
                shutil.rmtree(entry.path, ignore_errors=True)


def stored_launch(state_dir: Path, name: str, number: int) -> dict[str, Any] | None:
    """The request and choices revision `number` was made from (None: its files were pruned or never kept)."""
    try:
        data = json.loads((revision_dir(state_dir, name, number) / LAUNCH_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def stored_parts(state_dir: Path, name: str, number: int) -> dict[str, list[StoredFile]]:
    """Each part's files of revision `number`, by part name ({} when they are gone)."""
    return read_parts(revision_dir(state_dir, name, number))


def read_parts(directory: Path) -> dict[str, list[StoredFile]]:
    """Each part's files in `directory`/<part>/ (a stored revision, or the files a group rollout staged here)."""
    parts: dict[str, list[StoredFile]] = {}
    with contextlib.suppress(OSError):
        for part in sorted(p for p in directory.iterdir() if p.is_dir()):
            parts[part.name] = [StoredFile(f.name, f.read_text(encoding="utf-8"), f.stat().st_mode & 0o777)
                                for f in sorted(part.iterdir()) if f.is_file()]
    return parts


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
    write_text_atomic(_instance_dir(state_dir, name) / ROLLOUT_FILE, json.dumps(progress.to_json()) + "\n",
                      mode=0o644)


def clear_progress(state_dir: Path, name: str) -> None:
    (_instance_dir(state_dir, name) / ROLLOUT_FILE).unlink(missing_ok=True)


def rollout_in_progress(state_dir: Path, name: str) -> RolloutProgress | None:
    """The rollout of `name` under way, or None (none, or its process is gone: a killed rollout holds nothing)."""
    try:
        progress = RolloutProgress.from_json(json.loads(
            (_instance_dir(state_dir, name) / ROLLOUT_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, WireFormatError):
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
        pid = int((record.directory / HOLD_FILE).read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
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
