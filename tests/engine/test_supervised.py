"""The supervisor and `npuops launch` with the real vLLM CPU engine serving the tiny model.

- `npuops run` against a real NOTIFY_SOCKET: READY only after /health answers, WATCHDOG pings that stop while the
  engine is frozen (SIGSTOP) and resume after SIGCONT, and kill -9 of the engine ending the supervisor non-zero
  with nothing of the engine left;
- a model directory that is not a model: a diagnosis and exit 78, not a hang.
The foreground launch (progress, the key, status/list/logs, a refused conflicting launch, a clean stop on SIGTERM) is
asserted on test_bench.py's instance; the lifecycle under real systemd (launch, crash, hang, stop, reboot) is in
tests/systemd/.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.engine import engine_env, short_tmp_dir
from tests.support.http_server import free_port, http_request
from tests.support.npuops_cli import npuops_argv
from tests.support.paths import REPO
from tests.support.workspace import PLAN_FLAGS, Workspace, group_alive, kill_group, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# An engine start on a 2-core CI machine whose other worker serves, streams and restarts engines (the
# rollout tests) took over 240 s (run L): the wait is for the start, not a bound on it.
START_TIMEOUT_S = 600.0


def launch_args(model: Path, name: str, port: int, engine_python: Path, *extra: str) -> list[str]:
    return ["launch", str(model), *PLAN_FLAGS, "--name", name, "--port", str(port),
            "--vllm", str(engine_python.parent / "vllm"), *extra]


@pytest.fixture
def workspace(tmp_path: Path, engine_compile_cache: Path) -> Iterator[Workspace]:
    tmp_dir = short_tmp_dir()
    env = engine_env(tmp_path / "work", tmp_dir, engine_compile_cache)
    env["NPUOPS_STATE_DIR"] = str(tmp_path / "state")
    env["NPUOPS_SERVICE_DATA_ROOT"] = str(tmp_path / "var-lib")
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID"):
        env.pop(key, None)
    ws = Workspace(env, tmp_path / "state", [tmp_dir])
    yield ws
    for d in ws.tmp_dirs:
        shutil.rmtree(d, ignore_errors=True)


@dataclass
class NotifyListener:
    """A real sd_notify socket: what systemd would receive, with receive times."""

    path: Path
    messages: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    sock: socket.socket | None = None
    thread: threading.Thread | None = None
    on_ready_health: list[int | None] = field(default_factory=list)
    url: str = ""

    def start(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.5)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        assert self.sock is not None
        while True:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            if fields.get("READY") == "1":
                # READY must mean the endpoint answers: ask it at once.
                answer = None
                with contextlib.suppress(OSError):
                    answer = http_request(self.url + "/health", timeout=10)[0]
                self.on_ready_health.append(answer)
            self.messages.append((time.monotonic(), fields))

    def with_key(self, key: str, since: float = 0.0) -> list[tuple[float, dict[str, str]]]:
        return [(t, m) for t, m in list(self.messages) if key in m and t >= since]

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def render_instance(ws: Workspace, model: Path, name: str, port: int, engine_python: Path) -> dict[str, object]:
    """Render an instance's files into the state dir as launch would install them (no service manager here)."""
    proc = ws.run(*launch_args(model, name, port, engine_python, "--dry-run", "--output", str(ws.state / name)))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((ws.state / name / "instance.json").read_text())
    assert isinstance(record, dict)
    return record


