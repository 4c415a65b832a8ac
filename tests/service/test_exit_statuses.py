"""systemd's own verdicts on a unit, read from real `systemctl show` and journal output of systemd 252
(tests/fixtures/systemd/SOURCE.md): exec failures of the main process and of the start gate, the start limit."""

from __future__ import annotations

from npuops.instance.exit_statuses import exec_failure, exit_statuses, start_limit_hit, unit_diagnosis
from npuops.instance.manager import parse_show
from npuops.instance.state import Diagnosis
from tests.support.paths import FIXTURES

SYSTEMD = FIXTURES / "systemd"
UNIT = "npuops-sd.service"


def show(name: str):  # type: ignore[no-untyped-def]
    return parse_show((SYSTEMD / f"show-{name}.txt").read_text(encoding="utf-8"))


def journal(name: str) -> list[str]:
    return (SYSTEMD / f"journal-{name}.txt").read_text(encoding="utf-8").splitlines()


def test_the_table_holds_systemds_own_statuses_each_with_a_cause() -> None:
    table = exit_statuses()
    assert {203, 217, 226} <= set(table) and all(200 <= code <= 245 for code in table)
    assert table[203].name == "EXIT_EXEC" and table[217].name == "EXIT_USER"
    assert all(status.cause for status in table.values())


def test_a_main_process_that_could_not_be_executed_is_203_exec() -> None:
    state = show("start-limit-after-203")
    assert state.exit_status == 203 and state.start_pre_status is None
    diagnosis = exec_failure(UNIT, state)
    assert diagnosis is not None and diagnosis.id == "systemd-exec" and diagnosis.permanent
    assert "203/EXEC" in diagnosis.cause and "ProtectHome" in diagnosis.fix


def test_a_start_gate_that_could_not_run_as_the_user_is_217_user() -> None:
    state = show("auto-restart-after-217")
    assert state.exit_status is None and state.start_pre_status == 217
    diagnosis = exec_failure("npuops-p1.service", state)
    assert diagnosis is not None and diagnosis.id == "systemd-user"
    assert "start gate" in diagnosis.cause and "useradd" in diagnosis.fix


def test_the_gates_own_refusal_is_not_a_systemd_failure() -> None:
    """Status 1 is the gate refusing (its own diagnosis says why), not systemd failing to run it."""
    state = show("auto-restart-after-gate-refusal")
    assert state.start_pre_status == 1 and state.sub_state == "auto-restart"
    assert exec_failure("npuops-busy.service", state) is None


def test_the_start_limit_is_read_from_the_journal_when_result_keeps_the_last_failure() -> None:
    state = show("start-limit-after-203")
    assert state.result == "exit-code" and state.active_state == "failed"
    assert start_limit_hit(state, journal("start-limit-after-203"))
    diagnosis = unit_diagnosis(UNIT, state, None, journal("start-limit-after-203"))
    assert diagnosis is not None and diagnosis.id == "start-limit"
    # Why each start failed (systemd's exit status) and how to re-arm it.
    assert "203/EXEC" in diagnosis.cause
    assert f"systemctl reset-failed {UNIT} && systemctl start {UNIT}" in diagnosis.fix


def test_a_unit_waiting_to_be_restarted_has_not_hit_the_limit() -> None:
    state = show("auto-restart-after-217")
    assert not start_limit_hit(state, journal("auto-restart-after-217"))
    diagnosis = unit_diagnosis("npuops-p1.service", state, None, journal("auto-restart-after-217"))
    assert diagnosis is not None and diagnosis.id == "systemd-user"


def test_a_refusal_before_the_last_start_attempt_is_an_old_one() -> None:
    """After `systemctl reset-failed` and a new start that fails otherwise, the old refusal no longer counts."""
    state = show("start-limit-after-203")
    later = [*journal("start-limit-after-203"), "Starting npuops-sd.service - vLLM sd serving tiny-llama (npuops)...",
             "npuops-sd.service: Main process exited, code=exited, status=1/FAILURE"]
    assert not start_limit_hit(state, later)


def test_result_start_limit_hit_needs_no_journal() -> None:
    """After a run that ended well (manual restarts in a row), systemd does set Result=start-limit-hit."""
    state = parse_show("ActiveState=failed\nSubState=failed\nResult=start-limit-hit\n")
    last = Diagnosis("engine-exited", "the engine exited", "read the log", "", "npuops")
    diagnosis = unit_diagnosis(UNIT, state, last, [])
    assert diagnosis is not None and diagnosis.id == "start-limit" and "the engine exited" in diagnosis.cause
