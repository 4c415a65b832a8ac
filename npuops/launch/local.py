"""`npuops launch` after planning and rendering: as a systemd service, or with the supervisor in the terminal.

Human progress goes to stderr as it happens ("[  12 s] loading weights"); the summary goes to stdout. With
--json the service launch prints one JSON document at the end and the foreground prints JSON lines (one per
stage, one when ready, one at exit), since it runs until stopped.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npuops.doctor.model import CheckOutcome, Status
from npuops.envfile import read_env_file
from npuops.errors import BadInputError, ExitCode
from npuops.httpclient import base_url
from npuops.instance.control import parts_of, pid_alive, stop_foreground
from npuops.instance.endpoint import Completion, first_completion
from npuops.instance.exit_statuses import unit_diagnosis
from npuops.instance.lock import instance_lock
from npuops.instance.manager import SystemdManager
from npuops.instance.record import (
    MANAGER_SYSTEMD,
    InstanceRecord,
    begin_foreground_log,
    list_records,
    read_status,
    remove_instance_dir,
    write_status,
)
from npuops.instance.revisions import LaunchOrigin
from npuops.instance.state import Diagnosis, Stage, SupervisorState
from npuops.launch.install import (
    check_ports_free,
    check_service_access,
    check_service_user,
    check_writable,
    find_conflicts,
    follow_start,
    install,
    write_instance,
)
from npuops.launch.instance_files import InstanceFiles
from npuops.launch.revision_store import keep_revision, next_revision, with_revision
from npuops.monitor.refresh import refresh_monitoring
from npuops.safefiles import printable
from npuops.service.gate import chip_watch, refusal_status, render_gate_text, run_gate
from npuops.service.supervisor import LOG_TAIL_LINES, Supervisor, SupervisorOptions
from npuops.settings import Settings


class Reporter:
    def __init__(self, as_json: bool, json_lines: bool = False) -> None:
        self.as_json = as_json
        self.json_lines = json_lines

    def progress(self, text: str) -> None:
        # On stderr, --json or not (as a group launch does): stdout keeps the one document.
        print(text, file=sys.stderr, flush=True)

    def event(self, **data: Any) -> None:
        if self.as_json and self.json_lines:
            print(json.dumps(data), flush=True)

    def out(self, text: str) -> None:
        if not self.as_json:
            print(text, flush=True)


def stage_line(name: str, stage: str, detail: str, elapsed: float) -> str:
    return f"[{elapsed:5.0f} s] {name}: {stage}" + (f" ({detail})" if detail else "")


def _stop_previous(records: Sequence[InstanceRecord], settings: Settings, manager: SystemdManager | None,
                   report: Reporter) -> None:
    """A launch under a name already in use replaces that instance: stop it first. What the new launch does not
    install again (a single engine's unit become a router's, a replica fewer) is also disabled and removed, or it
    would come back at the next boot beside the new instance."""
    existing = {r.name: r for r in list_records(settings.state_dir)}
    new_units = {r.unit for r in records}
    new_names = {r.name for r in records}
    for record in records:
        old = existing.get(record.name)
        if old is None:
            continue
        for each in [old, *(parts_of(old) if old.is_router else [])]:
            _stop_replaced(each, manager, report, drop=each.unit not in new_units,
                           drop_record=each.name not in new_names, state_dir=settings.state_dir)


def _stop_replaced(old: InstanceRecord, manager: SystemdManager | None, report: Reporter, *, drop: bool,
                   drop_record: bool, state_dir: Path) -> None:
    if old.manager == MANAGER_SYSTEMD and manager is not None and manager.unavailable_reason() is None:
        if manager.state(old.unit).active_state in ("active", "activating", "reloading"):
            report.progress(f"stopping the running {old.unit} to replace it")
            manager.stop(old.unit, timeout=old.stop_timeout_s + 30)
        if drop:
            report.progress(f"removing {old.unit}: the new launch of {old.behind or old.name} has no such unit")
            manager.disable(old.unit)
            manager.remove_unit(old.unit)
    elif not stop_foreground(old, old.stop_timeout_s + 10):
        report.progress(f"note: the earlier foreground run of {old.name} did not stop")
    if drop_record:
        remove_instance_dir(state_dir, old.name)


def _summary(record: InstanceRecord, seconds: float, completion: Completion, api_key: str | None) -> list[str]:
    url = base_url(record.host, record.port)
    prediction = record.prediction or {}
    lines = [f"{record.name} is serving after {seconds:.0f} s",
             f"  endpoint   {url}/v1 (OpenAI-compatible){'; needs the API key' if api_key else ''}",
             f"  model      {record.served_model_name}",
             f"  first      {completion.tokens} token(s) in {completion.seconds:.2f} s "
             f"(finish: {completion.finish_reason})"]
    # A record read back (a rollout's stored revision) may hold anything there: only finite numbers are shown.
    ttft, tpot, rate = (_predicted(prediction, key) for key in ("ttft_ms", "tpot_ms", "output_tokens_per_s"))
    parts = [f"TTFT {ttft:.0f} ms" if ttft is not None else "", f"TPOT {tpot:.1f} ms" if tpot is not None else "",
             f"{rate:.0f} output tokens/s" if rate is not None else ""]
    if any(parts):
        lines.append(f"  plan       {', '.join(p for p in parts if p)} predicted for {record.hardware_label}")
    return lines


def _predicted(prediction: Mapping[str, object], key: str) -> float | None:
    value = prediction.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _failure_lines(diagnosis: Diagnosis | None, log_tail: Sequence[str]) -> list[str]:
    """What a failed start shows: the engine's last log lines and the supervisor's diagnosis, both written by the
    engine's service user, so each is escaped for the terminal (no escape sequence of theirs reaches root's)."""
    lines = []
    if log_tail:
        lines.append(f"last {len(log_tail)} log line(s):")
        lines += [f"  | {printable(line)}" for line in log_tail]
    if diagnosis:
        lines.append(f"diagnosis [{printable(diagnosis.id)}]: {printable(diagnosis.cause)}")
        if diagnosis.line:
            lines.append(f"  seen: {printable(diagnosis.line)}")
        lines.append(f"  fix: {printable(diagnosis.fix)}")
    else:
        lines.append("diagnosis: no known failure signature in the log; read it above or with `npuops logs`")
    return lines


def verify_served(record: InstanceRecord, settings: Settings, api_key: str | None,
                  golden: Path | None) -> CheckOutcome:
    """`launch --verify`: the check tagged `verify` (served-precision) against the golden file, or a transformers
    reference computed from the instance's own model directory by the interpreter beside its vllm."""
    from npuops.doctor.context import CheckContext, DoctorOptions
    from npuops.doctor.model import TAG_VERIFY
    from npuops.doctor.registry import checks_tagged, discover_checks
    from npuops.doctor.runner import run_checks
    from npuops.hardware.probe import Probe
    from npuops.service.gate import gate_settings

    options = DoctorOptions(endpoint=base_url(record.host, record.port), served_model=record.served_model_name,
                            golden=golden, reference_model=None if golden else Path(record.model_path),
                            api_key=api_key, served_dtype=record.dtype or None, instance=record)
    # One verdict for the launch: the one check the tag names (tests/doctor/test_check_ids.py holds it to one).
    (check,) = checks_tagged(discover_checks(), TAG_VERIFY)
    report = run_checks([check], CheckContext(Probe(gate_settings(settings, record)), options))
    return report.outcomes[0]


