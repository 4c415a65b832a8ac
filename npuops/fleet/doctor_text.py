"""Human output of the fleet doctor: live progress per host, and the fleet table with differences and failures."""

from __future__ import annotations

from npuops.doctor.model import Status
from npuops.fleet.doctor import CLOCK_FAIL_S, CLOCK_WARN_S, FleetDoctorReport, HostDoctor
from npuops.textout import table

FIX_CLOCK = ("sync every host's clock to the same NTP source (chrony or systemd-timesyncd; "
             "`chronyc tracking` shows the offset)")
_MARK = {Status.PASS: "PASS", Status.WARN: "WARN", Status.FAIL: "FAIL", Status.SKIP: "SKIP", Status.ERROR: "ERROR"}


def _value(value: str | None) -> str:
    return "none" if value is None else value


def _hosts(hosts: tuple[str, ...] | list[str]) -> str:
    return ", ".join(hosts)


def _clock_cell(host: HostDoctor) -> str:
    if host.clock is None:
        return "-"
    skew = f"{host.clock.skew_s:+.2f}\u00b1{host.clock.uncertainty_s:.2f}s"
    status = host.clock.status
    return skew if status is Status.PASS else f"{_MARK[status]} {skew}"


def render_fleet_doctor_text(report: FleetDoctorReport) -> str:
    areas = report.areas()
    odd = report.odd_hosts()
    rows = []
    for host in report.sorted_hosts():
        cells = host.area_status()
        rows.append([host.host, host.status, *[_MARK[cells[a]] if a in cells else "-" for a in areas],
                     _clock_cell(host), "yes" if host.host in odd else ""])
    lines = [table(["HOST", "DOCTOR", *[a.upper() for a in areas], "CLOCK", "ODD"], rows, indent="")]

    if report.differences:
        lines.append("\nDifferences between hosts (a multi-node job needs these the same on every host):")
        for d in report.differences:
            if d.has_majority:
                odd_values = "; ".join(f"{_hosts(hosts)} {_value(value)}" for value, hosts in d.values[1:])
                lines.append(f"  {d.what}: {_value(d.majority)} on {len(d.values[0][1])} host(s); odd: {odd_values}")
            else:
                values = "; ".join(f"{_value(value)} on {_hosts(hosts)}" for value, hosts in d.values)
                lines.append(f"  {d.what}: no majority: {values}")

    off = [h for h in report.sorted_hosts() if h.clock is not None and h.clock.status is not Status.PASS]
    if off:
        lines.append(f"\nClocks (warn above {CLOCK_WARN_S:g} s, fail above {CLOCK_FAIL_S:g} s off this controller):")
        for h in off:
            assert h.clock is not None
            lines.append(f"  {_MARK[h.clock.status]} {h.host}: {h.clock.skew_s:+.2f} s "
                         f"(+/- {h.clock.uncertainty_s:.2f} s)")
        lines.append(f"  fix: {FIX_CLOCK}")

    # Failed checks, each once with the hosts it failed on: a fleet often fails the same way everywhere.
    failed: dict[tuple[str, str, str, str], list[str]] = {}
    for host in report.sorted_hosts():
        for check in host.failed_checks():
            key = (str(check.get("status")), str(check.get("id")), str(check.get("message") or ""),
                   str(check.get("remediation") or ""))
            failed.setdefault(key, []).append(host.host)
    if failed:
        reported = sum(1 for h in report.hosts.values() if h.report is not None)
        lines.append("\nFailed checks:")
        for (status, check_id, message, fix), hosts in failed.items():
            where = f"all {reported} hosts" if len(hosts) == reported > 1 else _hosts(hosts)
            lines.append(f"  {status.upper()} {check_id} on {where}: {message}")
            if fix:
                lines.append(f"      fix: {fix}")
    broken = [h for h in report.sorted_hosts() if h.report is None]
    if broken:
        lines.append("\nHosts without a report:")
        for h in broken:
            lines.append(f"  {h.host}: {h.status}: {h.message}")
            if h.fix:
                lines.append(f"      fix: {h.fix}")
    for error in report.errors:
        lines.append(f"ansible: {error}")

    counts: dict[str, int] = {}
    for h in report.hosts.values():
        counts[h.status] = counts.get(h.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    verdict = "OK" if report.ok else "FAILED"
    group = f" of group {report.group}" if report.group else ""
    lines.append(f"\n{verdict}: {len(report.hosts)} host(s){group} at level {report.level} ({summary}); "
                 f"{len(report.differences)} difference(s); clock {report.clock_status.value}")
    if report.artifacts:
        lines.append(f"artifacts: {', '.join(str(a) for a in report.artifacts)}")
    return "\n".join(lines)
