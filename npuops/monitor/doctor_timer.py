"""`npuops-doctor.timer`: the doctor's verdict written for node_exporter's textfile collector every few minutes.

A oneshot service runs `npuops doctor --level L --prometheus TEXTFILE` (the doctor writes the file atomically) and
a timer runs it; the alerts read what it writes (NpuopsDoctorCheckFailing, a chip's health and temperature) and
notice when it stops (NpuopsDoctorStale). Every value in the two units goes through systemd's quoting
(npuops/templating.py). `npuops monitor doctor-timer` installs them; provisioning runs that on every host.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from npuops.errors import BadInputError, EnvironmentMissingError
from npuops.instance.manager import SystemdManager
from npuops.templating import render_template

SERVICE_UNIT = "npuops-doctor.service"
TIMER_UNIT = "npuops-doctor.timer"
# Debian's prometheus-node-exporter reads this directory (--collector.textfile.directory in its defaults file).
DEFAULT_TEXTFILE_DIR = Path("/var/lib/prometheus/node-exporter")
TEXTFILE_NAME = "npuops-doctor.prom"  # the alert rules match node_textfile_mtime_seconds on it
DEFAULT_INTERVAL_S = 300
# NpuopsDoctorStale fires after 30 minutes without a new file: a run every 15 minutes at most leaves one miss.
MAX_INTERVAL_S = 900


@dataclass(frozen=True)
class DoctorTimer:
    """What the timer runs: the npuops executable, the textfile's directory, how often and which level."""

    npuops: str
    textfile_dir: Path
    interval_s: int = DEFAULT_INTERVAL_S
    level: int = 1
    ascend_root: Path = Path("/usr/local/Ascend")  # where CANN and the driver are (npuops --ascend-root)

    def __post_init__(self) -> None:
        if not 60 <= self.interval_s <= MAX_INTERVAL_S:
            raise BadInputError(f"--interval {self.interval_s} is out of range",
                                f"give 60 to {MAX_INTERVAL_S} seconds (NpuopsDoctorStale fires after 30 minutes)")
        if not self.textfile_dir.is_absolute():
            raise BadInputError(f"--textfile-dir {self.textfile_dir} is not an absolute path",
                                f"give node_exporter's textfile directory, e.g. {DEFAULT_TEXTFILE_DIR}")

    @property
    def textfile(self) -> Path:
        return self.textfile_dir / TEXTFILE_NAME

    def exec_start(self) -> list[str]:
        return [self.npuops, "--ascend-root", str(self.ascend_root), "doctor", "--level", str(self.level),
                "--prometheus", str(self.textfile)]


def this_npuops() -> str:
    """The npuops executable of this installation (beside its interpreter: the serving venv's on a node)."""
    beside = Path(sys.executable).parent / "npuops"
    if beside.exists():
        return str(beside)
    found = shutil.which("npuops")
    if found is None:
        raise EnvironmentMissingError("no npuops executable beside this Python or on PATH",
                                      "install npuops (`pip install npuops`) or pass --npuops PATH")
    return str(Path(found).resolve())


def render_doctor_units(timer: DoctorTimer) -> dict[str, str]:
    """The two unit files by name (pure, but for reading the templates)."""
    variables = {"exec_start": timer.exec_start(), "textfile": str(timer.textfile),
                 "textfile_dir": str(timer.textfile_dir), "interval_s": timer.interval_s, "level": timer.level,
                 "timeout_s": max(120, timer.interval_s)}
    return {SERVICE_UNIT: render_template(f"{SERVICE_UNIT}.j2", variables),
            TIMER_UNIT: render_template(f"{TIMER_UNIT}.j2", variables)}


def install_doctor_timer(timer: DoctorTimer, manager: SystemdManager) -> dict[str, object]:
    """Write both units (a rerun with the same choices changes nothing), make the textfile directory, and enable
    and start the timer. What was done, for --json."""
    units = render_doctor_units(timer)
    changed = []
    for unit, text in units.items():
        path = manager.unit_path(unit)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            manager.install_unit(unit, text)
            changed.append(unit)
    timer.textfile_dir.mkdir(parents=True, exist_ok=True)
    manager.enable(TIMER_UNIT)
    manager.start(TIMER_UNIT)
    return {"units": [str(manager.unit_path(u)) for u in units], "changed": changed,
            "textfile": str(timer.textfile), "interval_s": timer.interval_s}
