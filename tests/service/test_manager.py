"""SystemdManager: parsing `systemctl show`, the commands it builds, and a real docker-systemctl-replacement run."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from npuops.errors import EnvironmentMissingError, NpuopsError
from npuops.instance.control import pid_alive
from npuops.instance.manager import SystemdManager, UnitState, parse_show

SYSTEMCTL3 = Path(sys.executable).parent / "systemctl3.py"
UNIT = "npuops-test-sleep.service"
UNIT_TEXT = """\
[Unit]
Description=npuops manager test

[Service]
Type=simple
ExecStart=/bin/sh -c "echo hello-from-the-unit; exec /bin/sleep 300"

[Install]
WantedBy=multi-user.target
"""


# --- parse_show ---------------------------------------------------------------------------------------------------

def test_parse_show_of_a_running_unit() -> None:
    text = ("ActiveState=active\nSubState=running\nMainPID=4242\nActiveEnterTimestamp=Sat 2026-11-29 11:43:34 UTC\n"
            "NRestarts=3\nResult=success\nUnitFileState=enabled\nLoadState=loaded\n")
    assert parse_show(text) == UnitState("active", "running", 4242, "Sat 2026-11-29 11:43:34 UTC", 3, "success",
                                         "enabled", "loaded")


def test_parse_show_of_a_stopped_unit() -> None:
    state = parse_show("ActiveState=inactive\nSubState=dead\nMainPID=0\nActiveEnterTimestamp=\nNRestarts=0\n")
    assert state.active_state == "inactive"
    assert state.main_pid is None
    assert state.since == ""
    assert state.restarts == 0


@pytest.mark.parametrize("text", ["", "garbage without equals\n", "ActiveState=\nSubState=\nMainPID=\nNRestarts=x\n"])
def test_parse_show_of_nothing_useful_is_unknown(text: str) -> None:
    state = parse_show(text)
    assert (state.active_state, state.sub_state) == ("unknown", "unknown")
    assert state.main_pid is None and state.restarts is None


def test_parse_show_keeps_equals_signs_in_values() -> None:
    assert parse_show("Result=exit-code=1\n").result == "exit-code=1"


def test_unit_state_to_json() -> None:
    state = parse_show("ActiveState=failed\nSubState=failed\nMainPID=0\nNRestarts=5\nResult=exit-code\n"
                       "ExecMainCode=1\nExecMainStatus=203\n")
    assert state.to_json() == {"active_state": "failed", "sub_state": "failed", "main_pid": None, "since": "",
                               "restarts": 5, "result": "exit-code", "enabled": "", "loaded": "", "exit_status": 203,
                               "start_pre_status": None}
    # A main process a signal ended (ExecMainCode=2, CLD_KILLED) has no exit status: ExecMainStatus is the signal.
    killed = parse_show("ActiveState=failed\nResult=signal\nExecMainCode=2\nExecMainStatus=9\n")
    assert killed.exit_status is None and killed.result == "signal"


# --- commands -----------------------------------------------------------------------------------------------------

def test_is_replacement(tmp_path: Path) -> None:
    assert SystemdManager(["/x/systemctl3.py", "--root=/r"], tmp_path).is_replacement
    assert SystemdManager(["systemctl3.py"], tmp_path).is_replacement
    assert not SystemdManager(["systemctl"], tmp_path).is_replacement
    assert not SystemdManager(["/usr/bin/systemctl"], tmp_path).is_replacement


def test_log_command_of_systemd(tmp_path: Path) -> None:
    manager = SystemdManager(["systemctl"], tmp_path)
    assert manager.log_command("u.service", 50, follow=False) == [
        "journalctl", "--unit", "u.service", "--lines", "50", "--no-pager", "--output", "cat"]
    follow = manager.log_command("u.service", 10, follow=True)
    assert follow[:5] == ["journalctl", "--unit", "u.service", "--lines", "10"]
    assert follow[-1] == "--follow"


def test_log_command_of_the_replacement(tmp_path: Path) -> None:
    manager = SystemdManager(["/x/systemctl3.py", "--root=/r"], tmp_path)
    assert manager.log_command("u.service", 20, follow=True) == [
        "/x/systemctl3.py", "--root=/r", "log", "u.service", "-n", "20", "-f"]
    assert manager.log_command("u.service", 20, follow=False) == [
        "/x/systemctl3.py", "--root=/r", "log", "u.service", "-n", "20", "--no-pager"]


def test_start_command_does_not_block(tmp_path: Path) -> None:
    assert SystemdManager(["systemctl"], tmp_path).start_command("u.service") == [
        "systemctl", "start", "--no-block", "u.service"]


def test_unavailable_reason(tmp_path: Path) -> None:
    missing = SystemdManager(["systemctl"], tmp_path, run_dir=tmp_path / "run" / "systemd" / "system")
    reason = missing.unavailable_reason()
    assert reason is not None and "not running as init" in reason
    run_dir = tmp_path / "booted"
    run_dir.mkdir()
    assert SystemdManager(["systemctl"], tmp_path, run_dir=run_dir).unavailable_reason() is None
    # The replacement needs no booted systemd.
    assert SystemdManager([str(SYSTEMCTL3)], tmp_path, run_dir=tmp_path / "nope").unavailable_reason() is None


# --- a systemctl that is missing, failing or hanging --------------------------------------------------------------

def test_missing_systemctl_is_an_environment_error(tmp_path: Path) -> None:
    manager = SystemdManager([str(tmp_path / "no-such-systemctl")], tmp_path / "units")
    with pytest.raises(EnvironmentMissingError, match=r"cannot run .*no-such-systemctl") as state_error:
        manager.state(UNIT)
    assert "--foreground" in state_error.value.fix
    with pytest.raises(EnvironmentMissingError):
        manager.install_unit(UNIT, UNIT_TEXT)
    with pytest.raises(EnvironmentMissingError):
        manager.enable(UNIT)
    # The log reader never raises.
    assert SystemdManager([str(tmp_path / "systemctl3.py")], tmp_path).recent_log(UNIT) == []


def test_failing_show_is_an_unknown_state(tmp_path: Path) -> None:
    assert SystemdManager(["/bin/false"], tmp_path).state(UNIT).active_state == "unknown"


def test_hanging_systemctl_times_out_to_an_unknown_state(tmp_path: Path) -> None:
    """A question to systemctl is bounded by the command timeout (setting command_timeout_s), and the answer says
    that systemctl did not answer: a hung systemctl is not a stopped unit."""
    from npuops.instance.manager import NO_ANSWER, service_manager
    from npuops.instance.status import summarize
    from npuops.settings import Settings
    from tests.support.instance_records import make_record

    manager = SystemdManager(["/bin/sh", "-c", "exec sleep 30", "sh"], tmp_path, query_timeout_s=0.2)
    state = manager.state(UNIT)
    assert state.active_state == "unknown" and state.sub_state == NO_ANSWER
    assert summarize(make_record(tmp_path), state, None, False) == (
        "unknown (systemctl did not answer within the command timeout)")
    settings = Settings(command_timeout_s=2.5, systemctl="/bin/true")
    assert service_manager(settings).query_timeout_s == 2.5


# --- docker-systemctl-replacement, for real -----------------------------------------------------------------------

@pytest.fixture
def replacement(tmp_path: Path) -> Iterator[SystemdManager]:
    assert SYSTEMCTL3.is_file(), f"{SYSTEMCTL3} is missing (docker-systemctl-replacement is a test dependency)"
    # systemctl3.py refuses a --root with fewer than three path components; tmp_path has more.
    root = tmp_path / "sysroot"
    assert len(root.parts) > 4
    manager = SystemdManager([str(SYSTEMCTL3), f"--root={root}"], root / "etc" / "systemd" / "system",
                             run_dir=tmp_path / "no-systemd", timeout_s=30)
    yield manager
    # Whatever happens in the test, no sleep is left behind.
    pid = manager.state(UNIT).main_pid
    if pid_alive(pid):
        assert pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait_state(manager: SystemdManager, wanted: str, timeout_s: float = 15.0) -> UnitState:
    deadline = time.monotonic() + timeout_s
    state = manager.state(UNIT)
    while state.active_state != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
        state = manager.state(UNIT)
    return state


def test_unit_lifecycle_with_the_replacement(replacement: SystemdManager) -> None:
    manager = replacement
    assert manager.is_replacement and manager.unavailable_reason() is None
    path = manager.install_unit(UNIT, UNIT_TEXT)
    assert path == manager.unit_dir / UNIT
    assert path.read_text(encoding="utf-8") == UNIT_TEXT
    assert (path.stat().st_mode & 0o777) == 0o644
    assert manager.state(UNIT).loaded == "loaded"

    manager.enable(UNIT)
    assert manager.state(UNIT).enabled == "enabled"

    manager.start(UNIT)
    running = _wait_state(manager, "active")
    assert running.active_state == "active"
    assert running.main_pid is not None and pid_alive(running.main_pid)
    cmdline = Path(f"/proc/{running.main_pid}/cmdline").read_bytes().split(b"\0")
    assert b"/bin/sleep" in cmdline

    deadline = time.monotonic() + 10
    while "hello-from-the-unit" not in manager.recent_log(UNIT) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "hello-from-the-unit" in manager.recent_log(UNIT, lines=5)

    manager.stop(UNIT)
    stopped = _wait_state(manager, "inactive")
    assert stopped.active_state == "inactive"
    assert stopped.main_pid is None
    deadline = time.monotonic() + 10
    while pid_alive(running.main_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(running.main_pid)

    manager.remove_unit(UNIT)
    assert not path.exists()


def test_a_refused_command_is_an_expected_error(replacement: SystemdManager) -> None:
    # `systemctl enable` of a unit that does not exist fails (rc 1, "Unit ... not found"): an environment problem
    # the CLI should print as one line, not an internal error with a traceback (npuops/errors.py).
    with pytest.raises(NpuopsError, match="not found"):
        replacement.enable("npuops-no-such-unit.service")