def verify_lines(outcome: CheckOutcome) -> list[str]:
    lines = [f"  verify     {outcome.result.status.value.upper()}: {outcome.result.message}"]
    if outcome.result.remediation and outcome.result.status is not Status.PASS:
        lines.append(f"             fix: {outcome.result.remediation}")
    return lines


# --- the foreground -------------------------------------------------------------------------------------------

def launch_foreground(instance: InstanceFiles, settings: Settings, *, api_key: str | None, as_json: bool,
                      notes: Sequence[str], environ: Mapping[str, str], verify: bool = False,
                      golden: Path | None = None) -> ExitCode | int:
    report = Reporter(as_json, json_lines=True)
    # The instance's lock while its files are written and its gate runs, not while it serves: `npuops stop NAME`
    # stops a foreground run as it stops a unit (a second launch is refused by _refuse_live_foreground).
    with instance_lock(settings.state_dir, [instance.name], "npuops launch"):
        if not _prepare_foreground(instance, settings, notes, report):
            return ExitCode.CHECKS_FAILED
    return _run_foreground(instance.record, settings, report, api_key=api_key, environ=environ, verify=verify,
                           golden=golden)


def _refuse_live_foreground(records: Sequence[InstanceRecord], settings: Settings) -> None:
    """A launch does not replace a run in someone's terminal: that run is stopped there, or with `npuops stop`."""
    existing = {r.name: r for r in list_records(settings.state_dir)}
    for record in records:
        old = existing.get(record.name)
        status = read_status(old) if old is not None and old.manager != MANAGER_SYSTEMD else None
        if status is not None and status.exit is None and pid_alive(status.supervisor_pid):
            raise BadInputError(f"{record.name} runs in the foreground (supervisor pid {status.supervisor_pid})",
                                f"stop it first (Ctrl-C where it runs, or `npuops stop {record.name}`), then launch")


