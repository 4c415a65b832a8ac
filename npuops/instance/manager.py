"""The one small interface to the service manager: install a unit, start, stop, ask its state, read its logs.

`SystemdManager` drives real systemd (`systemctl`, `journalctl`) on production nodes. The same class drives
docker-systemctl-replacement (`systemctl3.py --root=DIR`, the init of many containers and the stand-in the tests
use to run the very same unit files): the command is a setting (`systemctl`), and that tool keeps a unit's log in
a file instead of the journal, which `log_command` knows. Every call is an argument list; nothing goes through a
shell.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from npuops.atomic import write_text_atomic
from npuops.errors import EnvironmentMissingError, ServiceManagerError
from npuops.settings import Settings

_SHOW_PROPERTIES = ("ActiveState", "SubState", "MainPID", "ActiveEnterTimestamp", "NRestarts", "Result",
                    "UnitFileState", "LoadState", "ExecMainStatus", "ExecMainCode", "ExecStartPre")
# ExecMainCode= is the si_code of the main process's end (waitid(2)): it exited, or a signal ended it.
CLD_EXITED = 1
# One command of ExecStartPre= as `systemctl show` prints it, e.g. "{ path=/x ; argv[]=/x a ; ... ; pid=352 ;
# code=exited ; status=217 }" (systemd 252; tests/fixtures/systemd): how its last run ended.
_COMMAND_END = re.compile(r"\bcode=(?P<code>[\w()]+) ; status=(?P<status>\d+)")


# `systemctl` killed at its timeout (timeout(1)'s code), and the sub-state a unit then shows.
RC_TIMED_OUT = 124
NO_ANSWER = "systemctl did not answer"
# The longest piece of a log line `stream_log` hands over at once (journald splits lines at 48 KiB by default).
LOG_LINE_MAX = 64 * 1024


@dataclass(frozen=True)
class UnitState:
    active_state: str  # active, activating, deactivating, inactive, failed, unknown
    sub_state: str
    main_pid: int | None
    since: str  # ActiveEnterTimestamp as systemd prints it ("" when never active)
    restarts: int | None
    result: str
    enabled: str
    loaded: str
    # How the main process of the last run ended: its exit status when it exited (ExecMainCode=1), else None.
    exit_status: int | None = None
    # How the start gate (ExecStartPre=) of the last start ended, when it exited with a status other than 0: systemd
    # fails a unit there when it cannot even set up its processes (217/USER: the User= is gone).
    start_pre_status: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"active_state": self.active_state, "sub_state": self.sub_state, "main_pid": self.main_pid,
                "since": self.since, "restarts": self.restarts, "result": self.result, "enabled": self.enabled,
                "loaded": self.loaded, "exit_status": self.exit_status, "start_pre_status": self.start_pre_status}


def parse_show(text: str) -> UnitState:
    """`systemctl show -p A -p B UNIT` output (KEY=VALUE lines) as a UnitState. Pure."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()

    def number(key: str) -> int | None:
        raw = values.get(key, "")
        return int(raw) if raw.isdigit() else None

    pid = number("MainPID")
    return UnitState(
        active_state=values.get("ActiveState", "unknown") or "unknown",
        sub_state=values.get("SubState", "unknown") or "unknown",
        main_pid=pid if pid else None,
        since=values.get("ActiveEnterTimestamp", ""),
        restarts=number("NRestarts"),
        result=values.get("Result", ""),
        enabled=values.get("UnitFileState", ""),
        loaded=values.get("LoadState", ""),
        exit_status=number("ExecMainStatus") if number("ExecMainCode") == CLD_EXITED else None,
        start_pre_status=_failed_exit(values.get("ExecStartPre", "")),
    )


def _failed_exit(commands: str) -> int | None:
    """The first non-zero exit status among a command property's runs (ExecStartPre=), or None. Pure."""
    for match in _COMMAND_END.finditer(commands):
        if match.group("code") == "exited" and int(match.group("status")) != 0:
            return int(match.group("status"))
    return None


