"""A launch's or a rollout's files as a revision of the instance (npuops.instance.revisions keeps them)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from npuops.errors import BadInputError, ConfigError
from npuops.instance.record import RECORD_FILE, InstanceRecord, validate_instance_name
from npuops.instance.revisions import (
    OUTCOME_SERVING,
    OUTCOME_SUPERSEDED,
    LaunchOrigin,
    Revision,
    StoredFile,
    read_history,
    store_revision,
    write_history,
)
from npuops.launch.instance_files import InstanceFiles, RenderedFile


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


def record_of(files: Sequence[StoredFile], where: str) -> InstanceRecord:
    """The record among a stored part's files."""
    text = next((f.text for f in files if f.name == RECORD_FILE), None)
    if text is None:
        raise ConfigError(f"{where} has no {RECORD_FILE}", "roll out a new revision instead")
    return InstanceRecord.from_json(json.loads(text), where)


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
    store.mkdir(parents=True, exist_ok=True)
    (store / name).mkdir(exist_ok=True)
    store_revision(store, name, number, origin.to_json(), {})
    add_to_history(store, name, Revision(number, time.time(), origin.command, origin.changes, model_path,
                                         served_name, tuple(hosts), outcome))
