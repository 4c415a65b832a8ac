"""The start gate: `npuops run --preflight NAME`, the unit's ExecStartPre (and the first step of the foreground).

It runs the level-1 doctor checks that matter for this instance (its chips healthy, cool and free, CANN and the
stack present and matching, the environment file right, the host able to hold it) with the instance's own env
file, devices and memory fraction, plus three checks of its own (the engine executable, the model directory, the
port). A failing check of high or critical severity refuses the start, with that check's remediation; anything
else is reported and let through.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from npuops.doctor.context import CheckContext, DoctorOptions
from npuops.doctor.model import CheckOutcome, Result, Severity, Status
from npuops.doctor.registry import discover_checks
from npuops.doctor.runner import run_checks
from npuops.hardware.probe import Probe
from npuops.httpclient import client_host
from npuops.instance.control import port_taken
from npuops.instance.ray import RayState, probe_ray_cluster
from npuops.instance.record import ClusterMembership, InstanceRecord
from npuops.instance.state import SupervisorState
from npuops.settings import Settings

# Level-1 checks about what this instance runs on. Checks that do not apply skip themselves (no NPUs, no CANN).
NPU_GATE_CHECKS = (
    "driver-installed", "npu-smi-runs", "device-nodes", "chip-health", "chip-temperature", "hbm-free",
    "cann-toolkit", "cann-kernels", "nnal-version", "driver-cann-compat",
    "stack-row", "torch-npu-cann", "python-version",
    "ascend-env", "launch-blocking-graph", "alloc-conf", "cpuset-per-npu",
    "shm-size", "free-memory",
)
HOST_GATE_CHECKS = ("shm-size", "free-memory")
BLOCKING_SEVERITIES = (Severity.CRITICAL, Severity.HIGH)
_AREA_ORDER = ("driver", "chips", "cann", "stack", "environment", "host", "launch")


@dataclass(frozen=True)
class GateReport:
    outcomes: tuple[CheckOutcome, ...]
    duration_s: float

    @property
    def blocking(self) -> list[CheckOutcome]:
        """The checks that refuse the start, most fundamental first (a missing driver before a sick chip)."""
        failed = [o for o in self.outcomes if o.result.status is Status.FAIL and o.severity in BLOCKING_SEVERITIES]
        return sorted(failed, key=lambda o: _AREA_ORDER.index(o.area) if o.area in _AREA_ORDER else len(_AREA_ORDER))

    @property
    def warnings(self) -> list[CheckOutcome]:
        blocking = {o.check_id for o in self.blocking}
        return [o for o in self.outcomes if o.check_id not in blocking
                and o.result.status in (Status.FAIL, Status.WARN, Status.ERROR)]

    @property
    def ok(self) -> bool:
        return not self.blocking

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "duration_s": round(self.duration_s, 3),
                "blocking": [o.check_id for o in self.blocking],
                "checks": [o.to_json() for o in self.outcomes]}


def _outcome(check_id: str, title: str, severity: Severity, result: Result, started: float) -> CheckOutcome:
    return CheckOutcome(check_id, title, "launch", 1, severity, result, time.monotonic() - started)


def check_engine_executable(record: InstanceRecord) -> CheckOutcome:
    started = time.monotonic()
    exe = record.vllm_command[0]
    title = "The vLLM executable the instance runs exists and is executable."
    if not os.path.isabs(exe):
        found = any(os.access(os.path.join(d, exe), os.X_OK) for d in os.environ.get("PATH", "").split(":") if d)
        ok = found
    else:
        ok = os.path.isfile(exe) and os.access(exe, os.X_OK)
    if ok:
        return _outcome("engine-executable", title, Severity.CRITICAL, Result.passed(f"{exe} is executable"), started)
    return _outcome("engine-executable", title, Severity.CRITICAL, Result.fail(
        f"the vLLM executable {exe} is missing or not executable",
        "install the serving stack (`npuops provision --tags python`), or re-launch with --vllm PATH",
        executable=exe), started)


def check_model_directory(record: InstanceRecord) -> CheckOutcome:
    started = time.monotonic()
    title = "The model directory holds a Hugging Face config.json."
    model = Path(record.model_path)
    if (model / "config.json").is_file() or (model / "params.json").is_file():
        return _outcome("model-directory", title, Severity.CRITICAL, Result.passed(f"{model} holds config.json"),
                        started)
    what = "does not exist" if not model.exists() else "holds no config.json (or params.json)"
    return _outcome("model-directory", title, Severity.CRITICAL, Result.fail(
        f"the model directory {model} {what}",
        "put the model back (config.json, tokenizer and weights) or re-launch with the right directory",
        model=str(model)), started)


def check_port_free(record: InstanceRecord) -> CheckOutcome:
    started = time.monotonic()
    title = "Nothing else listens on the instance's port."
    host = client_host(record.host)
    # The same bind test launch makes: it is what the engine will do with the port.
    if not port_taken(record.host, record.port):
        return _outcome("port-free", title, Severity.CRITICAL,
                        Result.passed(f"{host}:{record.port} is free"), started)
    return _outcome("port-free", title, Severity.CRITICAL, Result.fail(
        f"another process already listens on {host}:{record.port}",
        f"stop it (`ss -ltnp 'sport = :{record.port}'` shows which) or re-launch with another --port",
        port=record.port), started)


# How long the start gate of a Ray head's engine waits for every node to join before refusing: a worker
# booting a little later than the head is normal.
RAY_JOIN_WAIT_S = 120.0
_RAY_POLL_S = 3.0


def check_ray_cluster(record: InstanceRecord, *, wait_s: float = RAY_JOIN_WAIT_S,
                      probe: Callable[[ClusterMembership], RayState] = probe_ray_cluster) -> CheckOutcome:
    """A Ray head's engine starts only once every host of the group has a live Ray node: vLLM would otherwise
    wait for its placement group and then fail with a resource error that names no host."""
    started = time.monotonic()
    title = "Every host of the group has joined the Ray cluster."
    cluster = record.ray_cluster
    assert cluster is not None, "run_gate asks only a Ray instance's cluster"
    while True:
        state = probe(cluster)
        if state.complete or time.monotonic() - started >= wait_s:
            break
        time.sleep(_RAY_POLL_S)
    if state.complete:
        return _outcome("ray-cluster", title, Severity.CRITICAL, Result.passed(
            f"{state.nodes}/{state.expected} Ray nodes alive ({', '.join(state.alive)})"), started)
    missing = ", ".join(state.missing + state.short) or "?"
    ray_unit = record.ray_unit or "the Ray unit"
    return _outcome("ray-cluster", title, Severity.CRITICAL, Result.fail(
        (f"the Ray cluster cannot be asked: {state.error}" if state.error else
         f"after {wait_s:.0f} s, no live Ray node on {', '.join(state.missing)}" if state.missing
         else f"the Ray nodes of {missing} offer less than {dict(cluster.ray_resources)}"),
        f"on each of {missing}: `systemctl status {ray_unit}` and `journalctl -u {ray_unit}`; check that it reaches "
        f"{cluster.ray_address} (`npuops doctor -i INVENTORY --group {cluster.group}` "
        "checks the network between the hosts)", missing=list(state.missing), address=state.address),
        started)


def gate_settings(settings: Settings, record: InstanceRecord) -> Settings:
    """The stack checks look at the interpreter beside the instance's vllm, not at npuops' own."""
    exe = record.vllm_command[0]
    python = Path(exe).parent / "python"
    if os.path.isabs(exe) and python.exists():
        return replace(settings, stack_python=str(python))
    return settings


def run_gate(record: InstanceRecord, settings: Settings) -> GateReport:
    started = time.monotonic()
    wanted = NPU_GATE_CHECKS if record.target_kind == "npu" else HOST_GATE_CHECKS
    checks = [c for c in discover_checks() if c.id in wanted]
    options = DoctorOptions(
        env_file=record.env_file if record.env_file.exists() else None,
        model_dir=Path(record.model_path),
        devices=record.devices or None,
        gpu_memory_utilization=record.gpu_memory_utilization,
        graph_mode=record.graph_mode,
    )
    context = CheckContext(Probe(gate_settings(settings, record)), options)
    report = run_checks(checks, context)
    own: tuple[CheckOutcome, ...] = (check_engine_executable(record), check_model_directory(record))
    if record.serves_api:
        own += (check_port_free(record),)
    if record.ray_cluster is not None and record.runs_engine:
        own += (check_ray_cluster(record),)
    return GateReport(own + report.outcomes, time.monotonic() - started)


def render_gate_text(report: GateReport, name: str) -> str:
    lines = []
    for outcome in report.blocking:
        lines.append(f"refused [{outcome.check_id}] {outcome.result.message}")
        lines.append(f"  fix: {outcome.result.remediation}")
    for outcome in report.warnings:
        lines.append(f"{outcome.result.status.value} [{outcome.check_id}] {outcome.result.message}")
    passed = sum(1 for o in report.outcomes if o.result.status is Status.PASS)
    skipped = sum(1 for o in report.outcomes if o.result.status is Status.SKIP)
    verdict = "refuses to start" if report.blocking else "lets it start"
    lines.append(f"start gate for {name}: {passed} passed, {skipped} skipped, {len(report.warnings)} warning(s), "
                 f"{len(report.blocking)} blocking: {verdict} ({report.duration_s:.1f} s)")
    return "\n".join(lines)


def refusal_status(report: GateReport, name: str) -> SupervisorState:
    """What the status file says after a refused start, so `npuops status` can name the check and its fix."""
    return SupervisorState.refused(name, [(o.check_id, o.result.message, o.result.remediation or "")
                                          for o in report.blocking])
