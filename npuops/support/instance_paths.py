"""Where an instance's files and units are, derived by npuops itself from the state dir, the instance's name and the
settings, as launch placed them (npuops/launch/instance_files.py `_status_dir`), never taken from its record.

collect and profile run as root: a record's `instance_dir`, `status_file` or `unit` could name any file, and the
status directory is the engine's service user's to write. So each path here is a ConfinedPath below a directory
root owns (the state dir, the service data root), opened without following links below it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from npuops.instance.record import (
    ENGINE_LOG_FILE,
    MANAGER_FOREGROUND,
    PROFILES_DIR,
    ROLE_RAY_WORKER,
    ROLE_REPLICAS,
    ROLE_ROUTER,
    SERVICE_DIR_PREFIX,
    STATUS_FILE,
    UNIT_SUFFIX,
    InstanceRecord,
    unit_names,
    validate_instance_name,
)
from npuops.safefiles import ConfinedPath
from npuops.settings import Settings


@dataclass(frozen=True)
class InstancePaths:
    name: str
    instance_dir: ConfinedPath  # <state_dir>/<name>: its record, config, env file and revisions
    status_dir: ConfinedPath  # the supervisor's: the unit's StateDirectory, or the instance dir in a terminal
    units: tuple[str, ...]  # this host's units of the instance, in start order

    @property
    def status_file(self) -> ConfinedPath:
        return self.status_dir / STATUS_FILE

    @property
    def engine_log(self) -> ConfinedPath:
        return self.status_dir / ENGINE_LOG_FILE

    @property
    def profiles(self) -> ConfinedPath:
        return self.status_dir / PROFILES_DIR


def _units(name: str, record: InstanceRecord | None) -> tuple[str, ...]:
    """The units launch names for this host's part (npuops-NAME.service, -router, -ray), by the record's role; a
    record that cannot be read is taken for a single engine."""
    engine, router, ray = unit_names(name)
    if record is None:
        return (engine,)
    if record.role == ROLE_ROUTER:
        return (router,)
    if record.role == ROLE_RAY_WORKER:
        return (ray,)
    if record.role == ROLE_REPLICAS:
        return ()
    return (ray, engine) if record.ray_unit else (engine,)


def instance_paths(settings: Settings, name: str, record: InstanceRecord | None) -> InstancePaths:
    """The paths of instance `name` (a validated name: nothing in it climbs); `record` only says which kind of part
    it is (its manager and role), none of its paths is used."""
    validate_instance_name(name)
    instance_dir = ConfinedPath(settings.state_dir, PurePosixPath(name))
    if record is not None and record.manager == MANAGER_FOREGROUND:
        status_dir = instance_dir
    else:
        status_dir = ConfinedPath(settings.service_data_root, PurePosixPath(f"{SERVICE_DIR_PREFIX}{name}"))
    return InstancePaths(name, instance_dir, status_dir, _units(name, record))


def confined_record(record: InstanceRecord, paths: InstancePaths) -> InstanceRecord:
    """The record with the paths and units npuops derives in place of its own, for what reads through it (status)."""
    cluster = record.cluster
    ray = next((u for u in paths.units if u.endswith(f"-ray{UNIT_SUFFIX}")), None)
    if cluster is not None and cluster.ray_unit:
        cluster = replace(cluster, ray_unit=ray)
    main = paths.units[-1] if paths.units else unit_names(paths.name)[0]
    return replace(record, name=paths.name, instance_dir=str(paths.instance_dir),
                   status_file=str(paths.status_file), unit=main, cluster=cluster)
