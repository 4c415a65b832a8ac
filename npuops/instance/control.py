"""Acting on an instance's processes: is a port held, is a process alive, stop an instance (unit or foreground)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from npuops.errors import BadInputError, ConfigError, ServiceManagerError, UsageError
from npuops.httpclient import client_host
from npuops.instance.lock import instance_lock
from npuops.instance.manager import SystemdManager
from npuops.instance.record import (
    MANAGER_SYSTEMD,
    STATUS_FILE,
    InstanceRecord,
    UnreadableRecord,
    is_instance_name,
    load_record,
    read_status,
    remove_entries,
    remove_instance_dir,
    scan_records,
    service_status_dir,
)
from npuops.settings import Settings

_STOPPED_STATES = ("inactive", "failed")


def port_taken(host: str, port: int) -> bool:
    """Whether something else holds host:port right now (a bind test, as the engine itself will do)."""
    family = socket.AF_INET6 if ":" in client_host(host) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host if host not in ("", "*") else "0.0.0.0", port))  # noqa: S104 - a bind test only
        except OSError as exc:
            return exc.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_foreground(record: InstanceRecord, timeout_s: float) -> bool:
    """SIGTERM to a foreground supervisor (from its status file); True once it is gone."""
    status = read_status(record)
    pid = status.supervisor_pid if status is not None else None
    if status is None or pid is None or status.exit is not None or not pid_alive(pid):
        return True
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = read_status(record)
        if not pid_alive(pid) or (now is not None and now.exit is not None):
            return True
        time.sleep(0.2)
    return not pid_alive(pid)


def parts_of(record: InstanceRecord, data_root: Path | None = None) -> list[InstanceRecord]:
    """A router's replicas on this host, by their records (a replica whose record is gone or unreadable is left
    out: find_instance finds its unit in the unit directory)."""
    out = []
    for name in record.replicas:
        try:
            out.append(load_record(record.directory.parent, name, data_root))
        except (BadInputError, ConfigError):
            continue
    return out


def stop_instance(record: InstanceRecord, manager: SystemdManager) -> bool:
    """Stop every part of the instance on this host, the engine before its Ray node, a router before the replicas
    behind it (the start order reversed); True once nothing of it runs. A foreground run is stopped through its
    supervisor."""
    if record.replicas:
        # The endpoint first: no request is sent to a replica that is stopping.
        stopped = _stop_units(record, manager)
        return all([stopped, *(stop_instance(part, manager) for part in parts_of(record))])
    return _stop_units(record, manager)


def _stop_units(record: InstanceRecord, manager: SystemdManager) -> bool:
    if record.manager != MANAGER_SYSTEMD:
        return stop_foreground(record, record.stop_timeout_s + 10)
    reason = manager.unavailable_reason()
    if reason:
        raise UsageError(f"cannot stop {record.unit}: {reason}", "stop it where it runs")
    for unit in reversed(record.units):
        manager.stop(unit, timeout=record.stop_timeout_s + 30)
    return all(manager.state(unit).active_state in _STOPPED_STATES for unit in record.units)


def recent_logs(record: InstanceRecord, manager: SystemdManager, lines: int) -> dict[str, list[str]]:
    """The last `lines` lines of each of the instance's logs on this host: its units' journal (engine first among
    them, Ray node before), or a foreground run's engine.log."""
    if record.manager == MANAGER_SYSTEMD:
        return {unit: manager.recent_log(unit, lines) for unit in record.units}
    try:
        text = record.engine_log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        text = []
    return {str(record.engine_log): text}


def select_part(record: InstanceRecord, part: str | None) -> list[InstanceRecord]:
    """The records `logs --part` reads: a router's own ("router"), one replica's ("r0", "r1", ...), or, without
    --part, the instance itself and (for a router) every replica behind it."""
    parts = parts_of(record)
    if part is None:
        return [record, *parts] if record.units else parts
    if not record.replicas:
        raise BadInputError(f"{record.name} has no parts: it is one engine, not a router in front of replicas",
                            "drop --part")
    if part == "router" and record.is_router:
        return [record]
    for replica in parts:
        if replica.name == f"{record.name}-{part}":
            return [replica]
    names = ", ".join([*(["router"] if record.is_router else []), *(p.name.removeprefix(record.name + "-")
                                                                     for p in parts)])
    raise BadInputError(f"{record.name} has no part {part!r}", f"use --part with one of {names}")


# The units an instance NAME can have on a host: its engine or router, the replicas and PD engines behind a
# router (NAME-r0, NAME-p0, NAME-d0, ...), a rollout's surge replica (NAME-surge: stopped with NAME if a killed
# rollout left it) and a Ray node.
_UNIT_OF = r"npuops-{name}(-router|-ray|-surge|-[rpd]\d+)?\.service"


