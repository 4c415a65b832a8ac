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
from dataclasses import asdict, dataclass
from pathlib import Path

from npuops.atomic import write_text_atomic
from npuops.errors import BadInputError, NpuopsError
from npuops.inputfiles import KIB, read_input_text
from npuops.instance.control import pid_alive
from npuops.instance.record import InstanceRecord, list_records, read_status
from npuops.instance.state import EXIT_STOPPED
from npuops.monitor.render import MonitorChoices, render_monitoring, write_monitoring
from npuops.monitor.values import quoted, record_problem
from npuops.wire import WireFormatError, WireObject

MONITOR_FILE = "monitor.json"


def _saved_path(state_dir: Path) -> Path:
    return state_dir / MONITOR_FILE


_RERENDER = "run `npuops monitor render --output DIR` again (it rewrites monitor.json)"


def check_state_dir(state_dir: Path) -> None:
    """The state directory is a directory (or not there yet): a file there is one line naming it, before anything
    is written."""
    if state_dir.exists() and not state_dir.is_dir():
        raise BadInputError(f"the state directory {state_dir} is not a directory",
                            "set NPUOPS_STATE_DIR (or state_dir in npuops' config file) to the directory launch "
                            "writes its instances into")


def save_render(state_dir: Path, output: Path, choices: MonitorChoices) -> None:
    check_state_dir(state_dir)
    data = {"output": str(output.resolve()), "choices": asdict(choices)}
    try:
        write_text_atomic(_saved_path(state_dir), json.dumps(data, indent=1) + "\n", mode=0o644)
    except OSError as exc:
        raise BadInputError(f"cannot write {_saved_path(state_dir)}: {exc.strerror}",
                            "run as a user that can write the state directory (launches keep DIR current from it)"
                            ) from None


def _read_saved(data: object, path: Path) -> tuple[Path, MonitorChoices]:
    saved = WireObject(data, str(path))
    output = saved.req_text("output")
    if "\0" in output or not Path(output).is_absolute():
        raise WireFormatError(str(path), f"output {quoted(output)} is not an absolute path")
    choices = saved.obj("choices")
    defaults = MonitorChoices()
    factor = choices.opt_number("latency_factor")
    # A saved null node_exporter is `--node-exporter none`; a missing one (an older npuops) the default.
    return Path(output), MonitorChoices(
        node_exporter=choices.opt_text("node_exporter") if "node_exporter" in choices.data else defaults.node_exporter,
        npu_exporter=choices.opt_text("npu_exporter"), docs_url=choices.text("docs_url"),
        latency_factor=defaults.latency_factor if factor is None else factor,
        scrape_interval_s=choices.integer("scrape_interval_s", defaults.scrape_interval_s))


def saved_render(state_dir: Path) -> tuple[Path, MonitorChoices] | None:
    """Where `npuops monitor render` last wrote and its choices, or None when it never ran on this node (or the
    state directory is not there); a file that is not what it writes is one BadInputError."""
    path = _saved_path(state_dir)
    if not (path.exists() or path.is_symlink()):
        return None
    text = read_input_text(path, "monitoring choices", max_bytes=64 * KIB, fix=_RERENDER)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise BadInputError(f"{path} is not JSON", _RERENDER) from None
    try:
        return _read_saved(data, path)
    except BadInputError as exc:  # a key of the wrong type, or a choice out of range
        problem = exc.reason if isinstance(exc, WireFormatError) else exc.problem
        raise BadInputError(f"{path} is not what `npuops monitor render` writes ({problem})", _RERENDER) from None


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


@dataclass(frozen=True)
class NodeRender:
    written: list[Path]
    records: list[InstanceRecord]  # the records watched
    refused: list[str]  # records left out, and why (npuops.monitor.render.Rendered.refused)


def render_node(state_dir: Path, output: Path, host: str, choices: MonitorChoices) -> NodeRender:
    """Render this node's monitoring into `output` (what `npuops monitor render` and every refresh write)."""
    check_state_dir(state_dir)
    records = serving_records(list_records(state_dir))
    rendered = render_monitoring(records, host, choices)
    watched = [r for r in records if record_problem(r) is None]
    return NodeRender(write_monitoring(output, rendered.files), watched, rendered.refused)


def refresh_monitoring(state_dir: Path, host: str) -> str | None:
    """Render the saved directory again after an instance changed; a line to tell the operator, or None when
    `npuops monitor render` never ran here. A failure is told, not raised: the instance itself changed, and the
    line says the refresh was skipped and why."""
    try:
        saved = saved_render(state_dir)
        if saved is None:
            return None
        output, choices = saved
        done = render_node(state_dir, output, host, choices)
    except NpuopsError as exc:
        return f"warning: monitoring not refreshed: {exc.one_line()}"
    left_out = f" (not watched: {'; '.join(done.refused)})" if done.refused else ""
    return f"monitoring: Prometheus' targets and rules in {output} follow the change{left_out}"
