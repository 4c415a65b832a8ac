"""Doctor output: the human table, and the node_exporter textfile (Prometheus) written atomically."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from npuops.atomic import write_text_atomic
from npuops.doctor.model import Status
from npuops.doctor.runner import DoctorReport
from npuops.hardware.node import Chip, Node

_MARK = {Status.PASS: "PASS", Status.WARN: "WARN", Status.FAIL: "FAIL", Status.SKIP: "SKIP", Status.ERROR: "ERROR"}


def render_report_text(report: DoctorReport, verbose: bool = False) -> str:
    lines: list[str] = []
    area = None
    for o in report.sorted_outcomes():
        if o.area != area:
            area = o.area
            lines.append(f"\n{area}")
        r = o.result
        lines.append(f"  {_MARK[r.status]:<5}  {o.check_id:<28} {r.message}")
        if r.status is not Status.PASS and r.remediation and (r.status is not Status.SKIP or verbose):
            lines.append(f"  {'':<5}  {'':<28} fix: {r.remediation}")
    counts = report.counts()
    verdict = "OK" if report.ok else "FAILED"
    summary = ", ".join(f"{counts[s.value]} {s.value}" for s in sorted(Status, key=lambda s: s.rank) if counts[s.value])
    lines.append(f"\n{verdict}: {summary} ({len(report.outcomes)} checks in {report.duration_s:.2f} s)")
    return "\n".join(lines).lstrip("\n")


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


# npuops_check_status values: a gauge per check, so alerts can say `== 2` (fail) without string labels.
STATUS_VALUE = {Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 3, Status.SKIP: -1}
# npu-exporter's health encoding: 1 healthy, 0 not (ascend-facts §7 names; MindCluster npu-exporter).
_HEALTHY = {"OK"}


def render_prometheus(report: DoctorReport, node: Node | None) -> str:
    """A node_exporter textfile: npu-exporter metric names for chip quantities, plus npuops_check_*."""
    out: list[str] = []
    out.append("# HELP npuops_check_status Result of an npuops doctor check: 0 pass, 1 warn, 2 fail, 3 error, -1 skip.")
    out.append("# TYPE npuops_check_status gauge")
    for o in report.outcomes:
        out.append(f'npuops_check_status{{id="{_label(o.check_id)}",area="{_label(o.area)}",'
                   f'severity="{o.severity.value}"}} {STATUS_VALUE[o.result.status]}')
    out.append("# HELP npuops_check_duration_seconds Time one doctor check took.")
    out.append("# TYPE npuops_check_duration_seconds gauge")
    for o in report.outcomes:
        out.append(f'npuops_check_duration_seconds{{id="{_label(o.check_id)}"}} {o.duration_s:.6f}')
    out.append("# HELP npuops_doctor_ok 1 when no check failed.")
    out.append("# TYPE npuops_doctor_ok gauge")
    out.append(f"npuops_doctor_ok {1 if report.ok else 0}")
    if node is not None:
        out.append("# HELP machine_npu_nums Number of NPU chips on the node.")
        out.append("# TYPE machine_npu_nums gauge")
        out.append(f"machine_npu_nums {len(node.chips)}")
        metrics: list[tuple[str, str, Callable[[Chip], float | None]]] = [
            ("npu_chip_info_health_status", "Chip health: 1 healthy, 0 unhealthy.",
             lambda c: 1 if c.smi.health in _HEALTHY else 0),
            ("npu_chip_info_temperature", "Chip temperature in degrees Celsius.", lambda c: c.smi.temperature_c),
            ("npu_chip_info_power", "Chip power in watts.", lambda c: c.smi.power_w),
            ("npu_chip_info_utilization", "AI Core utilization in percent.", lambda c: c.smi.aicore_percent),
            ("npu_chip_info_hbm_used_memory", "HBM in use, MB.", lambda c: c.smi.hbm_used_mb),
            ("npu_chip_info_hbm_total_memory", "HBM total, MB.", lambda c: c.smi.hbm_total_mb),
        ]
        for name, help_text, value_of in metrics:
            samples = [(c, v) for c in node.chips if (v := value_of(c)) is not None]
            if not samples:
                continue
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} gauge")
            for chip, value in samples:
                out.append(f'{name}{{id="{chip.device_id}",model_name="{_label(chip.smi.name)}",'
                           f'pcie_bus_info="{_label(chip.smi.bus_id)}"}} {float(value):g}')
    return "\n".join(out) + "\n"




def write_prometheus(path: Path, text: str) -> None:
    write_text_atomic(path, text, mode=0o644)
