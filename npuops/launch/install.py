"""Putting instances in place: refuse what would collide, write the files, hand the unit to the service manager,
and follow a start to "healthy" (or to the diagnosis of why not)."""

from __future__ import annotations

import grp
import os
import pwd
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from npuops.atomic import write_files_as_one_set
from npuops.errors import BadInputError, EnvironmentMissingError
from npuops.httpclient import base_url
from npuops.instance.access import ServiceIdentity, model_problems, service_problems
from npuops.instance.control import port_taken
from npuops.instance.endpoint import health_ok
from npuops.instance.manager import SystemdManager
from npuops.instance.record import InstanceRecord, read_status, remove_instance_dir, validate_instance_name
from npuops.instance.state import Stage, SupervisorState
from npuops.launch.instance_files import InstanceFiles, write_instance_files

_WILDCARDS = ("0.0.0.0", "::", "", "*")  # noqa: S104 - comparing bind addresses, not binding


def _hosts_overlap(a: str, b: str) -> bool:
    return a == b or a in _WILDCARDS or b in _WILDCARDS


def find_conflicts(new: Sequence[InstanceRecord], existing: Sequence[InstanceRecord]) -> None:
    """Refuse a launch whose port or NPU devices another instance on this node already has (same name = replace)."""
    replacing = {r.name for r in new}
    others = [r for r in existing if r.name not in replacing]
    for record in new:
        for other in others:
            if other.port == record.port and _hosts_overlap(other.host, record.host):
                raise BadInputError(f"port {record.port} is already used by instance {other.name!r}",
                                    f"launch with another --port, or stop and remove {other.name!r} first")
            shared = sorted(set(other.devices) & set(record.devices))
            if shared:
                raise BadInputError(
                    f"NPU device(s) {','.join(map(str, shared))} are already used by instance {other.name!r}",
                    f"launch on other chips (--devices), or stop {other.name!r} first (`npuops stop {other.name}`)")


def check_ports_free(records: Sequence[InstanceRecord]) -> None:
    for record in records:
        ports = [(record.host, record.port)]
        if record.metrics_port is not None:
            ports.append(("127.0.0.1", record.metrics_port))  # a router's Prometheus metrics
        for host, port in ports:
            if port_taken(host, port):
                raise BadInputError(f"port {port} on {host} is taken by another process",
                                    f"stop it (`ss -ltnp 'sport = :{port}'` shows which), or choose another --port")


def check_service_user(user: str) -> None:
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise EnvironmentMissingError(
            f"the service user {user!r} does not exist on this node",
            f"create it: `useradd --system --no-create-home --shell /usr/sbin/nologin --groups HwHiAiUser {user}` "
            "(`npuops provision` does this), or launch with --service-user USER") from None


def check_groups_exist(record: InstanceRecord, groups: Sequence[str]) -> None:
    """The unit's SupplementaryGroups= must exist, or systemd fails every start with 216/GROUP."""
    for name in groups:
        try:
            grp.getgrnam(name)
        except KeyError:
            raise EnvironmentMissingError(
                f"{record.unit} needs the group {name} (SupplementaryGroups=, access to the NPU device nodes), "
                "which does not exist on this node",
                "install the Ascend driver (its installer creates HwHiAiUser; `npuops provision --tags driver`), "
                f"or create it: `groupadd --system {name}`") from None


def check_service_access(records: Sequence[InstanceRecord], user: str, supervisor: str | None, *,
                         real_systemd: bool = True) -> None:
    """Refuse a launch whose unit could not run: a missing group, an executable, interpreter or model file the
    service user cannot reach under the unit's sandbox (names the first such path and the fix;
    npuops.instance.access). `real_systemd`: False under docker-systemctl-replacement, which applies neither the
    sandbox nor SupplementaryGroups=."""
    for record in records:
        groups = record.supplementary_groups
        if real_systemd:
            check_groups_exist(record, groups)
        identity = ServiceIdentity.of(user, groups, sandboxed=real_systemd)
        if identity is None:
            check_service_user(user)
            return
        problems = service_problems(identity, vllm=Path(record.vllm_command[0]), model=Path(record.model_path),
                                    supervisor=Path(supervisor) if supervisor else None)
        if record.draft_model_path:
            problems += model_problems(Path(record.draft_model_path), identity)
        if problems:
            first = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise BadInputError(f"{record.unit} would run as {user}, who cannot use {first.problem()}{more}",
                                first.fix)


STATE_DIR_FIX = "make the state directory (setting state_dir) writable, or point it elsewhere"
UNIT_DIR_FIX = "make the unit directory (setting unit_dir) writable"


def check_writable(state_dir: Path, names: Sequence[str], unit_dir: Path | None = None) -> None:
    """Refuse a launch or a rollout whose files could not be written (a read-only or not-a-directory state or unit
    dir) before it stops or writes anything: otherwise the running instance would be stopped for files that never
    land. The writes themselves still name any later failure (a full disk) and leave the old set whole."""
    places = [(state_dir / validate_instance_name(n), STATE_DIR_FIX) for n in names] or [(state_dir, STATE_DIR_FIX)]
    if unit_dir is not None:
        places.append((unit_dir, UNIT_DIR_FIX))
    for directory, fix in places:
        problem = _unwritable(directory)
        if problem:
            raise BadInputError(f"cannot write {directory}: {problem}", fix)


