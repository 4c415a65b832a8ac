"""`npuops launch|status|stop|logs -i INVENTORY --group GROUP`: the wrong uses end in one line, the right exit code
and no traceback, before any host is touched where the mistake is in the flags. (The working paths run on SSH test
hosts under real systemd in tests/systemd/test_group_launch.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

INVENTORY = REPO / "tests" / "fleet" / "inventories" / "two-local.yml"


def npuops(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ), timeout=timeout, check=False)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("npuops:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(("args", "code", "says"), [
    (("launch", "qwen3-8b", "-i", str(INVENTORY)), 2, "-i/--inventory and --group go together"),
    (("launch", "qwen3-8b", "--group", "serving"), 2, "-i/--inventory and --group go together"),
    (("launch", "qwen3-8b", "--hardware", "cpu", "--ray-node-resources", '{"NPU": 1}'), 2,
     "--ray-node-resources is for a group launch"),
    (("launch", "qwen3-8b", "--hardware", "cpu", "--env", "NOT AN ASSIGNMENT", "--dry-run", "--output", "{out}"),
     3, "is not KEY=VALUE"),
    (("launch", "qwen3-8b", "--hardware", "cpu", "--env", "VLLM_API_KEY=x", "--dry-run", "--output", "{out}"),
     3, "--env VLLM_API_KEY is set by npuops"),
    (("launch", "qwen3-8b", "-i", str(INVENTORY), "--group", "serving", "--foreground"), 2,
     "--foreground and --verify are for one node"),
    (("launch", "qwen3-8b", "-i", str(INVENTORY), "--group", "serving", "--nodes", "2", "--dry-run",
      "--output", "{out}", "--ray-node-resources", "[1]"), 3, "--ray-node-resources must map"),
    (("launch", "qwen3-8b", "--hardware", "910B3x8", "--nodes", "2", "--dry-run", "--output", "{out}"), 2,
     "--nodes 2 launches one instance over several hosts"),
    (("status", "qwen", "-i", str(INVENTORY)), 2, "-i/--inventory and --group go together"),
    (("status", "-i", str(INVENTORY), "--group", "all"), 2, "a group needs the instance NAME"),
    (("stop", "qwen", "--group", "all"), 2, "-i/--inventory and --group go together"),
    (("logs", "qwen", "-i", str(INVENTORY), "--group", "all", "--follow"), 2, "--follow is for one host"),
])
def test_wrong_flags(args: tuple[str, ...], code: int, says: str, tmp_path: Path) -> None:
    proc = npuops(*(a.replace("{out}", str(tmp_path / "out")) for a in args))
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert says in one_line_error(proc)


def test_unknown_group_names_the_groups(tmp_path: Path) -> None:
    proc = npuops("launch", "qwen3-8b", "--hardware", "cpu", "-i", str(INVENTORY), "--group", "serving",
                  "--dry-run", "--output", str(tmp_path / "out"), "--artifacts", str(tmp_path / "art"))
    assert proc.returncode == 3, proc.stderr
    line = one_line_error(proc)
    assert "the inventory has no group 'serving'" in line
    assert not (tmp_path / "out").exists()


def test_a_group_of_loopback_hosts_has_no_serving_interface(tmp_path: Path) -> None:
    """Two hosts that are this machine over a local connection: their inventory address (loopback) is no
    interface's that other hosts could reach, and the error says which inventory variables fix it."""
    inventory = tmp_path / "inventory.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
             "ansible_host": "127.0.0.1", "npuops_command": str(Path(sys.executable).parent / "npuops")}
    inventory.write_text(json.dumps({"all": {"children": {"serving": {"hosts": {"localhost": local,
                                                                                  "second": local}}}}}))
    proc = npuops("launch", "qwen3-8b", "--hardware", "910B3x8", "-i", str(inventory), "--group", "serving",
                  "--dry-run", "--output", str(tmp_path / "out"), "--artifacts", str(tmp_path / "art"),
                  timeout=300)
    assert proc.returncode == 3, proc.stderr
    line = one_line_error(proc)
    assert "host localhost: no interface holds 127.0.0.1" in line and "npuops_serving_address" in line, line
    assert not (tmp_path / "out").exists()


def test_status_of_a_group_where_npuops_has_no_such_instance(tmp_path: Path) -> None:
    """Each host answers for itself; an instance that is not there is that host's failure, named, exit 1."""
    env_state = tmp_path / "state"
    env_state.mkdir()
    proc = subprocess.run([sys.executable, "-m", "npuops", "status", "nosuch", "-i", str(INVENTORY), "--group", "all",
                           "--artifacts", str(tmp_path / "art"), "--json"], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "NPUOPS_STATE_DIR": str(env_state)}, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr
    view = json.loads(proc.stdout)
    assert view["ok"] is False and set(view["down"]) == {"localhost", "second"}
    assert all(part["status"] == "failed" for part in view["hosts"].values()), view
