"""npuops launched on the real engine in a private state directory: the plan flags of the tiny model, the
workspace, waiting for a condition, and process groups."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.npuops_cli import npuops_argv
from tests.support.paths import REPO

# The flags of the tiny model on the CPU target (tests/engine/README.md); the plan turns them into vllm.yaml.
PLAN_FLAGS = ("--hardware", "cpu", "--dtype", "float32", "--max-model-len", "512", "--input-len", "256",
              "--output-len", "64", "--enforce-eager", "--kv-cache-memory-bytes", str(256 * 2**20))


@dataclass
class Workspace:
    """A private npuops state (NPUOPS_STATE_DIR in `env`) to launch instances in; `tmp_dirs` are removed after."""

    env: dict[str, str]
    state: Path
    tmp_dirs: list[Path] = field(default_factory=list)

    def run(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(npuops_argv(*args), env=self.env, capture_output=True, text=True, timeout=timeout,
                              cwd=REPO, check=False)

    def status(self, name: str) -> dict[str, object]:
        proc = self.run("status", name, "--json")
        (instance,) = json.loads(proc.stdout)["instances"]
        assert isinstance(instance, dict)
        return instance

    def supervisor_state(self, name: str, data_root: Path | None = None) -> dict[str, object]:
        path = (data_root / f"npuops-{name}" if data_root else self.state / name) / "supervisor.json"
        data = json.loads(path.read_text())
        assert isinstance(data, dict)
        return data


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):  # type: ignore[no-untyped-def]
    """The first true value of `predicate()`, polled every `poll` s; an AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process of process group `pgid` remains (zombies wait for a reaper that a
    container's init may never be)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def kill_group(pgid: int | None) -> None:
    """SIGKILL every process of group `pgid` (woken first, in case it was stopped); nothing when it is gone."""
    if pgid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGCONT)
            os.killpg(pgid, signal.SIGKILL)


def wait_until_serving(launcher: subprocess.Popen[bytes], out: Path, err: Path, timeout: float) -> None:
    """Wait for a foreground `npuops launch` to print its endpoint summary; its stderr in the failure if it exits."""

    def serving() -> bool:
        if launcher.poll() is not None:
            raise AssertionError(f"launch exited with {launcher.returncode}:\n{err.read_text()}")
        return "is serving after" in out.read_text()

    wait_for(serving, timeout, "the launch to report serving")


def foreground_workspace(root: Path, engine_python: Path, compile_cache: Path) -> Workspace:
    """A workspace for a foreground launch of the engine venv's vLLM: the recipe's engine environment, a private
    state, the serving stack read from the engine venv (on a node: the provisioned one), and no systemd variables
    of the test runner's own service leaking into the supervisor."""
    from tests.support.engine import engine_env, short_tmp_dir

    tmp_dir = short_tmp_dir()
    env = engine_env(root / "work", tmp_dir, compile_cache)
    env["NPUOPS_STATE_DIR"] = str(root / "state")
    env["NPUOPS_STACK_PYTHON"] = str(engine_python)
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID"):
        env.pop(key, None)
    return Workspace(env, root / "state", [tmp_dir])


@contextlib.contextmanager
def foreground_launch(argv: list[str], env: dict[str, str], root: Path,
                      timeout: float) -> Iterator[subprocess.Popen[bytes]]:
    """`npuops launch ... --foreground` (argv) with its stdout/stderr in root/launch.{out,err}, serving on entry (the
    launcher process is given: a test may stop it itself); SIGTERM on exit (the supervisor stops the engine), the
    process group killed if it does not end in 60 s."""
    out, err = root / "launch.out", root / "launch.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        launcher = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, cwd=REPO, start_new_session=True)
    try:
        wait_until_serving(launcher, out, err, timeout)
        yield launcher
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_group(launcher.pid)
        kill_leftover_engines(root)


def kill_leftover_engines(root: Path) -> None:
    """The engines the supervisors under `root` started, if still alive: each runs in its own session, so a
    supervisor killed rather than stopped (a launch that timed out on a busy machine) leaves its engine serving
    on, for hours (run L left one behind)."""
    for status in root.rglob("supervisor.json"):
        try:
            pid = json.loads(status.read_text(encoding="utf-8")).get("engine_pid")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(pid, int) and pid > 1:
            kill_group(pid)
