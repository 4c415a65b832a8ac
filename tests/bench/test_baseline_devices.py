"""The plain-PyTorch baseline on an NPU instance: its chips are freed (the unit stopped) and it is started again."""

from __future__ import annotations

from pathlib import Path

import pytest

from npuops.bench.baseline import free_devices_for_baseline
from npuops.errors import UsageError
from npuops.instance.manager import SystemdManager, UnitState
from npuops.instance.record import InstanceRecord
from npuops.settings import Settings


class RecordingManager(SystemdManager):
    """systemctl as seen by npuops: every call recorded, units inactive once stopped."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(["systemctl"], tmp)
        self.calls: list[tuple[str, str]] = []

    def unavailable_reason(self) -> str | None:
        return None

    def stop(self, unit: str, timeout: float | None = None) -> None:
        self.calls.append(("stop", unit))

    def start(self, unit: str) -> None:
        self.calls.append(("start", unit))

    def state(self, unit: str) -> UnitState:
        return UnitState("inactive", "dead", None, "", 0, "success", "enabled", "loaded")


def record(tmp_path: Path, kind: str, manager: str = "systemd") -> InstanceRecord:
    return InstanceRecord(
        name="q", manager=manager, unit="npuops-q.service", model_path="/m", served_model_name="q", host="127.0.0.1",
        port=9, devices=(0, 1) if kind == "npu" else (), target_kind=kind, hardware_label="910B3x2",
        vllm_command=("/v/bin/vllm", "serve"), instance_dir=str(tmp_path / "q"), status_file=str(tmp_path / "s"),
        timeout_start_s=1, watchdog_s=60, stop_timeout_s=5, gpu_memory_utilization=0.9, graph_mode=True)


def test_an_npu_instance_is_stopped_for_the_baseline_and_started_after(tmp_path: Path) -> None:
    manager, lines = RecordingManager(tmp_path), []
    with free_devices_for_baseline(Settings(), record(tmp_path, "npu"), lines.append, manager):
        assert manager.calls == [("stop", "npuops-q.service")]
    assert manager.calls[-1] == ("start", "npuops-q.service")
    assert "free devices 0,1" in lines[0] and "starting q again" in lines[1]


def test_it_is_started_again_when_the_baseline_fails(tmp_path: Path) -> None:
    manager = RecordingManager(tmp_path)
    with pytest.raises(RuntimeError), free_devices_for_baseline(Settings(), record(tmp_path, "npu"), print, manager):
        raise RuntimeError("out of memory")
    assert manager.calls == [("stop", "npuops-q.service"), ("start", "npuops-q.service")]


def test_the_cpu_engine_keeps_running_and_a_foreground_npu_run_is_refused(tmp_path: Path) -> None:
    manager = RecordingManager(tmp_path)
    with free_devices_for_baseline(Settings(), record(tmp_path, "cpu"), print, manager):
        pass
    assert manager.calls == []
    with pytest.raises(UsageError, match="--foreground"), free_devices_for_baseline(
            Settings(), record(tmp_path, "npu", manager="foreground"), print, manager):
        pass
