"""The thin boundary to the machine: run vendor commands and read host files, never raising.

Everything that touches the hardware goes through a `Probe`. Commands become `CommandResult`s
(a missing command is rc 127, a timeout rc 124, as in DeepOps' doctor), files become text or None.
Results are cached per probe, so a vendor command runs once however many checks read it.
Tests replace the runner (`FakeRunner`-style objects with the same `run` signature) or point
`Settings.root` at a prepared tree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from npuops.settings import Settings

RC_TIMEOUT = 124
RC_NOT_FOUND = 127
RC_NOT_EXECUTABLE = 126


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float
    # Why the command did not run to completion (missing, timeout, OS error), else None.
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.error is None

    @property
    def missing(self) -> bool:
        return self.returncode == RC_NOT_FOUND

    @property
    def output(self) -> str:
        """stdout and stderr together: vendor tools print their errors on either."""
        if self.stdout and self.stderr:
            return self.stdout.rstrip("\n") + "\n" + self.stderr
        return self.stdout or self.stderr

    def describe(self) -> str:
        cmd = " ".join(self.argv)
        if self.error:
            return f"`{cmd}`: {self.error}"
        return f"`{cmd}` exited {self.returncode}"


class CommandRunner(Protocol):
    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> CommandResult: ...


class SubprocessRunner:
    """Runs commands for real; resolves the program on `search_path`; never raises."""

    def __init__(self, search_path: str, base_env: Mapping[str, str]) -> None:
        self._search_path = search_path
        self._base_env = dict(base_env)

    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        args = tuple(argv)
        start = time.monotonic()
        if not args:
            return CommandResult(args, RC_NOT_FOUND, "", "", 0.0, "empty command")
        program = args[0] if os.sep in args[0] else shutil.which(args[0], path=self._search_path)
        if program is None or not Path(program).exists():
            return CommandResult(args, RC_NOT_FOUND, "", "", 0.0, f"{args[0]}: command not found")
        run_env = dict(self._base_env if env is None else env)
        # Vendor tools localise their output; the parsers read the C locale's.
        run_env.setdefault("LC_ALL", "C")
        try:
            # A process group of its own (argv list, no shell): at the timeout the whole group is killed, the
            # children a vendor tool started too; killing only the tool would leave them holding its pipes, and
            # reading to their end would wait for them.
            process = subprocess.Popen((program, *args[1:]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, text=True, errors="replace", env=run_env,
                                       start_new_session=True)
        except PermissionError as exc:
            return CommandResult(args, RC_NOT_EXECUTABLE, "", "", time.monotonic() - start, f"not executable: {exc}")
        except OSError as exc:
            return CommandResult(args, RC_NOT_EXECUTABLE, "", "", time.monotonic() - start, f"cannot run: {exc}")
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
            return CommandResult(args, RC_TIMEOUT, out or "", "", time.monotonic() - start,
                                 f"timed out after {timeout:g} s")
        return CommandResult(args, process.returncode, out, err, time.monotonic() - start)


class Probe:
    """Cached access to commands and files of one host, shared by everything that inspects it."""

    def __init__(
        self,
        settings: Settings,
        runner: CommandRunner | None = None,
        machine: Callable[[], str] | None = None,
    ) -> None:
        self.settings = settings
        self.runner: CommandRunner = runner or SubprocessRunner(settings.search_path(), settings.environ)
        self._machine = machine
        self._commands: dict[tuple[str, ...], CommandResult] = {}
        self._lock = threading.Lock()
        self._inflight: dict[tuple[str, ...], threading.Event] = {}

    def run(self, *argv: str, timeout: float | None = None) -> CommandResult:
        """Run a command once per probe; concurrent callers of the same command wait for the first."""
        key = tuple(argv)
        while True:
            with self._lock:
                if key in self._commands:
                    return self._commands[key]
                event = self._inflight.get(key)
                if event is None:
                    event = threading.Event()
                    self._inflight[key] = event
                    break
            event.wait()
        try:
            result = self.runner.run(key, timeout=timeout or self.settings.command_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the boundary promises never to raise
            result = CommandResult(key, RC_NOT_EXECUTABLE, "", "", 0.0, f"runner failed: {exc!r}")
        with self._lock:
            self._commands[key] = result
            del self._inflight[key]
        event.set()
        return result

    def read_text(self, path: str | Path) -> str | None:
        """A host file's text, or None when it is absent or unreadable."""
        try:
            return self.settings.host_path(path).read_text(encoding="utf-8", errors="replace")
        except (OSError, ValueError):
            return None

    def exists(self, path: str | Path) -> bool:
        try:
            return self.settings.host_path(path).exists()
        except OSError:
            return False

    def glob(self, directory: str | Path, pattern: str) -> list[str]:
        """Names (not paths) in a host directory matching a glob pattern, sorted."""
        try:
            return sorted(p.name for p in self.settings.host_path(directory).glob(pattern))
        except OSError:
            return []

    def machine(self) -> str:
        if self._machine is not None:
            return self._machine()
        import platform

        return platform.machine()