def _prepare_foreground(instance: InstanceFiles, settings: Settings, notes: Sequence[str],
                        report: Reporter) -> bool:
    """The instance's files, replacing an earlier one of its name, and its start gate; False when it refused."""
    record = instance.record
    find_conflicts([record], list_records(settings.state_dir))
    _refuse_live_foreground([record], settings)
    _stop_previous([record], settings, None, report)
    check_ports_free([record])
    write_instance(instance, settings.state_dir)
    for note in notes:
        report.progress(f"note: {note}")
    # `npuops status` sees the instance starting from the first moment, not "stopped" while the gate runs.
    write_status(record, SupervisorState.gate(record.name, base_url(record.host, record.port)))
    _refresh_monitoring(settings, report)
    gate = run_gate(record, settings)
    gate_text = render_gate_text(gate, record.name)
    report.progress(gate_text)
    begin_foreground_log(record, gate_text)
    report.event(event="gate", **gate.to_json())
    if not gate.ok:
        write_status(record, refusal_status(gate, record.name))
    return gate.ok


def _run_foreground(record: InstanceRecord, settings: Settings, report: Reporter, *, api_key: str | None,
                    environ: Mapping[str, str], verify: bool, golden: Path | None) -> ExitCode | int:
    verify_failed: list[str] = []
    url = base_url(record.host, record.port)

    def on_stage(stage: Stage, detail: str, elapsed: float) -> None:
        report.progress(stage_line(record.name, stage.value, detail, elapsed))
        report.event(event="stage", stage=stage.value, detail=detail, elapsed_s=round(elapsed, 1))

    def on_ready() -> None:
        completion = first_completion(url, record.served_model_name, api_key=api_key)
        seconds = time.monotonic() - started
        if completion.ok:
            for line in _summary(record, seconds, completion, api_key):
                report.out(line)
            report.out(f"  stop       Ctrl-C here, or `npuops stop {record.name}`; "
                       f"`npuops status {record.name}` for live figures")
        else:
            report.progress(f"warning: /health answers but the first request failed: {completion.error}")
        report.event(event="ready", url=url, model=record.served_model_name, seconds=round(seconds, 1),
                     first_request={"ok": completion.ok, "tokens": completion.tokens,
                                    "seconds": round(completion.seconds, 3), "error": completion.error})
        if verify:
            checked = verify_served(record, settings, api_key, golden)
            for line in verify_lines(checked):
                report.out(line)
            report.event(event="verify", **checked.to_json())
            if checked.result.status is Status.FAIL:
                # The operator asked for a verified endpoint: a wrong one does not stay up.
                verify_failed.append(checked.result.message)
                report.progress(f"{record.name}: verification failed; stopping it")
                supervisor.request_stop()

    overlay = read_env_file(record.env_file, "launch it again (the launch writes this file)")
    options = SupervisorOptions(echo_engine_log=False, write_engine_log=True, env_overlay=overlay,
                                chip_probe=chip_watch(record, settings),
                                on_stage=on_stage, on_ready=on_ready)
    started = time.monotonic()
    supervisor = Supervisor(record, environ, options)
    supervisor.install_signal_handlers()
    report.progress(f"engine log: {record.engine_log}")
    outcome = supervisor.run()
    _refresh_monitoring(settings, report)
    report.event(event="exit", code=outcome.exit_code, reason=outcome.reason,
                 engine_returncode=outcome.engine_returncode,
                 diagnosis=outcome.diagnosis.to_json() if outcome.diagnosis else None)
    if outcome.reason == "stopped":
        report.progress(f"{record.name} stopped")
        return ExitCode.CHECKS_FAILED if verify_failed else ExitCode.OK
    current = read_status(record)
    for line in _failure_lines(current.exit.diagnosis if current is not None and current.exit is not None else None,
                               outcome.log_tail):
        report.progress(line)
    return outcome.exit_code or ExitCode.CHECKS_FAILED


