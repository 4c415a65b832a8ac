"""Prometheus follows what serves: `npuops monitor render` keeps where it wrote and with which choices
(`<state_dir>/monitor.json`), and launch, stop, remove and rollout render the same directory again afterwards.
Prometheus re-reads the file_sd target files and, on a reload, the rule file, so it needs no restart for a new
instance, and nothing alerts on an instance its operator stopped: its parts leave the targets with it.

An instance the operator stopped is one whose supervisor wrote "stopped" as its exit and is gone; one that crashed,
or that systemd is restarting, stays a target, and its alerts fire.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from npuops.atomic import write_text_atomic
from npuops.errors import BadInputError, NpuopsError
from npuops.instance.control import pid_alive
from npuops.instance.record import InstanceRecord, list_records, read_status
from npuops.instance.state import EXIT_STOPPED
from npuops.monitor.render import MonitorChoices, render_monitoring, write_monitoring

MONITOR_FILE = "monitor.json"


def _saved_path(state_dir: Path) -> Path:
    return state_dir / MONITOR_FILE


def save_render(state_dir: Path, output: Path, choices: MonitorChoices) -> None:
    data = {"output": str(output.resolve()), "choices": asdict(choices)}
    write_text_atomic(_saved_path(state_dir), json.dumps(data, indent=1) + "\n", mode=0o644)


def saved_render(state_dir: Path) -> tuple[Path, MonitorChoices] | None:
    """Where `npuops monitor render` last wrote and its choices, or None when it never ran on this node."""
    path = _saved_path(state_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Path(data["output"]), MonitorChoices(**data["choices"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInputError(f"{path} is not what `npuops monitor render` writes ({exc})",
                            "run `npuops monitor render --output DIR` again") from None


def _stopped_by_operator(record: InstanceRecord) -> bool:
    state = read_status(record)
    return (state is not None and state.exit is not None and state.exit.reason == EXIT_STOPPED
            and not pid_alive(state.supervisor_pid))


def serving_records(records: Sequence[InstanceRecord]) -> list[InstanceRecord]:
    """The records Prometheus should watch: all but the parts of instances their operator stopped (a router goes
    with its replicas on this host)."""
    stopped = {r.name for r in records if not r.is_router and r.runs_engine and _stopped_by_operator(r)}
    kept = []
    for record in records:
        if record.name in stopped:
            continue
        if record.is_router and record.replicas and all(name in stopped for name in record.replicas):
            continue
        kept.append(record)
    return kept


def render_node(state_dir: Path, output: Path, host: str, choices: MonitorChoices
                ) -> tuple[list[Path], list[InstanceRecord]]:
    """Render this node's monitoring into `output` (what `npuops monitor render` and every refresh write): the
    files written, and the records watched."""
    records = serving_records(list_records(state_dir))
    return write_monitoring(output, render_monitoring(records, host, choices)), records


def refresh_monitoring(state_dir: Path, host: str) -> str | None:
    """Render the saved directory again after an instance changed; a line to tell the operator, or None when
    `npuops monitor render` never ran here. A failure is told, not raised: the instance itself changed."""
    try:
        saved = saved_render(state_dir)
        if saved is None:
            return None
        output, choices = saved
        render_node(state_dir, output, host, choices)
    except NpuopsError as exc:
        return f"warning: monitoring not refreshed: {exc.one_line()}"
    return f"monitoring: Prometheus' targets and rules in {output} follow the change"
