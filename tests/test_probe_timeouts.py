"""A vendor tool that hangs: at the probe's timeout it is ended with everything it started (a child that left its
process group, a daemon that kept its output pipe), and a Ctrl-C during it ends it at once and exits 130 in one
line. The fake tools mark their children with a unique argument, found with pgrep and cleaned up by pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from npuops.hardware.probe import RC_TIMEOUT, CommandResult, Probe, descendants, parent_pid
from npuops.settings import Settings
from tests.support.paths import REPO

# A hang detector, never a timing: each fake tool and its children would run 300 s.
HANG_S = 120
SLEEPER = f"{sys.executable} -c 'import time; time.sleep(300)'"
# The same, in a process group of its own (as a tool's helper daemon may put itself).
GROUP_LEADER = f"{sys.executable} -c 'import os, time; os.setpgid(0, 0); time.sleep(300)'"


@pytest.fixture
def marker() -> Iterator[str]:
    """A unique argument for the fake tools' children; whatever still carries it after the test is killed."""
    mark = f"npuops-test-hung-{uuid.uuid4().hex}"
    yield mark
    for pid in _marked(mark):
        os.kill(pid, signal.SIGKILL)


def _marked(mark: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", mark], capture_output=True, text=True, check=False).stdout
    return [int(pid) for pid in found.split()]


def _tool(tmp_path: Path, body: str) -> Path:
    tool = tmp_path / "npu-smi"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)
    return tool


def _probe_in_thread(settings: Settings) -> list[CommandResult]:
    results: list[CommandResult] = []
    call = threading.Thread(target=lambda: results.append(Probe(settings).run(settings.npu_smi, "info")),
                            daemon=True)
    call.start()
    call.join(timeout=HANG_S)
    return results


@pytest.mark.parametrize("start_child", [
    # A child in a session of its own (setsid): out of the tool's process group.
    "setsid {sleeper} {marker} &\nwait\n",
    # A child in a process group of its own, holding the tool's output.
    "{group_leader} {marker} &\nwait\n",
    # A daemon: started by a subshell that is gone, so the tool is not even its parent; it holds the tool's pipe.
    "(setsid {sleeper} {marker} &)\nsleep 300\n",
], ids=["own-session", "own-group", "daemon-holding-the-pipe"])
def test_a_timed_out_tool_is_ended_with_the_children_it_started(tmp_path: Path, marker: str,
                                                                 start_child: str) -> None:
    tool = _tool(tmp_path, start_child.format(sleeper=SLEEPER, group_leader=GROUP_LEADER, marker=marker))
    settings = Settings(npu_smi=str(tool), command_timeout_s=1.0, environ={"PATH": os.environ["PATH"]})
    results = _probe_in_thread(settings)
    assert results, "the call waited on the tool's children"
    assert results[0].returncode == RC_TIMEOUT and "timed out after 1 s" in (results[0].error or "")
    assert _marked(marker) == [], "a child of the timed-out tool still runs"


def test_the_process_tree_is_read_from_proc_stat_lines() -> None:
    # The command name may hold spaces and parentheses: fields are counted from its last ')'.
    assert parent_pid("42 (a (weird) name) S 7 42 42 0 -1") == 7
    assert parent_pid("garbage") is None
    assert descendants({2: 1, 3: 2, 4: 3, 5: 1, 6: 9}, 2) == {3, 4}
    assert descendants({}, 2) == set()


@pytest.mark.parametrize("command", [["node"], ["doctor", "--level", "1"]])
def test_ctrl_c_during_a_hung_tool_ends_it_and_exits_130_in_one_line(tmp_path: Path, marker: str,
                                                                     command: list[str]) -> None:
    """npu-smi runs in a worker thread, in a session of its own: the terminal's SIGINT does not reach it, and the
    exit would wait for the tool's timeout (set far beyond the hang detector here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pid_file = tmp_path / "tool.pid"
    _tool(bin_dir, f"echo $$ > {pid_file}\n{SLEEPER} {marker} &\nwait\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NPUOPS_COMMAND_TIMEOUT_S": "3600",
           "NPUOPS_STATE_DIR": str(tmp_path / "state"), "NPUOPS_NPU_SMI": "npu-smi"}
    process = subprocess.Popen([sys.executable, "-m", "npuops", *command], cwd=REPO, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(HANG_S * 20):
            if _marked(marker) or process.poll() is not None:
                break
            threading.Event().wait(0.05)
        assert _marked(marker), "the fake npu-smi never started"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=HANG_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, err
    assert err.strip() == "npuops: interrupted", err
    tool_group = int(pid_file.read_text())
    assert _live_members(tool_group) == [], "the tool's process group outlived the interrupt"
    assert _marked(marker) == []


def _live_members(group: int) -> list[int]:
    """The processes of a process group that are not zombies (a zombie waits only for its parent to reap it)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z":
                members.append(int(entry.name))
    return members
