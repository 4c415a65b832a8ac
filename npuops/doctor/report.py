"""Doctor output: the human table, and the node_exporter textfile (Prometheus, through prometheus_client)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

from npuops.doctor.model import Status
from npuops.doctor.runner import DoctorReport
from npuops.hardware.node import Chip, Node
from npuops.instance.unit_health import UnitHealth
from npuops.textout import wrapped

_MARK = {Status.PASS: "PASS", Status.WARN: "WARN", Status.FAIL: "FAIL", Status.SKIP: "SKIP", Status.ERROR: "ERROR"}


_ID_WIDTH = 28
_LEAD = " " * (2 + 5 + 2)  # continuation lines and fixes, under the check's id: the text keeps the width


def render_report_text(report: DoctorReport, verbose: bool = False) -> str:
    """By area, failures first, each message and fix wrapped to the terminal (at most 100 columns). The checks
    skipped because the node shows no NPU are one line per area; why there is none is said once, on top."""
    lines: list[str] = []
    outcomes = report.sorted_outcomes()
    no_npu = [o for o in outcomes if o.result.status is Status.SKIP and "no_npu" in o.result.evidence]
    if no_npu:
        lines.append(wrapped(f"no NPU on this node ({no_npu[0].result.evidence['no_npu']}): the {len(no_npu)} "
                             f"checks that need one are skipped; {no_npu[0].result.remediation}", ""))
    areas = list(dict.fromkeys(o.area for o in outcomes))
    for area in areas:
        lines.append(f"\n{area}")
        for o in outcomes:
            if o.area != area or o in no_npu:
                continue
            r = o.result
            lines.append(wrapped(r.message, f"  {_MARK[r.status]:<5}  {o.check_id:<{_ID_WIDTH}} ", _LEAD))
            if r.status is not Status.PASS and r.remediation and (r.status is not Status.SKIP or verbose):
                lines.append(wrapped(f"fix: {r.remediation}", _LEAD))
        skipped = [o.check_id for o in no_npu if o.area == area]
        if skipped:
            lines.append(wrapped(f"{', '.join(skipped)}: no NPU", f"  {_MARK[Status.SKIP]:<5}  ", _LEAD))
    counts = report.counts()
    verdict = "OK" if report.ok else "FAILED"
    summary = ", ".join(f"{counts[s.value]} {s.value}" for s in sorted(Status, key=lambda s: s.rank) if counts[s.value])
    lines.append(f"\n{verdict}: {summary} ({len(report.outcomes)} checks in {report.duration_s:.2f} s)")
    return "\n".join(lines).lstrip("\n")


# npuops_check_status values: a gauge per check, so alerts can say `== 2` (fail) without string labels.
STATUS_VALUE = {Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 3, Status.SKIP: -1}
# npu-exporter's health encoding: 1 healthy, 0 not (MindCluster npu-exporter's metric names,
# github.com/Ascend/mind-cluster).
_HEALTHY = {"OK"}
# npu-exporter's per-chip gauges and their labels: the name, its help, the chip's value (None: not reported).
_CHIP_LABELS = ("id", "model_name", "pcie_bus_info")
_CHIP_GAUGES: tuple[tuple[str, str, Callable[[Chip], float | None]], ...] = (
    ("npu_chip_info_health_status", "Chip health: 1 healthy, 0 unhealthy.",
     lambda c: 1 if c.smi.health in _HEALTHY else 0),
    ("npu_chip_info_temperature", "Chip temperature in degrees Celsius.", lambda c: c.smi.temperature_c),
    ("npu_chip_info_power", "Chip power in watts.", lambda c: c.smi.power_w),
    ("npu_chip_info_utilization", "AI Core utilization in percent.", lambda c: c.smi.aicore_percent),
    ("npu_chip_info_hbm_used_memory", "HBM in use, MB.", lambda c: c.smi.hbm_used_mb),
    ("npu_chip_info_hbm_total_memory", "HBM total, MB.", lambda c: c.smi.hbm_total_mb),
)


def _unit_gauges(registry: CollectorRegistry, units: Sequence[UnitHealth]) -> None:
    labels = ("npuops_instance", "npuops_part", "unit")
    limit = Gauge("npuops_unit_start_limit_hit", "1 when systemd stopped restarting the instance's unit (its "
                  "StartLimitBurst= failed starts within StartLimitIntervalSec=).", labels, registry=registry)
    refused = Gauge("npuops_unit_gate_refused", "1 when the start gate refused the unit's last start.", labels,
                    registry=registry)
    for unit in units:
        limit.labels(unit.instance, unit.part, unit.unit).set(1 if unit.start_limit_hit else 0)
        refused.labels(unit.instance, unit.part, unit.unit).set(1 if unit.gate_refused else 0)


def prometheus_registry(report: DoctorReport, node: Node | None, units: Sequence[UnitHealth] = ()
                        ) -> CollectorRegistry:
    """The doctor's metrics: npuops_check_* and npuops_doctor_ok, each systemd-run instance's unit state, and with a
    node npu-exporter's names for the chip quantities (a chip gauge no chip reports is left out)."""
    registry = CollectorRegistry()
    if units:  # a node without systemd-run instances writes no unit gauges
        _unit_gauges(registry, units)
    status = Gauge("npuops_check_status", "Result of an npuops doctor check: 0 pass, 1 warn, 2 fail, 3 error, -1 skip.",
                   ("id", "area", "severity"), registry=registry)
    duration = Gauge("npuops_check_duration_seconds", "Time one doctor check took.", ("id",), registry=registry)
    for o in report.outcomes:
        status.labels(id=o.check_id, area=o.area, severity=o.severity.value).set(STATUS_VALUE[o.result.status])
        duration.labels(id=o.check_id).set(round(o.duration_s, 6))
    Gauge("npuops_doctor_ok", "1 when no check failed.", registry=registry).set(1 if report.ok else 0)
    if node is None:
        return registry
    Gauge("machine_npu_nums", "Number of NPU chips on the node.", registry=registry).set(len(node.chips))
    for name, help_text, value_of in _CHIP_GAUGES:
        values = [(c, v) for c in node.chips if (v := value_of(c)) is not None]
        if not values:
            continue
        gauge = Gauge(name, help_text, _CHIP_LABELS, registry=registry)
        for chip, value in values:
            gauge.labels(id=str(chip.device_id), model_name=chip.smi.name,
                         pcie_bus_info=chip.smi.bus_id).set(float(value))
    return registry


def write_prometheus(path: Path, report: DoctorReport, node: Node | None, units: Sequence[UnitHealth] = ()) -> None:
    """The node_exporter textfile. node_exporter may read it at any moment: write_to_textfile writes a temp file
    beside it (`<path>.<pid>.<thread>`, outside the collector's *.prom glob) and renames it over the target, so a
    scrape sees the old file or the new, never half. The temp file gets open()'s 0666 less the umask; the umask is
    022 for the call, so the file is 0644 (node_exporter reads it as another user) whatever the caller's umask
    (the umask is the process's: this runs after the checks, when nothing else creates files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = os.umask(0o022)
    try:
        write_to_textfile(str(path), prometheus_registry(report, node, units))
    finally:
        os.umask(previous)
