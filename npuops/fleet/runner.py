"""Run one playbook through ansible-runner; hand back typed events as they happen and a typed result.

Everything Ansible does reaches npuops as ansible-runner event dicts, never as scraped stdout.
`parse_event` turns one event dict into a `PlaybookEvent` (pure, tested on recorded events);
`EventCollector` folds the stream into per-host stats, failure messages and `set_stats` data
(pure too); `run_playbook` is the only part that starts a process.

Hand data back from a playbook with `ansible.builtin.set_stats` and `per_host: true`: each
host's data arrives in that task's `runner_on_ok` event (`res.ansible_stats`) while the run is
still going, and lands in `HostResult.data`. (ansible-runner's final stats event carries only the
non-per-host `_run` data, which lands in `PlaybookRun.run_data`.)

ansible_runner is imported inside `run_playbook`, so importing this module (and `npuops --help`)
stays cheap.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shlex
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import yaml

from npuops.errors import BadInputError, EnvironmentMissingError
from npuops.resources import shipped_dir

EventKind = Literal["task_start", "ok", "changed", "failed", "skipped", "unreachable", "stats"]
HostStatus = Literal["ok", "failed", "unreachable"]

# `--host localhost` means this machine over a local connection. The interpreter is the one
# running ansible-playbook: discovery would otherwise pick whatever `python3` is first on PATH
# (a pyenv shim on some machines) and fail.
LOCALHOST = "localhost"
LOCALHOST_VARS: Mapping[str, str] = {
    "ansible_connection": "local",
    "ansible_python_interpreter": "{{ ansible_playbook_python }}",
}

# Environment for every run, on top of the caller's process environment (ansible-runner copies it).
BASE_ENVVARS: Mapping[str, str] = {
    # An unparsable inventory must stop the run; by default Ansible warns and carries on with an
    # empty inventory, which would look like a fleet where nothing was wrong.
    "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
    # Error text travels in `verbose` events and the artifacts; colour codes would only garble it.
    "ANSIBLE_NOCOLOR": "True",
    # A failed run must never write a .retry file beside a playbook inside an installed package.
    "ANSIBLE_RETRY_FILES_ENABLED": "False",
}

# Host names given with --host: what DNS names and IP addresses are made of. Anything else
# (spaces, quotes, patterns) is refused rather than guessed at.
_HOST_NAME = re.compile(r"^[A-Za-z0-9_.:\[\]-]+$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Ansible >= 2.19 prints "[ERROR]: ...", older releases "ERROR! ...".
_ERROR_LINE = re.compile(r"^\s*(?:\[ERROR\]:|ERROR!)\s*(.*)$")
_ORIGIN_LINE = re.compile(r"^\s*Origin:\s*(.*)$")


# --- typed events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostStats:
    """Ansible's recap for one host. `ok` counts changed results too, as in the recap."""

    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: int = 0
    ignored: int = 0
    rescued: int = 0

    def to_json(self) -> dict[str, int]:
        return {"ok": self.ok, "changed": self.changed, "failed": self.failed, "skipped": self.skipped,
                "unreachable": self.unreachable, "ignored": self.ignored, "rescued": self.rescued}


@dataclass(frozen=True)
class PlaybookEvent:
    """One thing that happened in a run, as a progress display or a report needs it.

    `task_start` has no host; `stats` has no host and carries the final recap in `stats`.
    A failure under `ignore_errors` is kind "failed" with `ignored` set (Ansible counts it as ok).
    """

    kind: EventKind
    host: str | None = None
    role: str | None = None
    task: str | None = None
    action: str | None = None
    message: str = ""
    changed: bool = False
    duration: float | None = None
    ignored: bool = False
    rc: int | None = None
    diff: tuple[Mapping[str, Any], ...] = ()
    stats: Mapping[str, HostStats] | None = None
    # The data of an `ansible.builtin.set_stats` task: {"data": {...}, "per_host": bool, "aggregate": bool}.
    set_stats: Mapping[str, Any] | None = None
    # The controller's clock (epoch seconds) when a result's task began on the host and when the result came
    # back (event_data start/end, else the event's `created`): the window a reading taken on the host falls in.
    started_at: float | None = None
    ended_at: float | None = None


