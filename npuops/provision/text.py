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


def _port(values: dict[str, Any]) -> str:
    if not values.get("address"):
        return "none"
    text = f"{values['address']}/{values.get('netmask') or '?'}"
    if values.get("gateway"):
        text += f" gw {values['gateway']}"
    return text + f" detect {values.get('detect') or '-'}"


def npu_network_lines(host: str, network: dict[str, Any]) -> list[str]:
    """The ports a run set (or would set), one line each: before -> after."""
    verb = "would set" if network.get("check") else "set"
    return [f"{host}: NPU {p['device']} {verb} {_port(p['before'])} -> {_port(p['after'])}"
            for p in network.get("ports", []) if p.get("changed")]


def render_report_text(report: Any, waived_hardware_check: bool = False) -> str:
    data = report.to_json()
    rows = [(name, h["status"], h["ok"], h["changed"], h["failed"], h["skipped"], _versions(h["versions"]))
            for name, h in data["hosts"].items()]
    lines = [table(["HOST", "STATUS", "OK", "CHANGED", "FAILED", "SKIPPED", "VERSIONS"], rows, indent="")]
    for name, h in data["hosts"].items():
        for pending in h.get("would_run", []):
            lines.append(f"{name}: would run {pending}")
        if isinstance(h.get("npu_network"), dict):
            lines.extend(npu_network_lines(name, h["npu_network"]))
        if h["message"]:
            lines.append(f"{name}: {h['message']}")
        timer = h.get("doctor_timer")
        if isinstance(timer, dict) and not timer.get("installed") and timer.get("why"):
            lines.append(f"{name}: npuops-doctor.timer not installed: {timer['why']}")
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
