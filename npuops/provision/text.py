"""Human output of a provisioning run: live progress per host and task, and the final per-host table."""

from __future__ import annotations

from typing import Any

from npuops.textout import table


def _versions(versions: dict[str, Any]) -> str:
    parts = []
    for component, pair in versions.items():
        if not isinstance(pair, dict) or component == "python_stack":
            continue
        before, after = pair.get("before"), pair.get("after")
        if before == after:
            parts.append(f"{component} {after or '-'}")
        else:
            parts.append(f"{component} {before or '-'} -> {after or '-'}")
    return ", ".join(parts) or "-"


def render_report_text(report: Any, waived_hardware_check: bool = False) -> str:
    data = report.to_json()
    rows = [(name, h["status"], h["ok"], h["changed"], h["failed"], h["skipped"], _versions(h["versions"]))
            for name, h in data["hosts"].items()]
    lines = [table(["HOST", "STATUS", "OK", "CHANGED", "FAILED", "SKIPPED", "VERSIONS"], rows, indent="")]
    for name, h in data["hosts"].items():
        for pending in h.get("would_run", []):
            lines.append(f"{name}: would run {pending}")
        if h["message"]:
            lines.append(f"{name}: {h['message']}")
        doctor = h.get("doctor")
        if isinstance(doctor, dict) and doctor.get("failed"):
            lines.append(f"{name}: doctor --level 1 failed checks: {', '.join(doctor['failed'])}")
    if data["check"]:
        lines.append("check mode: nothing was changed; 'changed' counts what would change")
    if waived_hardware_check:
        lines.append("note: --no-hardware-check waived the preflight check for NPUs on the PCI bus")
    for error in data["errors"]:
        lines.append(f"ansible: {error}")
    verdict = "converged" if data["ok"] else "NOT converged"
    lines.append(f"{verdict}: {len(rows)} host(s) in {data['duration_s']} s; artifacts in {data['artifacts']}")
    return "\n".join(lines)
