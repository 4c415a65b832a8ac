"""The instances of a node as collect sees them: every directory of the state dir named like an instance, its record
if it can be read (a broken one is evidence too), the paths npuops derives for it, and the secrets its files hold.

A record is root's, but what it says is not trusted for paths (npuops/support/instance_paths.py); the name is the
directory's, validated, whatever the record calls itself.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

from npuops.errors import NpuopsError
from npuops.instance.record import RECORD_FILE, InstanceRecord, load_record, validate_instance_name
from npuops.safefiles import NotRead, printable, read_tail, walk_regular_files
from npuops.settings import Settings
from npuops.support.instance_paths import InstancePaths, instance_paths
from npuops.support.redact import secrets_in_env_text, secrets_in_json

# The files an instance dir holds secrets in: its env files (env, ray.env; a kept revision's <part>/env) and its
# JSON (the record, a revision's launch.json with the --env values it was given). Each is read as the bundle reads
# it: its last FILE_CAP bytes, so whatever of it enters the bundle has taught the redactor first.
SECRETS_READ_CAP = 8 * 2**20


@dataclass(frozen=True)
class NodeInstance:
    name: str  # its directory's name
    record: InstanceRecord | None  # None: unreadable (`problem` says why)
    paths: InstancePaths
    problem: str = ""


def node_instances(settings: Settings) -> list[NodeInstance]:
    """Every instance directory under the state dir, by name."""
    found: list[NodeInstance] = []
    try:
        entries = sorted(os.scandir(settings.state_dir), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        try:
            name = validate_instance_name(entry.name)
        except NpuopsError:
            continue
        if not entry.is_dir(follow_symlinks=False) or not os.path.lexists(os.path.join(entry.path, RECORD_FILE)):
            continue
        try:
            record: InstanceRecord | None = load_record(settings.state_dir, name)
            problem = ""
        except NpuopsError as exc:
            record, problem = None, f"its record is unusable: {exc.one_line()}"
        if record is not None and record.name != name:
            problem = f"its record calls it {printable(record.name)!r}: taken as {name}, its directory's name"
        found.append(NodeInstance(name, record, instance_paths(settings, name, record), problem))
    return found


def learn_secrets(instances: Sequence[NodeInstance]) -> list[str]:
    """Every secret the instances' own files hold: their env files' and their JSON's (records, kept revisions)."""
    learned: list[str] = []
    for instance in instances:
        top = instance.paths.instance_dir
        try:
            walk = walk_regular_files(top)
        except NotRead:
            continue
        for found in walk.files:
            name = found.relative.name
            if name != "env" and not name.endswith((".env", ".json")):
                continue
            try:
                data = read_tail(top / found.relative, cap=SECRETS_READ_CAP).data
            except NotRead:
                continue
            text = data.decode("utf-8", "surrogateescape")
            if name.endswith(".json"):
                with contextlib.suppress(ValueError, RecursionError):
                    learned += secrets_in_json(json.loads(text))
            else:
                learned += secrets_in_env_text(text)
    return learned