def _refresh_monitoring(settings: Settings, report: Reporter) -> None:
    """Prometheus' targets follow the launch, where `npuops monitor render` set them up (npuops/monitor/refresh.py)."""
    line = refresh_monitoring(settings.state_dir, socket.gethostname())
    if line:
        report.progress(line)


# --- the service ------------------------------------------------------------------------------------------------

def launch_service(instances: Sequence[InstanceFiles], settings: Settings, manager: SystemdManager, *,
                   api_key: str | None, as_json: bool, notes: Sequence[str], service_user: str,
                   supervisor: str | None = None, verify: bool = False, golden: Path | None = None,
                   origin: LaunchOrigin | None = None) -> ExitCode:
    """Install and start each instance's unit, following it until its endpoint answers. `supervisor`: the npuops
    executable the units run (checked, like vllm and the model, for what the service user can reach). `origin`:
    what the launch was made from, kept as the instance's next revision (`npuops rollout` starts from it)."""
    # The instance (the router, last) first: a refused command reads "npuops launch of 'NAME'".
    with instance_lock(settings.state_dir, [instances[-1].name, *(i.name for i in instances)], "npuops launch"):
        _refuse_live_foreground([i.record for i in instances], settings)
        if origin is not None:
            number = next_revision(settings.state_dir, instances[-1].name)
            instances = [with_revision(i, number) for i in instances]
        code = _launch_service(instances, settings, manager, api_key=api_key, as_json=as_json, notes=notes,
                               service_user=service_user, supervisor=supervisor, verify=verify, golden=golden)
        if origin is not None:
            keep_revision(settings.state_dir, instances[-1].name, number, origin, instances)
        return code


def _launch_service(instances: Sequence[InstanceFiles], settings: Settings, manager: SystemdManager, *,
                    api_key: str | None, as_json: bool, notes: Sequence[str], service_user: str,
                    supervisor: str | None = None, verify: bool = False, golden: Path | None = None) -> ExitCode:
    report = Reporter(as_json)
    records = [i.record for i in instances]
    check_writable(settings.state_dir, [i.name for i in instances], manager.unit_dir)  # before anything is stopped
    find_conflicts(records, list_records(settings.state_dir))
    check_service_user(service_user)
    check_service_access(records, service_user, supervisor, real_systemd=not manager.is_replacement)
    _stop_previous(records, settings, manager, report)
    check_ports_free(records)
    for note in notes:
        report.progress(f"note: {note}")
    results: list[dict[str, Any]] = []
    ok = True
    written = {name: [str(p) for p in paths] for name, paths in install(instances, settings.state_dir,
                                                                          manager).items()}
    for instance in instances:
        report.progress(f"installed {instance.record.unit} ({', '.join(written[instance.name])})")
    _refresh_monitoring(settings, report)
    # The replicas behind a router start together (as systemd starts them at boot), the router once they answer.
    replicas = [i.record for i in instances if i.record.behind]
    started = {r.name: begin_start(r, manager, report) for r in replicas}
    for instance in instances:
        record = instance.record
        starter = started.get(record.name) or begin_start(record, manager, report)
        entry = follow_started(record, starter, manager, report, api_key, written[record.name])
        if verify and entry["ok"]:
            checked = verify_served(record, settings, api_key, golden)
            for line in verify_lines(checked):
                report.out(line)
            entry["verify"] = checked.to_json()
            if checked.result.status is Status.FAIL:
                report.progress(f"{record.name}: verification failed; stopping {record.unit}")
                manager.stop(record.unit, timeout=record.stop_timeout_s + 30)
                entry["ok"] = False
        results.append(entry)
        ok = ok and bool(results[-1]["ok"])
    if as_json:
        print(json.dumps({"ok": ok, "instances": results, "notes": list(notes)}, indent=2))
    return ExitCode.OK if ok else ExitCode.CHECKS_FAILED