_RESULT_KINDS: Mapping[str, EventKind] = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_skipped": "skipped",
    "runner_on_unreachable": "unreachable",
}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _tail(text: Any, lines: int = 3) -> str:
    if not isinstance(text, str):
        return ""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def result_message(res: Mapping[str, Any], kind: EventKind) -> str:
    """The one message a person needs from a task result: Ansible's msg, made specific. Pure."""
    msg = _text(res.get("msg")) or ""
    # ansible-core 2.19 prefixes errors with "Task failed: "; the event kind already says so.
    msg = msg.removeprefix("Task failed: ").removeprefix("Task failed. ") if kind in ("failed", "unreachable") else msg
    if kind == "skipped":
        return _text(res.get("skip_reason")) or msg
    if kind not in ("failed", "unreachable"):
        return msg
    rc = _int(res.get("rc"))
    cmd = res.get("cmd")
    cmd_text = " ".join(str(c) for c in cmd) if isinstance(cmd, list) else _text(cmd)
    if msg == "Error executing command." and rc is not None and rc in errno.errorcode:
        # Ansible's run_command puts the OSError's errno in rc and hides the text (ENOENT: not found).
        return f"cannot execute `{cmd_text}` on the host: {os.strerror(rc)} ({errno.errorcode[rc]})"
    results = res.get("results")
    if isinstance(results, list) and msg in ("", "One or more items failed"):
        # A loop: the first failed item holds the real message.
        for item in results:
            if isinstance(item, Mapping) and item.get("failed"):
                return result_message(item, "failed")
    parts = [msg or "task failed"]
    if rc is not None and msg in ("", "non-zero return code"):
        parts[0] = f"`{cmd_text}` exited {rc}" if cmd_text else f"exited {rc}"
    output = _tail(res.get("stderr")) or (_tail(res.get("stdout")) if msg in ("", "non-zero return code") else "")
    if output:
        parts.append(output)
    return ": ".join(parts)