def _unwritable(directory: Path) -> str | None:
    """Why files cannot be created in `directory` (or in it once created), or None. Root passes permission
    bits, but not a read-only file system."""
    existing = directory
    while not existing.exists() and existing != existing.parent:  # created with its parents by the write
        if existing.is_symlink():
            return f"{existing} is a dangling symbolic link"
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return "read-only file system" + (f" (at {existing})" if existing != directory else "")
    if not os.access(existing, os.W_OK | os.X_OK):
        return "permission denied" + (f" (at {existing})" if existing != directory else "")
    return None


def write_instance(instance: InstanceFiles, state_dir: Path, unit_dir_file: str | None = None) -> list[Path]:
    """The instance's own files into <state_dir>/<name>/ (the unit goes through the service manager)."""
    directory = state_dir / instance.name
    kept = InstanceFiles(instance.name, tuple(f for f in instance.files if f.name != unit_dir_file),
                         instance.unit_name, instance.record)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return write_instance_files(directory, kept)
    except PermissionError:
        raise BadInputError(f"cannot write {directory}: permission denied",
                            "run `npuops launch` as root (it installs a system service)") from None
    except OSError as exc:  # read-only, full, not a directory: named, never a traceback
        raise BadInputError(f"cannot write {exc.filename or directory}: {exc.strerror}", STATE_DIR_FIX) from None


UNIT_MODE = 0o644


def install(instances: Sequence[InstanceFiles], state_dir: Path, manager: SystemdManager) -> dict[str, list[Path]]:
    """Every instance of one launch (an engine, or a router with its replicas or its prefill/decode engines) as one
    set of files: each instance's state files and its unit are written to temporaries, then all renamed, then one
    daemon-reload. A file that cannot be written leaves the old set whole and no directory of a new instance behind
    (`list` would show an instance without a unit, `stop` a router without its replicas)."""
    fresh = [i.name for i in instances if not (state_dir / i.name).exists()]
    files: list[tuple[Path, str, int]] = []
    owners: list[str] = []  # the instance of each file
    for instance in instances:
        own = [(state_dir / instance.name / f.name, f.text, f.mode)
               for f in instance.files if f.name != instance.unit_name]
        own.append((manager.unit_path(instance.unit_name), instance.file(instance.unit_name).text, UNIT_MODE))
        files += own
        owners += [instance.name] * len(own)
    try:
        paths = write_files_as_one_set(files)
    except OSError as exc:
        for name in fresh:
            remove_instance_dir(state_dir, name)
        where = Path(exc.filename) if exc.filename else state_dir
        problem = "permission denied" if isinstance(exc, PermissionError) else exc.strerror
        if not isinstance(exc, PermissionError) and where.is_relative_to(manager.unit_dir):
            fix = UNIT_DIR_FIX
        elif not isinstance(exc, PermissionError):
            fix = STATE_DIR_FIX
        else:
            fix = "run `npuops launch` as root (it installs a system service)"
        raise BadInputError(f"cannot write {where}: {problem}", fix) from None
    manager.reload()
    for instance in instances:
        manager.enable(instance.unit_name)
    written: dict[str, list[Path]] = {i.name: [] for i in instances}
    for owner, path in zip(owners, paths, strict=True):
        written[owner].append(path)
    return written


@dataclass(frozen=True)
class StartResult:
    healthy: bool
    seconds: float
    reason: str  # "healthy", "failed", "timeout"
    status: SupervisorState | None


def follow_start(record: InstanceRecord, *, started_at: float, timeout_s: float,
                 on_stage: Callable[[str, str, float], None] | None = None,
                 failed: Callable[[], bool] | None = None, poll_s: float = 1.0) -> StartResult:
    """Follow a start through the supervisor's status file and /health until healthy, failed or timed out.

    `failed()` asks the service manager whether the unit gave up (systemd: failed or inactive after starting).
    A status file from an earlier run (written before `started_at`) is ignored.
    """
    url = base_url(record.host, record.port)
    seen: set[tuple[Stage, float]] = set()
    status: SupervisorState | None = None
    while True:
        elapsed = time.monotonic() - started_at
        current = read_status(record)
        if current is not None and (current.started_at or 0) >= time.time() - elapsed - 5:
            status = current
            for entry in current.stages:
                if (entry.stage, entry.at) not in seen:
                    seen.add((entry.stage, entry.at))
                    if on_stage is not None and entry.stage is not Stage.EXITED:
                        on_stage(entry.stage.value, entry.detail, entry.elapsed_s)
            if current.exit is not None:
                return StartResult(False, elapsed, "failed", status)
        if status is not None and status.stage is Stage.HEALTHY and health_ok(url):
            return StartResult(True, elapsed, "healthy", status)
        if failed is not None and failed():
            return StartResult(False, elapsed, "failed", read_status(record) or status)
        if elapsed > timeout_s:
            return StartResult(False, elapsed, "timeout", status)
        time.sleep(poll_s)
