"""Why systemd itself could not run a unit (npuops/data/systemd_exit_statuses.toml), or stopped restarting it.

When the sandbox hides the executable, the user does not exist or a directory cannot be made, the unit's process
never runs: systemd records one of its own exit statuses (200-245, e.g. 203/EXEC) and no supervisor is there to
diagnose anything. And after StartLimitBurst= failed starts systemd stops restarting the unit until someone
re-arms it. Both become a Diagnosis like the supervisor's, for `npuops launch` and `npuops status`. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    """The diagnosis of a unit whose process systemd could not start (its own exit status, of the main process or
    of the start gate's), or None."""
    for code, process, prop in ((state.exit_status, "process", "ExecMainStatus"),
                                (state.start_pre_status, "start gate (ExecStartPre=)", "ExecStartPre status")):
        status = exit_statuses().get(code) if code is not None else None
        if status is None:
            continue
        short = status.name.removeprefix("EXIT_")
        return Diagnosis(f"systemd-{short.lower().replace('_', '-')}",
                         f"systemd could not start {unit}'s {process} ({code}/{short}): {status.cause}",
                         (status.fix or GENERAL_FIX).replace("UNIT", unit).replace("{unit}", unit),
                         f"{prop}={code}", SOURCE, permanent=True)
    return None


# systemd's own message when it refuses a start for the start limit (unit_start_limit_hit(), src/core/unit.c). Its
# Result= says "start-limit-hit" only when the run before ended well: after an automatic restart of a failed run
# (the crash loop the limit is for) systemd 252 keeps that run's result (tests/fixtures/systemd), so the journal is
# what tells.
START_LIMIT_MESSAGE = "Start request repeated too quickly."
# systemd's line at each start attempt ("Starting UNIT - DESCRIPTION..."): a refusal before it is an old one.
_STARTING = "Starting "


def start_limit_hit(state: UnitState, journal: Sequence[str]) -> bool:
    """Whether systemd's last word on a failed unit is that it refuses to start it again: Result=start-limit-hit,
    or the start-limit message after the unit's last start attempt in its journal (`journalctl -u UNIT -o cat`)."""
    if state.result == "start-limit-hit":
        return True
    if state.active_state != "failed":
        return False
    for line in reversed(journal):
        if START_LIMIT_MESSAGE in line:
            return True
        if line.startswith(_STARTING):
            return False
    return False


def start_limit(unit: str, hit: bool, last: Diagnosis | None) -> Diagnosis | None:
    """When systemd gave up restarting the unit: why the starts failed (the last diagnosis) and how to re-arm it."""
    if not hit:
        return None
    rearm = f"then re-arm it: `systemctl reset-failed {unit} && systemctl start {unit}`"
    cause = f"systemd stopped restarting {unit} after {START_LIMIT}"
    if last is not None:
        return Diagnosis("start-limit", f"{cause}; each start failed: {last.cause}", f"{last.fix}; {rearm}",
                         last.line, last.source, permanent=True)
    return Diagnosis("start-limit", cause, f"find why in `npuops logs` and fix it; {rearm}", START_LIMIT_MESSAGE,
                     "systemd.unit(5), StartLimitBurst=", permanent=True)


def unit_diagnosis(unit: str, state: UnitState, last: Diagnosis | None,
                   journal: Sequence[str] = ()) -> Diagnosis | None:
    """What systemd's own state (and its journal: `journal` holds the unit's last lines) says went wrong, given the
    supervisor's last diagnosis: an exec failure (nothing of npuops ran), or the start limit; None when systemd has
    nothing to add."""
    failure = exec_failure(unit, state)
    return start_limit(unit, start_limit_hit(state, journal), failure or last) or failure