def _diffs(res: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    diff = res.get("diff")
    if isinstance(diff, Mapping):
        return (diff,) if diff else ()
    if isinstance(diff, list):
        return tuple(d for d in diff if isinstance(d, Mapping) and d)
    return ()


def _host_counts(data: Mapping[str, Any]) -> dict[str, HostStats]:
    def counts(key: str) -> Mapping[str, Any]:
        value = data.get(key)
        return value if isinstance(value, Mapping) else {}

    names: set[str] = set()
    for key in ("processed", "ok", "changed", "failures", "skipped", "dark", "ignored", "rescued"):
        names.update(k for k in counts(key) if isinstance(k, str))

    def get(key: str, host: str) -> int:
        return _int(counts(key).get(host)) or 0

    return {
        host: HostStats(ok=get("ok", host), changed=get("changed", host), failed=get("failures", host),
                        skipped=get("skipped", host), unreachable=get("dark", host),
                        ignored=get("ignored", host), rescued=get("rescued", host))
        for host in sorted(names)
    }


def _timestamp(value: Any) -> float | None:
    """An ansible-runner ISO timestamp ("2026-11-29T11:09:42.387718+00:00") as epoch seconds, else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).timestamp()


def parse_event(raw: Mapping[str, Any]) -> PlaybookEvent | None:
    """Turn one ansible-runner event dict into a PlaybookEvent, or None for events npuops ignores
    (starts, per-item results, verbose output). Pure and total: missing or odd fields give defaults."""
    name = raw.get("event")
    data = raw.get("event_data")
    if not isinstance(data, Mapping):
        data = {}
    role = _text(data.get("role"))
    task = _text(data.get("task"))
    action = _text(data.get("resolved_action")) or _text(data.get("task_action"))
    if name == "playbook_on_task_start":
        return PlaybookEvent("task_start", role=role, task=task, action=action)
    if name == "playbook_on_stats":
        return PlaybookEvent("stats", stats=_host_counts(data))
    if not isinstance(name, str) or name not in _RESULT_KINDS:
        return None
    kind = _RESULT_KINDS[name]
    res = data.get("res")
    if not isinstance(res, Mapping):
        res = {}
    changed = res.get("changed") is True
    if kind == "ok" and changed:
        kind = "changed"
    duration = data.get("duration")
    set_stats = res.get("ansible_stats")
    return PlaybookEvent(
        kind,
        host=_text(data.get("host")),
        role=role,
        task=task,
        action=action,
        message=result_message(res, kind),
        changed=changed,
        duration=float(duration) if isinstance(duration, (int, float)) and not isinstance(duration, bool) else None,
        ignored=kind == "failed" and data.get("ignore_errors") is True,
        rc=_int(res.get("rc")),
        diff=_diffs(res),
        set_stats=set_stats if isinstance(set_stats, Mapping) and kind in ("ok", "changed") else None,
        started_at=_timestamp(data.get("start")),
        ended_at=_timestamp(data.get("end")) or _timestamp(raw.get("created")),
    )


def ansible_errors(raw: Mapping[str, Any]) -> list[str]:
    """Ansible's own error lines (with their origin) from a `verbose` event: why a run stopped
    before or outside any task (bad inventory, --limit matching nothing, a playbook that does
    not parse). These are not task results, which only ever come from result events. Pure."""
    if raw.get("event") != "verbose" or not isinstance(raw.get("stdout"), str):
        return []
    found: list[str] = []
    for line in _ANSI.sub("", raw["stdout"]).splitlines():
        error = _ERROR_LINE.match(line)
        origin = _ORIGIN_LINE.match(line)
        if error and error.group(1).strip():
            found.append(error.group(1).strip())
        elif origin and found:
            found[-1] += f" ({origin.group(1).strip()})"
    return found


# --- the result -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostFailure:
    task: str | None
    role: str | None
    message: str
    unreachable: bool = False
    rc: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "role": self.role, "message": self.message, "unreachable": self.unreachable,
                "rc": self.rc}


@dataclass(frozen=True)
class HostResult:
    name: str
    stats: HostStats
    failures: tuple[HostFailure, ...] = ()
    # What the host handed back with `set_stats` and `per_host: true`.
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> HostStatus:
        # From the recap: a failure that a `rescue:` block handled does not count, as in Ansible.
        if self.stats.unreachable:
            return "unreachable"
        if self.stats.failed:
            return "failed"
        return "ok"

    @property
    def message(self) -> str:
        """What stopped the host: its last failure (a host runs no task after a fatal one)."""
        if self.status == "ok" or not self.failures:
            return ""
        return self.failures[-1].message

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, **self.stats.to_json(), "message": self.message,
                "failures": [f.to_json() for f in self.failures]}


RunStatus = str  # ansible-runner's: "successful", "failed", "timeout", "canceled"


@dataclass(frozen=True)
class PlaybookRun:
    playbook: Path
    rc: int
    status: RunStatus
    hosts: Mapping[str, HostResult]
    artifacts: Path
    duration_s: float
    # set_stats data without per_host (ansible-runner's `artifact_data`).
    run_data: Mapping[str, Any] = field(default_factory=dict)
    # Ansible's own errors outside tasks (see `ansible_errors`).
    errors: tuple[str, ...] = ()
    # A play whose host pattern matched no host in the inventory (with --limit applied).
    no_hosts_matched: bool = False
    events: tuple[PlaybookEvent, ...] = ()

    @property
    def ok(self) -> bool:
        """Every targeted host converged and Ansible itself was content."""
        return self.rc == 0 and self.status == "successful" and all(h.status == "ok" for h in self.hosts.values())

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "rc": self.rc, "status": self.status, "playbook": str(self.playbook),
                "artifacts": str(self.artifacts), "duration_s": round(self.duration_s, 3),
                "errors": list(self.errors), "hosts": {n: h.to_json() for n, h in self.hosts.items()}}


def _merge_hash(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(old)
    for key, value in new.items():
        previous = merged.get(key)
        merged[key] = _merge_hash(previous, value) if isinstance(previous, Mapping) and isinstance(value, Mapping) \
            else value
    return merged


def _aggregate(old: Any, new: Any) -> Any:
    """set_stats' `aggregate: true` as Ansible's AggregateStats.update_custom_stats does it: mappings merge
    recursively (nested lists are replaced), other values are added (`+`), a value of another type is dropped."""
    if not isinstance(new, type(old)):
        return old
    if isinstance(old, Mapping):
        return _merge_hash(old, new)
    try:
        return old + new
    except TypeError:
        return new


class EventCollector:
    """Folds raw ansible-runner events into per-host results. Pure: no I/O, fed one event at a time."""

    def __init__(self) -> None:
        self.events: list[PlaybookEvent] = []
        self.errors: list[str] = []
        self.final_stats: Mapping[str, HostStats] | None = None
        self.run_data: dict[str, Any] = {}
        self.no_hosts_matched = False
        self._seen_hosts: list[str] = []
        self._counts: dict[str, dict[str, int]] = {}
        self._failures: dict[str, list[HostFailure]] = {}
        self._data: dict[str, dict[str, Any]] = {}

    def add(self, raw: Mapping[str, Any]) -> PlaybookEvent | None:
        self.errors.extend(ansible_errors(raw))
        if raw.get("event") == "playbook_on_no_hosts_matched":
            self.no_hosts_matched = True
        if raw.get("event") == "playbook_on_stats":
            data = raw.get("event_data")
            artifact_data = data.get("artifact_data") if isinstance(data, Mapping) else None
            if isinstance(artifact_data, Mapping):
                self.run_data = dict(artifact_data)
        event = parse_event(raw)
        if event is None:
            return None
        self.events.append(event)
        if event.kind == "stats":
            self.final_stats = event.stats
        elif event.host is not None and event.kind != "task_start":
            self._count(event)
        return event

    def _count(self, event: PlaybookEvent) -> None:
        host = event.host
        assert host is not None
        if host not in self._counts:
            self._seen_hosts.append(host)
            self._counts[host] = {}
        counts = self._counts[host]

        def bump(key: str) -> None:
            counts[key] = counts.get(key, 0) + 1

        if event.kind in ("ok", "changed") or (event.kind == "failed" and event.ignored):
            bump("ok")
            if event.changed:
                bump("changed")
            if event.ignored:
                bump("ignored")
        elif event.kind == "failed":
            bump("failed")
        elif event.kind == "skipped":
            bump("skipped")
        elif event.kind == "unreachable":
            bump("unreachable")
        if event.kind in ("failed", "unreachable") and not event.ignored:
            self._failures.setdefault(host, []).append(
                HostFailure(event.task, event.role, event.message, event.kind == "unreachable", event.rc))
        if event.set_stats is not None and event.set_stats.get("per_host") is True:
            data = event.set_stats.get("data")
            if isinstance(data, Mapping):
                stored = self._data.setdefault(host, {})
                aggregate = event.set_stats.get("aggregate", True) is not False
                for key, value in data.items():
                    stored[key] = _aggregate(stored[key], value) if aggregate and key in stored else value

    def hosts(self) -> dict[str, HostResult]:
        """Per host, the final recap where Ansible gave one, else the counts of the events seen
        (a run that timed out or was cancelled has no recap)."""
        names = list(self._seen_hosts)
        if self.final_stats is not None:
            names += [h for h in self.final_stats if h not in self._counts]
        results: dict[str, HostResult] = {}
        for name in names:
            if self.final_stats is not None and name in self.final_stats:
                stats = self.final_stats[name]
            else:
                stats = HostStats(**self._counts.get(name, {}))
            results[name] = HostResult(name, stats, tuple(self._failures.get(name, ())), self._data.get(name, {}))
        return results

    def finish(self, *, playbook: Path, rc: int, status: str, artifacts: Path, duration_s: float) -> PlaybookRun:
        return PlaybookRun(playbook=playbook, rc=rc, status=status, hosts=self.hosts(), artifacts=artifacts,
                           duration_s=duration_s, run_data=dict(self.run_data), errors=tuple(self.errors),
                           no_hosts_matched=self.no_hosts_matched, events=tuple(self.events))


# --- inputs ---------------------------------------------------------------------------------------


def resolve_playbook(playbook: str) -> Path:
    """A shipped playbook by name (`node-facts` or `node-facts.yml`), or a path to a playbook file."""
    if not playbook:
        raise BadInputError("no playbook given", "name a playbook shipped with npuops, e.g. node-facts.yml")
    if "/" in playbook or playbook.startswith("."):
        path = Path(playbook).expanduser()
        if not path.is_file():
            raise BadInputError(f"playbook {playbook} does not exist", "pass the path of an existing playbook file")
        return path.resolve()
    shipped = shipped_dir("playbooks")
    for name in (playbook, f"{playbook}.yml", f"{playbook}.yaml"):
        if (shipped / name).is_file():
            return (shipped / name).resolve()
    known = sorted(p.name for p in shipped.glob("*.yml"))
    raise BadInputError(f"npuops ships no playbook named {playbook!r}",
                        f"use one of: {', '.join(known) or '(none installed)'}")


def _check_hosts(hosts: Sequence[str]) -> list[str]:
    if isinstance(hosts, str):
        # A bare string is a caller's bug (an inventory path not wrapped in Path, or one host not in
        # a list); guessing which would run the playbook on the wrong machines.
        raise TypeError("hosts must be a list of host names; pass an inventory file as a Path")
    unique: list[str] = []
    for host in hosts:
        if not isinstance(host, str) or not _HOST_NAME.match(host):
            raise BadInputError(f"--host {host!r} is not a host name or address",
                                "give a DNS name or IP address per --host, or use an inventory file with -i")
        if host not in unique:
            unique.append(host)
    if not unique:
        raise BadInputError("no hosts given", "name hosts with --host, or pass an inventory file with -i")
    return unique


def hosts_inventory(hosts: Sequence[str]) -> dict[str, Any]:
    """The inventory for hosts named on the command line. `localhost` is this machine, locally. Pure."""
    return {"all": {"hosts": {h: dict(LOCALHOST_VARS) if h == LOCALHOST else {} for h in _check_hosts(hosts)}}}


def _check_inventory(inventory: Path) -> Path:
    path = Path(inventory).expanduser()
    if not path.exists():
        raise BadInputError(f"inventory {inventory} does not exist",
                            "pass an existing inventory file or directory with -i, or name hosts with --host")
    if not os.access(path, os.R_OK):
        raise BadInputError(f"inventory {inventory} is not readable", "fix its permissions")
    return path.resolve()


def _check_options(limit: str | None, extravars: Mapping[str, Any], tags: Sequence[str] | None, forks: int) -> None:
    if limit is not None and not limit.strip():
        raise BadInputError("--limit is empty", "give a host pattern to --limit, or leave it out")
    for key in extravars:
        if not isinstance(key, str) or not key.isidentifier():
            raise BadInputError(f"extra variable name {key!r} is not a valid Ansible variable name",
                                "use letters, digits and underscores, not starting with a digit")
    for tag in tags or ():
        if not tag or "," in tag or tag != tag.strip():
            raise BadInputError(f"tag {tag!r} is not a tag name",
                                "give tags as separate names, e.g. --tags driver,cann")
    if isinstance(forks, bool) or not isinstance(forks, int) or forks < 1:
        raise BadInputError(f"--forks {forks!r} is not a positive number", "pass --forks 1 or more")


def default_ansible_playbook() -> Path:
    """The ansible-playbook installed beside this interpreter: it works in a venv that is not on PATH,
    and it is the ansible-core npuops was installed with."""
    return Path(sys.executable).parent / "ansible-playbook"


def _check_ansible_playbook(binary: Path | None) -> Path:
    path = binary if binary is not None else default_ansible_playbook()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise EnvironmentMissingError(
            f"ansible-playbook not found at {path}",
            f"install ansible-core into npuops' environment: {sys.executable} -m pip install "
            "'ansible-core>=2.19,<2.20' 'ansible-runner==2.4.*'",
        )
    return path


def default_artifacts_dir(environ: Mapping[str, str], *, is_root: bool) -> Path:
    """Where run artifacts (events, stdout) are kept unless the user says: /var/lib for root,
    the XDG state directory otherwise. Pure: the CLI passes its captured environment."""
    if is_root:
        return Path("/var/lib/npuops/ansible")
    state = environ.get("XDG_STATE_HOME")
    if state:
        return Path(state) / "npuops" / "ansible"
    home = environ.get("HOME")
    if home:
        return Path(home) / ".local" / "state" / "npuops" / "ansible"
    raise EnvironmentMissingError("no place for Ansible run artifacts: neither XDG_STATE_HOME nor HOME is set",
                                  "set HOME, or pass an artifacts directory")


def _new_ident(playbook: Path) -> str:
    # Sortable by time and readable in `ls`; the random tail keeps two runs in one second apart.
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{playbook.stem}-{uuid.uuid4().hex[:6]}"


def _import_ansible_runner() -> Any:
    try:
        import ansible_runner  # type: ignore[import-untyped]  # ships no type information
    except ImportError:
        raise EnvironmentMissingError(
            "ansible-runner is not installed in npuops' environment",
            f"{sys.executable} -m pip install 'ansible-runner==2.4.*' 'ansible-core>=2.19,<2.20'",
        ) from None
    return ansible_runner


# --- running --------------------------------------------------------------------------------------


def run_playbook(
    playbook: str,
    *,
    inventory: Path | Sequence[str],
    artifacts_dir: Path,
    limit: str | None = None,
    extravars: Mapping[str, Any] | None = None,
    tags: Sequence[str] | None = None,
    check: bool = False,
    diff: bool = False,
    forks: int = 5,
    on_event: Callable[[PlaybookEvent], None] | None = None,
    timeout_s: float | None = None,
    envvars: Mapping[str, str] | None = None,
    ansible_playbook: Path | None = None,
) -> PlaybookRun:
    """Run `playbook` on `inventory` (an inventory file/directory, or host names as given with --host)
    and return what happened per host. `on_event` sees each PlaybookEvent as it happens.

    Expected problems (bad inventory, unknown playbook, missing ansible-playbook, a limit that
    matches nothing, a playbook Ansible rejects) raise NpuopsError with the problem and the fix.
    Failed and unreachable hosts do not raise: they are in the result.

    `timeout_s` bounds the whole run (status "timeout"); ansible-runner then kills ansible-playbook,
    but a module already running on a host (localhost included) finishes by itself, so a playbook
    bounds its own long tasks with the `timeout:` task keyword. If `on_event` raises, the run is
    cancelled and the exception re-raised once ansible-playbook has stopped.
    """
    playbook_path = resolve_playbook(playbook)
    extravars = dict(extravars or {})
    _check_options(limit, extravars, tags, forks)
    inventory_file: Path | None = None
    host_inventory: dict[str, Any] | None = None
    if isinstance(inventory, Path):
        inventory_file = _check_inventory(inventory)
    else:
        host_inventory = hosts_inventory(inventory)
    binary = _check_ansible_playbook(ansible_playbook)
    runner_api = _import_ansible_runner()
    try:
        artifacts_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInputError(f"cannot create the artifacts directory {artifacts_dir}: {exc.strerror}",
                            "pass a directory you can write to") from None

    ident = _new_ident(playbook_path)
    collector = EventCollector()
    handler_error: list[BaseException] = []

    def handle(raw: dict[str, Any]) -> bool:
        event = collector.add(raw)
        if event is not None and on_event is not None and not handler_error:
            try:
                on_event(event)
            except Exception as exc:  # noqa: BLE001 - re-raised after the run is stopped cleanly
                handler_error.append(exc)
        return True  # keep every event in the artifacts

    started = time.monotonic()
    # A fresh private data dir per run: ansible-runner would otherwise reuse env/ files (cmdline,
    # extravars) from an earlier run; suppress_env_files keeps it from writing them at all.
    with tempfile.TemporaryDirectory(prefix="npuops-ansible-") as private:
        private_dir = Path(private)
        if host_inventory is not None:
            inventory_file = private_dir / "inventory.yml"
            inventory_file.write_text(yaml.safe_dump(host_inventory, sort_keys=False), encoding="utf-8")
        # Extra vars go in a private file, not on the command line: `ps` and the artifacts' `command`
        # file would show them, and ansible-runner builds its -e JSON without escaping the keys.
        vars_file = private_dir / "extravars.json"
        fd = os.open(vars_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle_file:
            json.dump(extravars, handle_file)
        # With binary= ansible-runner appends no playbook itself; cmdline is split with shlex, so every
        # path is quoted. Nothing here goes through a shell.
        args = [str(playbook_path), "-e", f"@{vars_file}"]
        if check:
            args.append("--check")
        if diff:
            args.append("--diff")
        try:
            result = runner_api.run(
                private_data_dir=str(private_dir),
                artifact_dir=str(artifacts_dir),
                ident=ident,
                binary=str(binary),
                cmdline=" ".join(shlex.quote(a) for a in args),
                inventory=str(inventory_file),
                limit=limit,
                tags=",".join(tags) if tags else None,
                forks=forks,
                envvars={**BASE_ENVVARS, **(envvars or {})},
                timeout=max(1, math.ceil(timeout_s)) if timeout_s else None,
                suppress_env_files=True,
                quiet=True,
                # ansible-runner looks at cancel and timeout only when its wait for output times out
                # (5 s by default): a second keeps a failed display or a timeout from lingering.
                settings={"pexpect_timeout": 1},
                event_handler=handle,
                cancel_callback=lambda: bool(handler_error),
            )
        except runner_api.exceptions.AnsibleRunnerException as exc:
            raise EnvironmentMissingError(f"ansible-runner could not run {playbook_path.name}: {exc}",
                                          f"see the artifacts in {artifacts_dir / ident}") from None
    if handler_error:
        raise handler_error[0]

    artifacts = artifacts_dir / ident
    run = collector.finish(playbook=playbook_path, rc=int(result.rc if result.rc is not None else -1),
                           status=str(result.status), artifacts=artifacts,
                           duration_s=time.monotonic() - started)
    if not run.hosts and run.status not in ("timeout", "canceled"):
        _raise_for_hostless(run, limit, tags, inventory if isinstance(inventory, Path) else None)
    return run


def _raise_for_hostless(run: PlaybookRun, limit: str | None, tags: Sequence[str] | None,
                        inventory: Path | None) -> None:
    """A run that reached no host because of its inputs is not what the caller wanted: say why in
    one line. (A playbook with nothing to do for anyone is left alone.)"""
    where = f"see {run.artifacts / 'stdout'}"
    if run.errors and inventory is not None and "inventory was parsed" in run.errors[0]:
        raise BadInputError(f"Ansible could not parse the inventory {inventory}",
                            f"check it with `ansible-inventory -i {inventory} --graph`; {where}")
    if run.errors:
        raise BadInputError(f"ansible-playbook stopped before running any task: {run.errors[0]}", where)
    if run.rc == 127:
        raise EnvironmentMissingError("ansible-playbook could not be started (rc 127)", where)
    if run.rc != 0:
        raise BadInputError(f"ansible-playbook failed before running any task (rc {run.rc})", where)
    if run.no_hosts_matched:
        scope = f" with --limit {limit}" if limit else ""
        raise BadInputError(f"no host in the inventory{scope} matches the hosts of {run.playbook.name}",
                            "check the inventory's groups and the --limit pattern (`ansible-inventory --graph -i ...`)")
    if tags:
        raise BadInputError(f"no task of {run.playbook.name} has the tags {','.join(tags)}",
                            f"list the playbook's tags with `ansible-playbook --list-tags {run.playbook}`")