@dataclass(frozen=True)
class StopOutcome:
    stopped: bool
    # Units of the instance found only in the unit directory (their record is unreadable or gone): stopped too.
    orphans: tuple[str, ...] = ()
    # What ran when the stop began (units, and foreground runs by name): empty when there was nothing to stop.
    was_running: tuple[str, ...] = ()
    # The instance's records that could not be used (itself or a part), with the problem and the fix.
    unreadable: tuple[UnreadableRecord, ...] = ()


def units_on_disk(name: str, unit_dir: Path, owned_elsewhere: set[str]) -> list[str]:
    """The unit files in `unit_dir` that belong to instance `name` by their name, less the units another
    instance's readable record owns (an instance may itself be called NAME-r0)."""
    pattern = re.compile(_UNIT_OF.format(name=re.escape(name)))
    try:
        names = sorted(entry.name for entry in os.scandir(unit_dir))
    except OSError:
        return []
    return [unit for unit in names if pattern.fullmatch(unit) and unit not in owned_elsewhere]


@dataclass(frozen=True)
class InstanceOnNode:
    """Everything of instance NAME on this node: its readable records (itself, then the parts behind it), its
    units, from those records and from the unit directory (a part whose record is damaged still has one), and the
    records of it that cannot be used."""

    name: str
    record: InstanceRecord | None
    parts: tuple[InstanceRecord, ...]
    units: tuple[str, ...]
    orphans: tuple[str, ...]  # of `units`, those no readable record accounts for
    unreadable: tuple[UnreadableRecord, ...] = ()

    @property
    def records(self) -> list[InstanceRecord]:
        return [*([self.record] if self.record else []), *self.parts]

    @property
    def names(self) -> list[str]:
        """The instance and every part of it on this node, by name: its records', its router's list and its
        units' (a part whose record is unreadable)."""
        listed = self.record.replicas if self.record is not None else ()
        names = [self.name, *listed, *(r.name for r in self.parts), *(u.name for u in self.unreadable),
                 *map(_instance_of_unit, self.units)]
        # A unit file named like a part of a 48-character name is no launch's: it has no files of its own.
        return [n for n in dict.fromkeys(names) if is_instance_name(n)]


def find_instance(state_dir: Path, name: str, manager: SystemdManager,
                  data_root: Path | None = None) -> InstanceOnNode:
    """NAME's records and units; an instance that has neither (nor a record that cannot be read) is bad input,
    named as load_record names it."""
    records, unreadable = scan_records(state_dir, data_root)
    record = next((r for r in records if r.name == name), None)
    parts = tuple(parts_of(record, data_root)) if record is not None else ()
    mine = {name, *(p.name for p in parts), *(record.replicas if record else ())}
    owned_elsewhere = {unit for r in records if r.name not in mine and r.behind != name for unit in r.units}
    on_disk = units_on_disk(name, manager.unit_dir, owned_elsewhere)
    damaged = tuple(u for u in unreadable if u.name in mine or f"npuops-{u.name}.service" in on_disk)
    if record is None and not on_disk and not any(u.name == name for u in damaged):
        load_record(state_dir, name, data_root)  # raises: no such instance
    accounted = [u for r in [*([record] if record else []), *parts] if r.manager == MANAGER_SYSTEMD for u in r.units]
    orphans = tuple(u for u in on_disk if u not in accounted)
    return InstanceOnNode(name, record, parts, (*accounted, *orphans), orphans, damaged)


@contextlib.contextmanager
def _locked(state_dir: Path, instance: InstanceOnNode, command: str | None) -> Iterator[None]:
    """The instance's lock (and its router's, for a part behind one) as `command`; none when the caller holds it
    (a rollout removing its surge replica)."""
    if command is None:
        yield
        return
    behind = instance.record.behind if instance.record is not None else None
    with instance_lock(state_dir, [instance.name, *([behind] if behind else [])], command):
        yield


def running_parts(instance: InstanceOnNode, manager: SystemdManager) -> tuple[str, ...]:
    """What of the instance runs now: its active (or activating, restarting, stopping) units and, by name, its
    foreground runs whose supervisor is alive."""
    running: list[str] = []
    for record in instance.records:
        if record.manager != MANAGER_SYSTEMD:
            status = read_status(record)
            if status is not None and status.exit is None and pid_alive(status.supervisor_pid):
                running.append(f"{record.name} (foreground)")
    if instance.units and manager.unavailable_reason() is None:
        running += [u for u in instance.units if manager.state(u).active_state not in _STOPPED_STATES]
    return tuple(running)


