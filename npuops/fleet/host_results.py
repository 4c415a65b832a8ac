"""What a playbook run did per host, folded from its events: `EventCollector` (pure, fed one event at a time)
builds each host's `HostResult` and the run's `PlaybookRun`.

Hand data back from a playbook with `ansible.builtin.set_stats` and `per_host: true`: each host's data arrives in
that task's `runner_on_ok` event (`res.ansible_stats`) while the run is still going, and lands in `HostResult.data`.
(ansible-runner's final stats event carries only the non-per-host `_run` data, which lands in `PlaybookRun.run_data`.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from npuops.fleet.events import HostStats, PlaybookEvent, ansible_errors, parse_event

HostStatus = Literal["ok", "failed", "unreachable"]


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
