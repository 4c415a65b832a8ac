"""What Prometheus cannot see from an engine's /metrics: systemd gave up restarting a unit (its start limit), or
the start gate refuses to start it. A unit in either state serves nothing and answers no scrape, so `up == 0` says
only that it is down; these say why, for the doctor's textfile (npuops/doctor/report.py) and the alerts on it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from npuops.instance.manager import SystemdManager
from npuops.instance.record import MANAGER_SYSTEMD, InstanceRecord, read_status
from npuops.instance.state import EXIT_GATE_REFUSED

START_LIMIT_HIT = "start-limit-hit"  # systemd's Result= when StartLimitBurst= starts failed within the interval


@dataclass(frozen=True)
class UnitHealth:
    instance: str  # what the operator launched (a replica's router)
    part: str
    unit: str
    start_limit_hit: bool
    gate_refused: bool


def unit_health(records: Sequence[InstanceRecord], manager: SystemdManager) -> list[UnitHealth]:
    """Each systemd-run engine's state on this node: a unit systemd gave up on, and one whose last start the gate
    refused (the supervisor's status file says so while the unit is not running)."""
    found = []
    for record in sorted(records, key=lambda r: r.name):
        if record.manager != MANAGER_SYSTEMD or not record.unit:
            continue
        state = manager.state(record.unit)
        supervisor = read_status(record)
        refused = (state.active_state != "active" and supervisor is not None and supervisor.exit is not None
                   and supervisor.exit.reason == EXIT_GATE_REFUSED)
        found.append(UnitHealth(record.behind or record.name, record.name, record.unit,
                                state.result == START_LIMIT_HIT, refused))
    return found
