"""A launch's or a rollout's files as a revision of the instance (npuops.instance.revisions keeps them), and
what a revision keeps read back as a rollout uses it: checked, since a rollout installs it as root."""

from __future__ import annotations

import collections.abc
import json
import time
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError, ConfigError, NpuopsError
from npuops.instance.record import (
    CONFIG_FILE,
    ENV_FILE,
    RECORD_FILE,
    UNIT_SUFFIX,
    InstanceRecord,
    validate_instance_name,
)
from npuops.instance.revisions import (
    LAUNCH_FILE,
    OUTCOME_SERVING,
    OUTCOME_SUPERSEDED,
    LaunchOrigin,
    Revision,
    StoredFile,
    loads_checked,
    read_history,
    revision_dir,
    store_revision,
    stored_launch,
    stored_parts,
    write_history,
)
from npuops.launch.instance_files import InstanceFiles, RenderedFile
from npuops.launch.prepare import LaunchChoices
from npuops.plan.inputs import PlanRequest, Workload
from npuops.plan.server_options import ServerOptions


def with_revision(instance: InstanceFiles, number: int) -> InstanceFiles:
    """The instance's files with its record (instance.json among them) saying it is revision `number`."""
    record = replace(instance.record, revision=number)
    files = tuple(RenderedFile(f.name, json.dumps(record.to_json(), indent=2) + "\n", f.mode)
                  if f.name == RECORD_FILE else f for f in instance.files)
    return replace(instance, files=files, record=record)


def switched_parts(instances: Sequence[InstanceFiles]) -> list[InstanceFiles]:
    """The parts a rollout switches one by one: every engine (a single one, or each replica behind the router);
    the router stays, since its command line does not change with the model."""
    return [i for i in instances if not i.record.is_router and i.record.runs_engine]


def next_revision(state_dir: Path, name: str) -> int:
    history = read_history(state_dir, name)
    return max((r.number for r in history), default=0) + 1


def keep_revision(state_dir: Path, name: str, number: int, origin: LaunchOrigin,
                  instances: Sequence[InstanceFiles], *, outcome: str = OUTCOME_SERVING) -> Revision:
    """Store revision `number`'s files and add it to the history (the revision serving until now, if any, is
    superseded once this one serves: `finish_revision`)."""
    parts = switched_parts(instances)
    store_revision(state_dir, name, number, origin.to_json(),
                   {p.name: [StoredFile(f.name, f.text, f.mode) for f in p.files] for p in parts})
    first = parts[0].record if parts else instances[0].record
    revision = Revision(number=number, at=time.time(), command=origin.command, changes=origin.changes,
                        model_path=first.model_path, served_model_name=first.served_model_name,
                        parts=tuple(p.name for p in parts), outcome=outcome)
    add_to_history(state_dir, name, revision)
    return revision


def add_to_history(state_dir: Path, name: str, revision: Revision) -> None:
    """Append `revision` (replacing an entry of its number); when it serves, the one serving until now is
    superseded."""
    history = [r for r in read_history(state_dir, name) if r.number != revision.number]
    if revision.outcome == OUTCOME_SERVING:
        history = [replace(r, outcome=OUTCOME_SUPERSEDED) if r.outcome == OUTCOME_SERVING else r for r in history]
    write_history(state_dir, name, [*history, revision])


def finish_revision(state_dir: Path, name: str, number: int, outcome: str, reason: str = "") -> None:
    """Revision `number`'s outcome once its rollout ended; when it serves, the one before is superseded."""
    history = read_history(state_dir, name)
    out = []
    for r in history:
        if r.number == number:
            out.append(replace(r, outcome=outcome, reason=reason))
        elif outcome == OUTCOME_SERVING and r.outcome == OUTCOME_SERVING:
            out.append(replace(r, outcome=OUTCOME_SUPERSEDED))
        else:
            out.append(r)
    write_history(state_dir, name, out)


