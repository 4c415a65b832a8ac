"""The rendered units under a service manager, with the real engine: docker-systemctl-replacement (`systemctl3.py
--root=DIR`) runs the very unit files `npuops launch` installs (Type=notify, ExecStartPre gate, Restart=on-failure),
since systemd is not init on these machines (testing-recipes.md).

Two instances on two ports; a clashing third refused; stop; the init loop starting the enabled units as at boot; a
kill -9 of one engine → the supervisor exits non-zero and the service comes back by itself; stop again.

Stand-in differences worth knowing: it passes its own environment to services (real systemd does not), ignores the
sandboxing keys, keeps logs in files (`npuops logs` reads them through `systemctl3.py log`), restarts only units
its `init` loop started, and reads EnvironmentFile= paths under --root unless they already lie there (so the state
dir is put inside the root).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engine import engine_env, short_tmp_dir
from tests.support.http_server import free_port
from tests.support.workspace import PLAN_FLAGS, Workspace, group_alive, kill_group, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SYSTEMCTL = Path(sys.executable).parent / "systemctl3.py"


@pytest.fixture
def managed(tmp_path: Path, engine_compile_cache: Path) -> Iterator[Workspace]:
    if not SYSTEMCTL.exists():
        pytest.fail(f"{SYSTEMCTL} is missing: install the test extra (pip install -e .[test])")
    # At least three levels (the stand-in's rule for --root), and short: TMPDIR=%t/npuops-NAME lands under it and
    # vLLM's ZeroMQ socket paths must stay under 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="sd", dir="/tmp")) / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    tmp_dir = short_tmp_dir()
    env = engine_env(tmp_path / "work", tmp_dir, engine_compile_cache)
    env.update({
        "NPUOPS_SYSTEMCTL": f"{SYSTEMCTL} --root={root}",
        "NPUOPS_UNIT_DIR": str(root / "etc/systemd/system"),
        "NPUOPS_STATE_DIR": str(root / "etc/npuops"),
        "NPUOPS_SERVICE_DATA_ROOT": str(root / "var/lib"),
    })
    ws = Workspace(env, root / "etc/npuops", [tmp_dir, root.parent])
    init: list[subprocess.Popen[bytes]] = []
    ws.init = init  # type: ignore[attr-defined]
    yield ws
    for process in init:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)  # the init loop stops its services on SIGTERM
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    for status in (root / "var/lib").glob("npuops-*/supervisor.json"):
        with contextlib.suppress(ValueError, OSError):
            data = json.loads(status.read_text())
            kill_group(data.get("engine_pid"))
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(int(data.get("supervisor_pid")), signal.SIGKILL)
    for d in ws.tmp_dirs:
        shutil.rmtree(d, ignore_errors=True)


def launch(ws: Workspace, model: Path, name: str, port: int) -> subprocess.CompletedProcess[str]:
    return ws.run("launch", str(model), *PLAN_FLAGS, "--name", name, "--port", str(port),
                  "--vllm", str(Path(os.environ["NPUOPS_ENGINE_PYTHON"]).parent / "vllm"),
                  "--service-user", getpass.getuser(), timeout=400)


def test_units_start_restart_after_a_crash_and_stop(managed: Workspace, engine_python: Path,
                                                    tiny_model: Path) -> None:
    ws = managed
    data_root = Path(ws.env["NPUOPS_SERVICE_DATA_ROOT"])
    port_a, port_b = free_port(), free_port()
    for name, port in (("a", port_a), ("b", port_b)):
        proc = launch(ws, tiny_model, name, port)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{name} is serving after" in proc.stdout
        assert "loading weights" in proc.stderr and "healthy (" in proc.stderr
        unit = (Path(ws.env["NPUOPS_UNIT_DIR"]) / f"npuops-{name}.service").read_text()
        assert "Type=notify" in unit and f"run --state-dir {ws.state} {name}" in unit

    clash = launch(ws, tiny_model, "c", port_a)
    assert clash.returncode == 3 and "already used by instance 'a'" in clash.stderr

    listed = json.loads(ws.run("list", "--json").stdout)["instances"]
    assert sorted((i["name"], i["state"], i["unit"]) for i in listed) == [
        ("a", "healthy", "npuops-a.service"), ("b", "healthy", "npuops-b.service")]
    logs = ws.run("logs", "a", "-n", "400")
    assert logs.returncode == 0 and "Starting vLLM server on" in logs.stdout

    for name in ("a", "b"):
        stopped = ws.run("stop", name)
        assert stopped.returncode == 0 and f"{name}: stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    assert ws.run("status", "a").returncode == 1

    # As at boot: the init loop starts the enabled units, and restarts them when they fail.
    init = subprocess.Popen([str(SYSTEMCTL), f"--root={ws.state.parents[1]}", "init"], env=ws.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ws.init.append(init)  # type: ignore[attr-defined]
    both = ws.run("status", "--wait", "300", "--json", timeout=360)
    assert both.returncode == 0, both.stdout
    before = ws.supervisor_state("a", data_root)
    engine_pid = int(before["engine_pid"])  # type: ignore[call-overload]

    os.kill(engine_pid, signal.SIGKILL)
    crash_log = wait_for(lambda: "supervisor exits 137" in (text := ws.run("logs", "a", "-n", "400").stdout) and text,
                         60, "the supervisor to exit 137 after the crash")
    assert "diagnosis [signal-sigkill]" in crash_log
    wait_for(lambda: not group_alive(engine_pid), 30, "the crashed engine's process group to be gone")

    def restarted() -> bool:
        state = ws.supervisor_state("a", data_root)
        return state.get("engine_pid") not in (None, engine_pid) and state.get("stage") == "healthy"

    wait_for(restarted, 300, "the service to come back after the crash")
    again = ws.status("a")
    assert again["state"] == "healthy" and again["unit_state"]["active_state"] == "active"  # type: ignore[index]
    assert ws.status("b")["state"] == "healthy"  # the other instance never noticed

    for name in ("a", "b"):
        assert ws.run("stop", name).returncode == 0
    assert json.loads(ws.run("status", "--json").stdout)["instances"][0]["state"] == "stopped"