class SystemdManager:
    def __init__(self, systemctl: list[str], unit_dir: Path, run_dir: Path = Path("/run/systemd/system"),
                 timeout_s: float = 60.0, query_timeout_s: float = 15.0) -> None:
        self.systemctl = systemctl
        self.unit_dir = unit_dir
        self.run_dir = run_dir
        # Changes (daemon-reload, enable) may take systemd a while; a question (show) gets the command timeout.
        self.timeout_s = timeout_s
        self.query_timeout_s = query_timeout_s

    @property
    def is_replacement(self) -> bool:
        """docker-systemctl-replacement rather than systemd itself (it keeps logs in files, not the journal)."""
        return Path(self.systemctl[0]).name.startswith(("systemctl3", "systemctl.py", "systemctl2"))

    def unavailable_reason(self) -> str | None:
        """Why units cannot be run here, or None. Real systemd must be the init (sd_booted(3))."""
        if self.is_replacement:
            return None
        if not self.run_dir.is_dir():
            return "systemd is not running as init on this machine (no /run/systemd/system)"
        return None

    def _run(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        argv = [*self.systemctl, *args]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout or self.timeout_s,
                                  check=False, stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise EnvironmentMissingError(f"cannot run {argv[0]}: {exc.strerror}", "install systemd, or run the engine "
                                          "in the terminal with `npuops launch --foreground`") from None
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, RC_TIMED_OUT, "", f"{' '.join(argv)} timed out")

    def _checked(self, *args: str, timeout: float | None = None) -> None:
        result = self._run(*args, timeout=timeout)
        if result.returncode != 0:
            said = (result.stderr or result.stdout).strip().splitlines()
            command = " ".join(shlex.quote(a) for a in [*self.systemctl, *args])
            last = said[-1] if said else "no output"
            raise ServiceManagerError(f"`{command}` failed (rc {result.returncode}): {last}",
                                      "read the unit's log (`npuops logs NAME`) and `systemctl status` of the unit")

    def unit_path(self, unit: str) -> Path:
        return self.unit_dir / unit

    def install_unit(self, unit: str, text: str) -> Path:
        path = self.unit_path(unit)
        write_text_atomic(path, text, mode=0o644)
        self.reload()
        return path

    def reload(self) -> None:
        """`daemon-reload`: systemd reads the unit files written since."""
        self._checked("daemon-reload")

    def remove_unit(self, unit: str) -> None:
        (self.unit_dir / unit).unlink(missing_ok=True)
        self._run("daemon-reload")

    def enable(self, unit: str) -> None:
        self._checked("enable", unit)

    def disable(self, unit: str) -> None:
        # A unit already gone or never enabled is no error: the point is that it does not start at boot.
        self._run("disable", unit)

    def start_command(self, unit: str) -> list[str]:
        """`systemctl start --no-block UNIT`: returns at once with real systemd; launch follows the progress."""
        return [*self.systemctl, "start", "--no-block", unit]

    def start(self, unit: str) -> None:
        self._checked("start", "--no-block", unit)

    def reset_failed(self, unit: str) -> None:
        """Forget the unit's failed state and its start-rate count (a deliberate restart is no crash loop)."""
        self._run("reset-failed", unit)

    def stop(self, unit: str, timeout: float | None = None) -> None:
        self._checked("stop", unit, timeout=timeout)

    def state(self, unit: str) -> UnitState:
        args = ["show"] + [f"--property={p}" for p in _SHOW_PROPERTIES] + [unit]
        result = self._run(*args, timeout=self.query_timeout_s)
        if result.returncode == RC_TIMED_OUT:
            # Said as such: a hung systemctl is not a stopped unit.
            return replace(parse_show(""), sub_state=NO_ANSWER)
        return parse_show(result.stdout if result.returncode == 0 else "")

    def log_command(self, unit: str, lines: int, follow: bool, *more_units: str) -> list[str]:
        """The journal of `unit` (and `more_units`, interleaved, each line with its unit's name)."""
        if self.is_replacement:
            return [*self.systemctl, "log", unit, "-n", str(lines), *(["-f"] if follow else ["--no-pager"])]
        units = [arg for u in (unit, *more_units) for arg in ("--unit", u)]
        return ["journalctl", *units, "--lines", str(lines), "--no-pager",
                "--output", "short-iso" if more_units else "cat", *(["--follow"] if follow else [])]

    def stream_log(self, unit: str, lines: int, follow: bool, *more_units: str,
                   on_line: Callable[[str], None]) -> int:
        """log_command's output handed to `on_line` line by line as it comes (with `follow`, until it ends or the
        caller raises, Ctrl-C included), each line without its newline and at most LOG_LINE_MAX characters (a
        longer one comes in pieces); the command's exit status. The lines are the engine's own output, as it wrote
        them: the caller escapes them for a terminal."""
        argv = self.log_command(unit, lines, follow, *more_units)
        try:
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise EnvironmentMissingError(f"cannot run {argv[0]}: {exc.strerror}",
                                          "install systemd's journalctl") from None
        stdout = process.stdout
        assert stdout is not None
        try:
            with stdout:
                for raw in iter(lambda: stdout.readline(LOG_LINE_MAX), b""):
                    on_line(raw.decode("utf-8", errors="replace").removesuffix("\n"))
        finally:
            if process.poll() is None:
                process.terminate()
            process.wait()
        return process.returncode

    def recent_log(self, unit: str, lines: int = 40) -> list[str]:
        argv = self.log_command(unit, lines, follow=False)
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False,
                                    stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return []
        return result.stdout.splitlines()[-lines:]


def systemd_booted(settings: Settings) -> bool:
    """Whether real systemd is this node's init (sd_booted(3): /run/systemd/system exists)."""
    return settings.host_path("/run/systemd/system").is_dir()


def service_manager(settings: Settings) -> SystemdManager:
    return SystemdManager(shlex.split(settings.systemctl), settings.unit_dir,
                          run_dir=settings.host_path("/run/systemd/system"),
                          query_timeout_s=settings.command_timeout_s)