def stored_instance(part: str, files: Sequence[StoredFile], where: str, fix: str) -> InstanceFiles:
    """A stored or staged engine part's files as the part installs them, checked first: its record is that
    part's (its name, its unit `npuops-PART.service`), and it holds an engine's files and no other."""
    text = next((f.text for f in files if f.name == RECORD_FILE), None)
    if text is None:
        raise ConfigError(f"{where} has no {RECORD_FILE}", fix)
    try:
        data = loads_checked(text)
    except ValueError as exc:
        raise ConfigError(f"{where}/{RECORD_FILE} is not JSON ({exc})", fix) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}/{RECORD_FILE} is not an npuops instance record", fix)
    try:
        record = InstanceRecord.from_json(data, f"{where}/{RECORD_FILE}")
    except NpuopsError as exc:
        raise ConfigError(exc.problem, fix) from None
    unit = f"npuops-{part}{UNIT_SUFFIX}"
    if record.name != part or record.unit != unit:
        raise ConfigError(f"{where}/{RECORD_FILE} is the record of {record.name!r} ({record.unit}), not of {part}",
                          fix)
    names = {f.name for f in files}
    unknown = sorted(names - {CONFIG_FILE, ENV_FILE, RECORD_FILE, unit})
    missing = sorted({CONFIG_FILE, ENV_FILE, unit} - names)
    if unknown or missing:
        what = f"holds {', '.join(unknown)}" if unknown else f"lacks {', '.join(missing)}"
        raise ConfigError(f"{where} {what}: an engine's files are {CONFIG_FILE}, {ENV_FILE}, {RECORD_FILE} and "
                          f"{unit}", fix)
    rendered = tuple(RenderedFile(f.name, f.text, f.mode) for f in files)
    return InstanceFiles(part, rendered, record.unit, record)


def stored_as_files(stored: Mapping[str, Sequence[StoredFile]], number: int, where: Path, fix: str,
                     running: Sequence[InstanceRecord]) -> dict[str, InstanceFiles]:
    """A stored revision's or a group rollout's staged files as the parts install them, each checked to be the
    running part's own: the same name, unit, directories and router. A record that named another instance's
    would have root write, start and hold that one."""
    out = {part: with_revision(stored_instance(part, files, str(where / part), fix), number)
           for part, files in stored.items()}
    for part in running:
        new = out[part.name].record if part.name in out else None
        for key in ("unit", "instance_dir", "status_file", "behind"):
            if new is not None and getattr(new, key) != getattr(part, key):
                raise ConfigError(f"{where / part.name}: its record has {key} {getattr(new, key)!r}, the running "
                                  f"{part.name} {getattr(part, key)!r}", fix)
    return out


FILES_KEPT = "kept"
FILES_PRUNED = "pruned"
FILES_UNREADABLE = "unreadable"


def revision_files(state_dir: Path, name: str, number: int) -> tuple[str, str]:
    """Whether revision `number`'s files are there for `rollout --undo`: FILES_KEPT, FILES_PRUNED, or
    FILES_UNREADABLE with what does not read (each checked as --undo checks it)."""
    directory = revision_dir(state_dir, name, number)
    try:
        kept = kept_launch(state_dir, name, number)
        stored = stored_parts(state_dir, name, number)
        for part, files in stored.items():
            stored_instance(part, files, str(directory / part), "")
    except ConfigError as exc:
        return FILES_UNREADABLE, exc.problem
    if kept is None:
        return (FILES_UNREADABLE, f"{directory / LAUNCH_FILE} is missing") if stored else (FILES_PRUNED, "")
    return FILES_KEPT, ""


@dataclass(frozen=True)
class KeptLaunch:
    """What a revision was made from, as its launch.json keeps it, read back and checked."""

    request: PlanRequest | None  # None: a host's part of a group's instance (the controller keeps the request)
    choices: LaunchChoices | None  # None: as for the request

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request.to_json() if self.request else {},
                "choices": self.choices.to_json() if self.choices else {}}