@dataclass
class _Starting:
    process: subprocess.Popen[str]
    started_at: float


def begin_start(record: InstanceRecord, manager: SystemdManager, report: Reporter) -> _Starting:
    report.progress(f"[    0 s] {record.name}: starting {record.unit} (start gate, then the "
                    f"{'router' if record.is_router else 'engine'})")
    # Real systemd returns at once (--no-block); the test stand-in blocks until READY, so it runs beside us.
    process = subprocess.Popen(manager.start_command(record.unit), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    return _Starting(process, time.monotonic())


def follow_started(record: InstanceRecord, starting: _Starting, manager: SystemdManager, report: Reporter,
                  api_key: str | None, written: list[str]) -> dict[str, Any]:
    starter, started = starting.process, starting.started_at

    def unit_failed() -> bool:
        if starter.poll() is None:
            return False
        state = manager.state(record.unit)
        # Waiting to be restarted is a failed start as much as "failed" is: say so now, not after the start limit.
        return state.active_state in ("failed", "inactive") or state.sub_state == "auto-restart"

    result = follow_start(
        record, started_at=started, timeout_s=record.timeout_start_s + 90, failed=unit_failed,
        on_stage=lambda stage, detail, elapsed: report.progress(stage_line(record.name, stage, detail, elapsed)))
    try:
        start_output, _ = starter.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        start_output = ""
    entry: dict[str, Any] = {"name": record.name, "unit": record.unit, "url": base_url(record.host, record.port),
                             "model": record.served_model_name, "files": written, "seconds": round(result.seconds, 1)}
    if result.healthy:
        completion = first_completion(entry["url"], record.served_model_name, api_key=api_key)
        entry.update(ok=completion.ok, first_request={"ok": completion.ok, "tokens": completion.tokens,
                                                      "seconds": round(completion.seconds, 3),
                                                      "error": completion.error},
                     prediction=record.prediction)
        if completion.ok and record.behind:
            # Reached through its router: its own port is an internal one.
            report.out(f"{record.name} is serving behind {record.behind} after {result.seconds:.0f} s "
                       f"({entry['url']}, loopback)")
        elif completion.ok:
            for line in _summary(record, result.seconds, completion, api_key):
                report.out(line)
            if record.is_router:
                report.out(f"  replicas   {', '.join(record.replicas)} behind vllm-router; its metrics on "
                           f"127.0.0.1:{record.metrics_port}")
            report.out(f"  manage     `npuops status {record.name}`, `npuops logs {record.name} -f`, "
                       f"`npuops stop {record.name}`")
        else:
            report.progress(f"{record.name}: /health answers but the first request failed: {completion.error}")
        return entry
    tail = manager.recent_log(record.unit, LOG_TAIL_LINES)
    why = {"failed": "the service failed", "timeout": "the engine did not become healthy in time"}[result.reason]
    report.progress(f"{record.name}: {why} after {result.seconds:.0f} s")
    if start_output.strip():
        report.progress(start_output.strip())
    done = result.status.exit if result.status is not None else None
    # The supervisor's diagnosis, unless systemd could not even run it (or gave up restarting it).
    last = done.diagnosis if done is not None else None
    diagnosis = unit_diagnosis(record.unit, manager.state(record.unit), last, tail) or last
    for line in _failure_lines(diagnosis, tail):
        report.progress(line)
    entry.update(ok=False, reason=result.reason, diagnosis=diagnosis.to_json() if diagnosis else None, log_tail=tail)
    return entry
