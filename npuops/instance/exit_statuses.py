"""Why systemd itself could not run a unit (npuops/data/systemd_exit_statuses.toml), or stopped restarting it.

When the sandbox hides the executable, the user does not exist or a directory cannot be made, the unit's process
never runs: systemd records one of its own exit statuses (200-245, e.g. 203/EXEC) and no supervisor is there to
diagnose anything. And after StartLimitBurst= failed starts systemd stops restarting the unit until someone
re-arms it. Both become a Diagnosis like the supervisor's, for `npuops launch` and `npuops status`. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from npuops.datafiles import load_data_toml
from npuops.instance.manager import UnitState
from npuops.instance.state import Diagnosis

SOURCE = "systemd.exec(5), PROCESS EXIT CODES"
GENERAL_FIX = "`journalctl -u {unit}` has systemd's own message, naming what failed"
# What the units say (templates/vllm.service.j2): StartLimitBurst=5 within StartLimitIntervalSec=900.
START_LIMIT = "5 failed starts within 15 minutes (StartLimitBurst=5, StartLimitIntervalSec=900)"


@dataclass(frozen=True)
class ExitStatus:
    code: int
    name: str
    cause: str
    fix: str | None


@lru_cache(maxsize=1)
def exit_statuses() -> dict[int, ExitStatus]:
    return {int(raw["code"]): ExitStatus(int(raw["code"]), str(raw["name"]), str(raw["cause"]),
                                         str(raw["fix"]) if "fix" in raw else None)
            for raw in load_data_toml("systemd_exit_statuses.toml")["status"]}


def exec_failure(unit: str, state: UnitState) -> Diagnosis | None:
    """The diagnosis of a unit whose process systemd could not start (its own exit status), or None."""
    status = exit_statuses().get(state.exit_status) if state.exit_status is not None else None
    if status is None:
        return None
    short = status.name.removeprefix("EXIT_")
    return Diagnosis(f"systemd-{short.lower().replace('_', '-')}",
                     f"systemd could not start {unit}'s process ({state.exit_status}/{short}): {status.cause}",
                     (status.fix or GENERAL_FIX).replace("UNIT", unit).replace("{unit}", unit),
                     f"ExecMainStatus={state.exit_status}", SOURCE, permanent=True)


def start_limit(unit: str, state: UnitState, last: Diagnosis | None) -> Diagnosis | None:
    """When systemd gave up restarting the unit: why the starts failed (the last diagnosis) and how to re-arm it."""
    if state.result != "start-limit-hit":
        return None
    rearm = f"then re-arm it: `systemctl reset-failed {unit} && systemctl start {unit}`"
    cause = f"systemd stopped restarting {unit} after {START_LIMIT}"
    if last is not None:
        return Diagnosis("start-limit", f"{cause}; each start failed: {last.cause}", f"{last.fix}; {rearm}",
                         last.line, last.source, permanent=True)
    return Diagnosis("start-limit", cause, f"find why in `npuops logs` and fix it; {rearm}", "Result=start-limit-hit",
                     "systemd.unit(5), StartLimitBurst=", permanent=True)


def unit_diagnosis(unit: str, state: UnitState, last: Diagnosis | None) -> Diagnosis | None:
    """What systemd's own state says went wrong, given the supervisor's last diagnosis: an exec failure (nothing
    of npuops ran), or the start limit; None when systemd has nothing to add."""
    failure = exec_failure(unit, state)
    return start_limit(unit, state, failure or last) or failure