def kept_launch(state_dir: Path, name: str, number: int) -> KeptLaunch | None:
    """Revision `number`'s request and choices (None: its files were pruned or never kept). Every value must be of
    the type npuops writes, or planning would fail far from here: a ConfigError names the file and the value."""
    raw = stored_launch(state_dir, name, number)
    if raw is None:
        return None
    directory = revision_dir(state_dir, name, number)
    try:
        request = _plan_request(raw["request"]) if raw["request"] else None
        choices = _choices(raw["choices"]) if raw["choices"] else None
    except NpuopsError as exc:
        problem = exc.problem
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        problem = str(exc)
    else:
        if (request is None) == (choices is None):
            return KeptLaunch(request, choices)
        problem = "it keeps a request without its launch choices" if choices is None else "choices without a request"
    raise ConfigError(f"{directory / LAUNCH_FILE} is not a request npuops can plan again ({problem})",
                      f"move {directory} away (`npuops rollout {name} --undo` then returns to the revision before "
                      f"it), or launch {name} again with the configuration you want")


def _plan_request(data: Mapping[str, Any]) -> PlanRequest:
    if not isinstance(data.get("model"), str) or not data["model"].strip():
        raise TypeError("request.model is not a model directory")
    _check_types(PlanRequest, {k: v for k, v in data.items() if k not in ("model", "workload", "fixed")},
                 "request", none_is_default=True)
    workload, fixed = data.get("workload") or {}, data.get("fixed") or {}
    if not isinstance(workload, dict) or not isinstance(fixed, dict):
        raise TypeError("request.workload and request.fixed must be objects")
    _check_types(Workload, workload, "request.workload", known_only=True)
    _check_types(ServerOptions, {_SHORT_NAMES.get(str(k), str(k)): v for k, v in fixed.items()}, "request.fixed",
                 known_only=True)
    return PlanRequest.from_json(data)


def _choices(data: Mapping[str, Any]) -> LaunchChoices:
    _check_types(LaunchChoices, data, "choices", none_is_default=True)
    env = data.get("extra_env") or {}
    if not all(isinstance(value, str) for value in env.values()):
        raise TypeError("choices.extra_env holds a value that is not a string")
    return LaunchChoices.from_json(data)


_SHORT_NAMES = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size"}


def _check_types(cls: type[Any], data: Mapping[str, Any], where: str, *, none_is_default: bool = False,
                 known_only: bool = False) -> None:
    """Each value of `data` of its field's declared type in `cls` (raises TypeError naming it). Keys `cls` does not
    have: ignored (a newer npuops' keys), or refused with `known_only` (they would reach a constructor)."""
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        hint = hints.get(key)
        if hint is None:
            if known_only:
                raise TypeError(f"{where}.{key} is no option npuops knows")
            continue
        if value is None and none_is_default:
            continue
        if not _admits(hint, value):
            raise TypeError(f"{where}.{key} is {type(value).__name__} {value!r:.40}, not {hint}")


def _admits(hint: Any, value: Any) -> bool:
    """Whether a JSON value holds a field of type `hint` (int, float, str, bool, Path, a mapping, optional)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None:
            return type(None) in args
        return any(_admits(a, value) for a in args if a is not type(None))
    if value is None:
        return False
    base = typing.get_origin(hint) or hint
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base in (str, Path):
        return isinstance(value, str)
    if base in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    return True  # a type a launch.json does not hold on its own (the workload, checked by itself)


def group_store(artifacts_dir: Path, group: str) -> Path:
    """Where the controller keeps a group instance's revisions (the `state_dir` of npuops.instance.revisions)."""
    try:
        validate_instance_name(group.lower().replace("_", "-"))
    except BadInputError:
        raise BadInputError(f"group name {group!r} is not usable for the revision store",
                            "name the inventory group with letters, digits, dashes and underscores") from None
    return artifacts_dir / "revisions" / group


def keep_group_revision(store: Path, name: str, number: int, origin: LaunchOrigin, model_path: str,
                        served_name: str, hosts: Sequence[str], outcome: str = OUTCOME_SERVING) -> None:
    """A group launch's or rollout's revision on the controller: its request and choices, the hosts it spans."""
    store_revision(store, name, number, origin.to_json(), {})
    add_to_history(store, name, Revision(number, time.time(), origin.command, origin.changes, model_path,
                                         served_name, tuple(hosts), outcome))
