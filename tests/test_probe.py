from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from npuops.hardware.probe import RC_NOT_FOUND, RC_TIMEOUT, CommandResult, Probe, SubprocessRunner
from npuops.settings import Settings


def test_missing_command_is_rc_127_not_an_exception() -> None:
    result = SubprocessRunner("/nonexistent", {}).run(["npu-smi", "info"], timeout=5)
    assert result.returncode == RC_NOT_FOUND
    assert result.missing and not result.ok
    assert "command not found" in (result.error or "")


def test_timeout_is_rc_124() -> None:
    result = SubprocessRunner("", {}).run([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.3)
    assert result.returncode == RC_TIMEOUT
    assert "timed out" in (result.error or "")


def test_real_command_output_and_c_locale() -> None:
    result = SubprocessRunner("", {}).run(
        [sys.executable, "-c", "import os,sys; print(os.environ['LC_ALL']); print('e', file=sys.stderr); sys.exit(3)"],
        timeout=10,
    )
    assert result.returncode == 3
    assert result.stdout.strip() == "C"
    assert result.stderr.strip() == "e"
    assert result.output.splitlines() == ["C", "e"]


def test_not_executable_file(tmp_path: Path) -> None:
    tool = tmp_path / "npu-smi"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o644)
    result = SubprocessRunner(str(tmp_path), {}).run([str(tool), "info"], timeout=5)
    assert result.returncode != 0 and result.error


class CountingRunner:
    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> CommandResult:
        with self.lock:
            self.count += 1
        return CommandResult(tuple(argv), 0, "out", "", 0.0)


def test_probe_runs_each_command_once_even_concurrently() -> None:
    runner = CountingRunner()
    probe = Probe(Settings(), runner=runner)
    threads = [threading.Thread(target=probe.run, args=("npu-smi", "info")) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runner.count == 1
    probe.run("npu-smi", "info", "-t", "health")
    assert runner.count == 2


class ExplodingRunner:
    def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> CommandResult:
        raise RuntimeError("boom")


def test_probe_never_raises_even_when_the_runner_does() -> None:
    result = Probe(Settings(), runner=ExplodingRunner()).run("npu-smi", "info")
    assert not result.ok and "boom" in (result.error or "")


def test_probe_reads_files_under_root(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "x").write_text("hello")
    probe = Probe(Settings(root=tmp_path))
    assert probe.read_text("/etc/x") == "hello"
    assert probe.read_text("/etc/missing") is None
    assert probe.exists("/etc/x") and not probe.exists("/etc/y")
    assert probe.glob("/etc", "*") == ["x"]
    assert probe.glob("/nowhere", "*") == []


def test_a_timeout_kills_the_tools_children_too(tmp_path: Path) -> None:
    """A vendor tool that started a child holding its output: at the timeout the whole process group is killed,
    so the call returns instead of waiting on the child's pipe, and no child is left running."""
    pid_file = tmp_path / "child.pid"
    tool = tmp_path / "tool"
    tool.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\nsleep 300\n")
    tool.chmod(0o755)
    results: list[CommandResult] = []
    call = threading.Thread(target=lambda: results.append(SubprocessRunner("", {}).run([str(tool)], timeout=1.0)),
                            daemon=True)
    call.start()
    call.join(timeout=120)  # a hang detector, not a timing: the tool and its child would run 300 s
    assert results, "the call waited for the tool's child"
    assert results[0].returncode == RC_TIMEOUT and "timed out after 1 s" in (results[0].error or "")
    child = int(pid_file.read_text())
    for _ in range(50):
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        threading.Event().wait(0.1)
    else:
        raise AssertionError(f"the tool's child {child} still runs")
