"""What an Ansible run reports, as typed events: ansible-runner event dicts in, `PlaybookEvent`s out.

Everything Ansible does reaches npuops as ansible-runner event dicts, never as scraped stdout. `parse_event` turns
one event dict into a `PlaybookEvent`, `result_message` makes a task result's message specific, `ansible_errors`
finds Ansible's own errors outside tasks. All pure, tested on recorded events.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

EventKind = Literal["task_start", "ok", "changed", "failed", "skipped", "unreachable", "stats"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Ansible >= 2.19 prints "[ERROR]: ...", older releases "ERROR! ...".
_ERROR_LINE = re.compile(r"^\s*(?:\[ERROR\]:|ERROR!)\s*(.*)$")
_ORIGIN_LINE = re.compile(r"^\s*Origin:\s*(.*)$")


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
