"""The thin boundary to the machine: run vendor commands and read host files, never raising.

Everything that touches the hardware goes through a `Probe`. Commands become `CommandResult`s
(a missing command is rc 127, a timeout rc 124, as in DeepOps' doctor), files become text or None.
A tool that overruns its timeout is ended with everything it started; on an interrupt the CLI ends every
running tool at once (`RUNNING_TOOLS.stop()`), and no new one starts.
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
RC_INTERRUPTED = 130
INTERRUPTED = "interrupted"
# How long an ended tool's pipes may stay open before its output is given up on.
DRAIN_S = 2.0
# How deep end_tool follows processes that left the tool's group (each round freezes one more generation).
TREE_ROUNDS = 8


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
    """Runs commands for real; resolves the program on `search_path`; never raises (but lets an interrupt through,
    the tool ended first)."""

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
        if RUNNING_TOOLS.stopping:
            return CommandResult(args, RC_INTERRUPTED, "", "", 0.0, INTERRUPTED)
        run_env = dict(self._base_env if env is None else env)
        # Vendor tools localise their output; the parsers read the C locale's.
        run_env.setdefault("LC_ALL", "C")
        try:
            # A session of its own (argv list, no shell): at the timeout or an interrupt the tool is ended with
            # everything it started (end_tool); a terminal's Ctrl-C does not reach it, npuops ends it itself.
            process = subprocess.Popen((program, *args[1:]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, text=True, errors="replace", env=run_env,
                                       start_new_session=True)
        except PermissionError as exc:
            return CommandResult(args, RC_NOT_EXECUTABLE, "", "", time.monotonic() - start, f"not executable: {exc}")
        except OSError as exc:
            return CommandResult(args, RC_NOT_EXECUTABLE, "", "", time.monotonic() - start, f"cannot run: {exc}")
        RUNNING_TOOLS.add(process)
        try:
            return _finish(process, args, timeout, start)
        except BaseException:
            # An interrupt raised in this thread (KeyboardInterrupt in the main one): the tool does not outlive it.
            end_tool(process)
            _drain(process)
            raise
        finally:
            RUNNING_TOOLS.discard(process)


def _finish(process: subprocess.Popen[str], args: tuple[str, ...], timeout: float, start: float) -> CommandResult:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_tool(process)
        return CommandResult(args, RC_TIMEOUT, _drain(process), "", time.monotonic() - start,
                             f"timed out after {timeout:g} s")
    if RUNNING_TOOLS.stopping and process.returncode < 0:
        return CommandResult(args, RC_INTERRUPTED, out, err, time.monotonic() - start, INTERRUPTED)
    return CommandResult(args, process.returncode, out, err, time.monotonic() - start)


def _drain(process: subprocess.Popen[str]) -> str:
    """What an ended tool printed, without waiting on a pipe that a process out of reach still holds (one that
    was handed the pipe and left the tool's family before the end)."""
    try:
        out, _ = process.communicate(timeout=DRAIN_S)
        return out or ""
    except subprocess.TimeoutExpired:
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        process.wait()
        return ""


# --- ending a tool with everything it started ---------------------------------------------------------------------

def parent_pid(stat_line: str) -> int | None:
    """The parent's pid in a /proc/PID/stat line, or None. The command name (field 2) is in parentheses and may
    hold spaces and parentheses itself, so the fields after it are counted from its last ')' (proc(5)). Pure."""
    _, paren, rest = stat_line.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 2 or not fields[1].isdigit():
        return None
    return int(fields[1])


def descendants(parents: Mapping[int, int], root: int) -> set[int]:
    """Every process below `root` in a map of pid -> parent pid. Pure."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _pids(proc: Path) -> list[str]:
    try:
        return [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []


def _process_parents(proc: Path = Path("/proc")) -> dict[int, int]:
    parents = {}
    for name in _pids(proc):
        try:
            parent = parent_pid((proc / name / "stat").read_text(encoding="utf-8", errors="replace"))
        except OSError:  # gone since the listing
            continue
        if parent is not None:
            parents[int(name)] = parent
    return parents


def _pipe_holders(inodes: set[int], proc: Path = Path("/proc")) -> set[int]:
    """The processes but this one holding one of the pipes `inodes` (what would keep a read of the tool's
    output waiting)."""
    wanted = {f"pipe:[{inode}]" for inode in inodes}
    holders = set()
    for name in _pids(proc):
        if int(name) == os.getpid():
            continue
        try:
            fds = os.listdir(proc / name / "fd")
        except OSError:  # gone, or another user's (not one the tool could have handed its pipe to)
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(proc / name / "fd" / fd) in wanted:
                    holders.add(int(name))
                    break
    return holders


def _signal(pid: int, sig: signal.Signals, *, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, sig)


def end_tool(process: subprocess.Popen[str]) -> None:
    """SIGKILL a tool with its process group, every process it started (a child that left the group with setsid
    or a group of its own, and theirs) and every process holding its output pipes. They are frozen (SIGSTOP)
    first, so nothing forks or is re-parented out of sight between the look and the kill."""
    inodes = set()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):  # closed meanwhile
                inodes.add(os.fstat(stream.fileno()).st_ino)
    _signal(process.pid, signal.SIGSTOP, group=True)
    frozen: set[int] = set()
    for _ in range(TREE_ROUNDS):
        parents = _process_parents()
        # Not this process's own children: another tool starting in another thread holds every pipe of this
        # process for the moment between its fork and its exec.
        holders = {pid for pid in _pipe_holders(inodes) if parents.get(pid) != os.getpid()}
        found = (descendants(parents, process.pid) | holders) - frozen - {process.pid}
        if not found:
            break
        for pid in found:
            _signal(pid, signal.SIGSTOP)
        frozen |= found
    _signal(process.pid, signal.SIGKILL, group=True)
    for pid in frozen:
        _signal(pid, signal.SIGKILL)


class RunningTools:
    """The vendor tools running now in this process, so that an interrupt ends them all at once: a Ctrl-C would
    otherwise wait for every tool a worker thread runs to time out (npu-smi: 15 s)."""

    def __init__(self) -> None:
        # Re-entrant: stop() runs in a signal handler, possibly while the main thread holds the lock in add().
        self._lock = threading.RLock()
        self._running: set[subprocess.Popen[str]] = set()
        self._stopping = False

    @property
    def stopping(self) -> bool:
        return self._stopping

    def add(self, process: subprocess.Popen[str]) -> None:
        """Keep a started tool; ended at once when an interrupt came between its start and now."""
        with self._lock:
            if not self._stopping:
                self._running.add(process)
                return
        end_tool(process)

    def discard(self, process: subprocess.Popen[str]) -> None:
        with self._lock:
            self._running.discard(process)

    def stop(self) -> None:
        """End every running tool and start no new one (each call returns an interrupted result instead)."""
        with self._lock:
            self._stopping = True
            running = list(self._running)
        for process in running:
            end_tool(process)

    def resume(self) -> None:
        """Start tools again (after an interrupt was handled, in a process that goes on, such as a test's)."""
        with self._lock:
            self._stopping = False


RUNNING_TOOLS = RunningTools()


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
        except BaseException:
            # An interrupt: callers waiting for this command must not wait forever (they run it themselves, and
            # find it interrupted).
            with self._lock:
                del self._inflight[key]
            event.set()
            raise
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