def stop_by_name(state_dir: Path, name: str, manager: SystemdManager, *, data_root: Path | None = None,
                 lock_as: str | None = None) -> StopOutcome:
    """`npuops stop NAME`: every part its records name, then every unit of NAME in the unit directory that no
    readable record accounted for (a replica whose record is damaged still holds its chips). `lock_as`: the
    command to hold the instance's lock as; None when the caller holds it."""
    found = find_instance(state_dir, name, manager, data_root)
    with _locked(state_dir, found, lock_as):
        instance = find_instance(state_dir, name, manager, data_root) if lock_as else found
        return _stop(instance, manager, running_parts(instance, manager))


def _stop(instance: InstanceOnNode, manager: SystemdManager, was_running: tuple[str, ...]) -> StopOutcome:
    stopped = stop_instance(instance.record, manager) if instance.record is not None else True
    if instance.orphans:
        reason = manager.unavailable_reason()
        if reason:
            raise UsageError(f"cannot stop {', '.join(instance.orphans)}: {reason}", "stop them where they run")
        for unit in instance.orphans:
            manager.stop(unit)
        stopped = stopped and all(manager.state(u).active_state in _STOPPED_STATES for u in instance.orphans)
    return StopOutcome(stopped, instance.orphans, was_running, instance.unreadable)


@dataclass(frozen=True)
class RemoveOutcome:
    units: tuple[str, ...]  # disabled, deleted from the unit directory
    instances: tuple[str, ...]  # whose record, config, env file (key) and router.json were deleted
    kept: tuple[str, ...]  # directories left for the operator: bench results, engine logs


def _instance_of_unit(unit: str) -> str:
    """npuops-m-r1.service → m-r1; a router's and a Ray node's unit belong to the instance itself."""
    return re.sub(r"(-router|-ray)?\.service\Z", "", unit.removeprefix("npuops-"))


def remove_by_name(state_dir: Path, name: str, manager: SystemdManager, *, force: bool = False,
                   data_root: Path | None = None, lock_as: str | None = None) -> RemoveOutcome:
    """`npuops remove NAME`: disable and delete every unit of it (found from the records and from the unit
    directory) and the files launch wrote for it and its parts, so nothing of it starts at the next boot. A
    running instance is refused unless `force`, which stops it first as `stop` does; an instance that does not
    stop is left installed (ServiceManagerError). Every path deleted is derived from the names (the unit
    directory's, the state dir's, `data_root`'s, the settings' default when None), never taken from a record.
    `lock_as`: the command to hold the instance's lock as; None when the caller holds it."""
    found = find_instance(state_dir, name, manager, data_root)
    with _locked(state_dir, found, lock_as):
        instance = find_instance(state_dir, name, manager, data_root) if lock_as else found
        return _remove(state_dir, instance, manager, force=force,
                       data_root=data_root if data_root is not None else Settings().service_data_root)


def _remove(state_dir: Path, instance: InstanceOnNode, manager: SystemdManager, *, force: bool,
            data_root: Path) -> RemoveOutcome:
    name = instance.name
    running = running_parts(instance, manager)
    if running and not force:
        raise BadInputError(f"{name} is running ({', '.join(running)})",
                            f"stop it first (`npuops stop {name}`), or `npuops remove {name} --force`")
    stopped = _stop(instance, manager, running) if running else None
    if stopped is not None and not stopped.stopped:
        raise ServiceManagerError(f"{name} did not stop, so it stays installed",
                                  f"see `npuops status {name}` and `npuops logs {name}`, then remove it again")
    on_disk = [u for u in instance.units if manager.unit_path(u).exists()]
    if on_disk:
        reason = manager.unavailable_reason()
        if reason:
            raise UsageError(f"cannot remove {', '.join(on_disk)}: {reason}", "remove it where it runs")
        for unit in on_disk:
            manager.disable(unit)
            manager.remove_unit(unit)
    removed, kept = [], []
    for each in instance.names:
        # The supervisor's state of a run that no unit will resume, where launch puts it for either manager.
        for status_dir in (state_dir / each, service_status_dir(data_root, each)):
            remove_entries(status_dir, (STATUS_FILE,))
        directory = state_dir / each
        if _is_directory(directory):
            remove_instance_dir(state_dir, each)
            removed.append(each)
        kept += [str(d) for d in (directory, service_status_dir(data_root, each)) if os.path.lexists(d)]
    return RemoveOutcome(tuple(on_disk), tuple(removed), tuple(dict.fromkeys(kept)))


def _is_directory(path: Path) -> bool:
    """A directory itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