def test_supervisor_notify_watchdog_freeze_and_kill(workspace: Workspace, engine_python: Path, tiny_model: Path,
                                                    tmp_path: Path) -> None:
    port = free_port()
    render_instance(workspace, tiny_model, "sup", port, engine_python)
    sock_dir = Path(tempfile.mkdtemp(prefix="nfy", dir="/tmp"))
    workspace.tmp_dirs.append(sock_dir)
    listener = NotifyListener(sock_dir / "notify", url=f"http://127.0.0.1:{port}")
    listener.start()
    env = dict(workspace.env, NOTIFY_SOCKET=str(listener.path), WATCHDOG_USEC="4000000")  # ping every 2 s
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        supervisor = subprocess.Popen(npuops_argv("run", "--state-dir", str(workspace.state), "sup"), env=env,
                                      stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    data_root = Path(workspace.env["NPUOPS_SERVICE_DATA_ROOT"])
    engine_pid = None
    try:
        wait_for(lambda: listener.with_key("READY") or supervisor.poll() is not None, START_TIMEOUT_S, "READY=1")
        assert supervisor.poll() is None, log.read_text()[-3000:]
        assert listener.on_ready_health == [200], "READY=1 was sent before /health answered"
        ready_at = listener.with_key("READY")[0][0]
        statuses = [m["STATUS"] for t, m in listener.with_key("STATUS") if t <= ready_at]
        assert any("loading weights" in s for s in statuses) and any("listening" in s for s in statuses), statuses
        assert not listener.with_key("WATCHDOG", since=0) or listener.with_key("WATCHDOG")[0][0] >= ready_at
        wait_for(lambda: len(listener.with_key("WATCHDOG", since=ready_at)) >= 2, 30, "two watchdog pings")

        engine_pid = int(workspace.supervisor_state("sup", data_root)["engine_pid"])  # type: ignore[call-overload]
        os.kill(engine_pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        # A ping already in flight may land just after the freeze; after one poll interval and one /health
        # timeout (2 s + 5 s) none may come while the engine stays frozen.
        wait_for(lambda: any("unhealthy" in m.get("STATUS", "") for _, m in listener.with_key("STATUS", frozen_at)),
                 30, "the supervisor to notice the frozen engine")
        time.sleep(12)
        late = listener.with_key("WATCHDOG", since=frozen_at + 8)
        assert late == [], f"watchdog pings continued while the engine was frozen: {late}"
        assert supervisor.poll() is None  # under systemd's watchdog, systemd decides; the supervisor waits

        os.kill(engine_pid, signal.SIGCONT)
        thawed_at = time.monotonic()
        wait_for(lambda: listener.with_key("WATCHDOG", since=thawed_at), 30, "pings to resume after SIGCONT")

        os.kill(engine_pid, signal.SIGKILL)
        code = supervisor.wait(timeout=60)
        assert code == 128 + signal.SIGKILL, log.read_text()[-3000:]
        final = workspace.supervisor_state("sup", data_root)
        exit_info = final["exit"]
        assert isinstance(exit_info, dict)
        assert exit_info["reason"] == "engine-exited" and exit_info["engine_returncode"] == -signal.SIGKILL
        assert exit_info["diagnosis"]["id"] == "signal-sigkill" and "dmesg" in exit_info["diagnosis"]["fix"]
        # The EngineCore and workers went with it: nothing of the engine's process group is left.
        wait_for(lambda: not group_alive(engine_pid), 10, "the engine's process group to be gone")
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        kill_group(engine_pid)
        listener.close()


def test_a_directory_that_is_not_a_model_is_diagnosed(workspace: Workspace, engine_python: Path, tiny_model: Path,
                                                      tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    render_instance(workspace, model, "broken", free_port(), engine_python)
    (model / "config.json").unlink()

    # The start gate refuses it first, naming the check and the fix.
    gate = workspace.run("run", "--state-dir", str(workspace.state), "--preflight", "broken")
    assert gate.returncode == 1 and "refused [model-directory]" in gate.stderr, gate.stderr

    # Without the gate (run by hand), the engine's own failure is diagnosed and the supervisor exits 78 (no
    # restart can help) instead of hanging.
    run = workspace.run("run", "--state-dir", str(workspace.state), "broken", timeout=180)
    assert run.returncode == 78, run.stdout[-3000:] + run.stderr[-3000:]
    assert "diagnosis [not-a-model]" in run.stderr and "config.json" in run.stderr
    data_root = Path(workspace.env["NPUOPS_SERVICE_DATA_ROOT"])
    exit_info = workspace.supervisor_state("broken", data_root)["exit"]
    assert isinstance(exit_info, dict) and exit_info["diagnosis"]["id"] == "not-a-model"

    # And launch itself refuses a directory without config.json before rendering anything.
    refused = workspace.run(*launch_args(model, "broken2", free_port(), engine_python, "--foreground"))
    assert refused.returncode == 3 and refused.stderr.count("\n") == 1, refused.stderr
