"""The unit states the doctor's textfile carries for the alerts NpuopsStartLimitHit and NpuopsGateRefusing
(npuops/instance/unit_health.py), from systemd's Result= and the supervisor's last state."""

from __future__ import annotations

from pathlib import Path

from npuops.instance.manager import UnitState
from npuops.instance.record import MANAGER_FOREGROUND, write_status
from npuops.instance.state import SupervisorState
from npuops.instance.unit_health import UnitHealth, unit_health
from tests.support.instance_records import make_record


class Units:
    """What `systemctl show` answers for each unit (the parser of its output: tests/service)."""

    def __init__(self, states: dict[str, tuple[str, str]]) -> None:
        self.states = states

    def state(self, unit: str) -> UnitState:
        active, result = self.states[unit]
        return UnitState(active, "dead" if active != "active" else "running", None, "", 0, result, "enabled",
                         "loaded")


def test_a_unit_systemd_gave_up_on_and_one_the_gate_refuses(tmp_path: Path) -> None:
    gave_up = make_record(tmp_path, "a", behind="m")
    refused = make_record(tmp_path, "b")
    serving = make_record(tmp_path, "c")
    terminal = make_record(tmp_path, "d", manager=MANAGER_FOREGROUND)
    for record in (gave_up, refused, serving):
        Path(record.status_file).parent.mkdir(parents=True, exist_ok=True)
    write_status(refused, SupervisorState.refused("b", [("gate-npu", "no chip 3", "check npu-smi")]))
    write_status(serving, SupervisorState.refused("c", [("gate-npu", "no chip 3", "check npu-smi")]))
    units = Units({"npuops-a.service": ("failed", "start-limit-hit"), "npuops-b.service": ("failed", "exit-code"),
                   "npuops-c.service": ("active", "success")})
    found = unit_health([serving, refused, gave_up, terminal], units)  # type: ignore[arg-type]
    assert found == [
        UnitHealth("m", "a", "npuops-a.service", start_limit_hit=True, gate_refused=False),
        UnitHealth("b", "b", "npuops-b.service", start_limit_hit=False, gate_refused=True),
        # Running again since (the refusal is the state of a start before): not refused now.
        UnitHealth("c", "c", "npuops-c.service", start_limit_hit=False, gate_refused=False),
    ]
