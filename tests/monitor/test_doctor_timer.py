"""npuops-doctor.service and .timer (npuops/monitor/doctor_timer.py): what they run, read back by systemd's own
unit-file rules (tests/support/unit_syntax.py, checked against the real systemd in tests/systemd/test_quoting.py),
hostile paths refused or written whole, and the command's refusals. The timer installed and run under real systemd
by provisioning: tests/provision/test_provision_reboot.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.errors import BadInputError
from npuops.monitor.doctor_timer import SERVICE_UNIT, TEXTFILE_NAME, TIMER_UNIT, DoctorTimer, render_doctor_units
from tests.support.npuops_cli import npuops_argv
from tests.support.unit_syntax import parse_unit, split_command_line

PIECES = ["\n", "\r", "\x00", "\t", "\x7f", "%", "%n", "%%", "$", "${HOME}", "$(id)", "`id`", '"', "'", "\\", ";",
          " ", "=", "#", "[Service]", "\nExecStartPre=+/bin/sh -c id", "\nUser=root", "é", "\u2028", "a"]
HOSTILE = st.one_of(st.text(max_size=40), st.lists(st.sampled_from(PIECES), max_size=10).map("".join),
                    st.binary(max_size=20).map(os.fsdecode))
UNSAFE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
BENIGN = DoctorTimer("/opt/npuops/venv/bin/npuops", Path("/var/lib/prometheus/node-exporter"))


def _settings(text: str) -> dict[tuple[str, str], str]:
    return {(section, key): value for section, key, value in parse_unit(text)}


def test_the_service_runs_the_doctor_into_the_textfile_and_the_timer_repeats_it() -> None:
    units = render_doctor_units(DoctorTimer("/opt/npuops/venv/bin/npuops", Path("/srv/textfiles"), interval_s=120,
                                            level=2, ascend_root=Path("/opt/Ascend")))
    service, timer = _settings(units[SERVICE_UNIT]), _settings(units[TIMER_UNIT])
    assert split_command_line(service[("Service", "ExecStart")]) == [
        "/opt/npuops/venv/bin/npuops", "--ascend-root", "/opt/Ascend", "doctor", "--level", "2", "--prometheus",
        f"/srv/textfiles/{TEXTFILE_NAME}"]
    assert service[("Service", "Type")] == "oneshot" and service[("Service", "SuccessExitStatus")] == "1"
    assert service[("Service", "ReadWritePaths")] == "/srv/textfiles"
    assert service[("Service", "ProtectSystem")] == "strict" and service[("Service", "NoNewPrivileges")] == "yes"
    assert timer[("Timer", "OnUnitActiveSec")] == "120" and timer[("Install", "WantedBy")] == "timers.target"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(executable=HOSTILE, root=HOSTILE, directory=HOSTILE)
def test_hostile_paths_are_refused_or_run_whole(executable: str, root: str, directory: str) -> None:
    try:
        timer = DoctorTimer("/opt/" + executable, Path("/var/" + directory), ascend_root=Path("/x/" + root))
        units = render_doctor_units(timer)
    except BadInputError as exc:
        assert "\n" not in exc.one_line()
        textfile_dir = "/var/" + directory
        assert (UNSAFE.search(executable + root + directory)
                or any(c in textfile_dir for c in " \t\"'\\%$")), exc.one_line()
        return
    service = _settings(units[SERVICE_UNIT])
    assert set(service) == set(_settings(render_doctor_units(BENIGN)[SERVICE_UNIT]))
    assert split_command_line(service[("Service", "ExecStart")]) == timer.exec_start()


@pytest.mark.parametrize(("interval", "directory", "problem"), [
    (30, "/var/lib/x", "--interval 30 is out of range"),
    (3600, "/var/lib/x", "--interval 3600 is out of range"),
    (300, "textfiles", "--textfile-dir textfiles is not an absolute path"),
])
def test_bad_choices_are_one_line(interval: int, directory: str, problem: str) -> None:
    with pytest.raises(BadInputError, match=re.escape(problem)):
        DoctorTimer("/usr/bin/npuops", Path(directory), interval_s=interval)


def test_the_command_prints_the_units_or_says_why_it_cannot_install_them(tmp_path: Path) -> None:
    env = {**os.environ, "NPUOPS_STATE_DIR": str(tmp_path / "state")}

    def npuops(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(npuops_argv(*args), capture_output=True, text=True, env=env, timeout=120, check=False)

    done = npuops("monitor", "doctor-timer", "--dry-run", "--json", "--textfile-dir", str(tmp_path / "tf"))
    assert done.returncode == 0, done.stderr
    units = json.loads(done.stdout)["units"]
    assert set(units) == {SERVICE_UNIT, TIMER_UNIT} and str(tmp_path / "tf" / TEXTFILE_NAME) in units[SERVICE_UNIT]
    # This machine's init is not systemd (tests/systemd boots one in a namespace): said in one line, exit 4.
    refused = npuops("monitor", "doctor-timer", "--textfile-dir", str(tmp_path / "tf"))
    assert refused.returncode == 4 and refused.stderr.count("\n") == 1, refused.stderr
    assert "systemd is not running as init" in refused.stderr and "--dry-run" in refused.stderr
    bad = npuops("monitor", "doctor-timer", "--interval", "5", "--dry-run")
    assert bad.returncode == 3 and "--interval 5 is out of range" in bad.stderr and "Traceback" not in bad.stderr
