"""A chip that fails under a serving engine: the supervisor asks, at most every chip_interval_s, the start gate's own
chip-health check about the instance's chips (`npu-smi info`, here a script replaying a real capture with one health
cell changed); a chip in Alarm or Critical makes the instance degraded, names the chip in `status`, takes a replica
out of its router, and a chip back to OK undoes it. The start gate refusing such a chip is
tests/checks/test_chips.py's (chip-health is a gate-npu check)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from npuops.instance.record import InstanceRecord, read_status
from npuops.instance.state import Stage
from npuops.instance.status import summarize
from npuops.service import supervisor as supervisor_module
from npuops.service.gate import chip_watch
from npuops.service.notify import Notifier
from npuops.service.supervisor import Supervisor, SupervisorOptions
from npuops.settings import Settings
from tests.checks.test_chips import B2C, derived
from tests.support.captures import capture
from tests.support.instance_records import make_record

ALARM_CELL = ("| OK            |", "| Alarm         |")  # NPU 4, the 910B2C capture's first chip


def _replaying_npu_smi(directory: Path, text: str) -> Path:
    """An `npu-smi` that prints a recorded `npu-smi info` whatever it is asked (the chip-health check asks `info`)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "npu-smi-info.txt").write_text(text)
    script = directory / "npu-smi"
    script.write_text(f"#!/bin/sh\nexec cat {directory / 'npu-smi-info.txt'}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _npu_record(tmp_path: Path, **overrides: Any) -> InstanceRecord:
    values: dict[str, Any] = {"target_kind": "npu", "hardware_label": "910B2Cx4", "devices": (4, 5), **overrides}
    return make_record(tmp_path / "state", **values)


def test_the_watch_names_a_chip_of_the_instance_in_alarm(tmp_path: Path, fake_root: Path) -> None:
    npu_smi = _replaying_npu_smi(tmp_path / "bin", derived(capture(B2C), *ALARM_CELL))
    watch = chip_watch(_npu_record(tmp_path), Settings(root=fake_root, npu_smi=str(npu_smi)))
    assert watch is not None
    problem = watch()
    assert problem is not None and "NPU 4 chip 0 (device 4, bus 0000:DA:00.0) is 'Alarm'" in problem
    (tmp_path / "bin" / "npu-smi-info.txt").write_text(capture(B2C))  # the chip is back to OK
    assert watch() is None


def test_an_alarm_on_a_chip_the_instance_does_not_use_does_not_degrade_it(tmp_path: Path, fake_root: Path) -> None:
    npu_smi = _replaying_npu_smi(tmp_path / "bin", derived(capture(B2C), *ALARM_CELL))
    watch = chip_watch(_npu_record(tmp_path, devices=(6,)), Settings(root=fake_root, npu_smi=str(npu_smi)))
    assert watch is not None and watch() is None  # the gate only warns of it: another launch's chip


def test_no_watch_where_there_is_no_chip(tmp_path: Path, fake_root: Path) -> None:
    assert chip_watch(make_record(tmp_path / "state"), Settings(root=fake_root)) is None  # the CPU engine


def test_the_supervisor_degrades_names_the_chip_and_takes_the_replica_out_of_its_router(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    changes: list[str] = []
    monkeypatch.setattr(supervisor_module, "leave_router", lambda record, key: changes.append("leave"))
    monkeypatch.setattr(supervisor_module, "join_router", lambda record, key: changes.append("join"))
    monkeypatch.setattr(supervisor_module, "held_out_of_router", lambda record: None)
    answers = iter(["NPU 4 chip 0 (device 4, bus 0000:DA:00.0) is 'Alarm'", None])
    record = _npu_record(tmp_path, manager="foreground", behind="demo-router")
    os.makedirs(Path(record.status_file).parent, exist_ok=True)
    supervisor = Supervisor(record, {}, SupervisorOptions(chip_probe=lambda: next(answers), chip_interval_s=0.0),
                            notifier=Notifier(None))
    supervisor._set_stage(Stage.HEALTHY, "answers /health")
    supervisor._watch_chips()
    state = read_status(record)
    assert state is not None and state.stage == Stage.DEGRADED
    assert summarize(record, None, state, healthy=True) == (
        "degraded: NPU 4 chip 0 (device 4, bus 0000:DA:00.0) is 'Alarm'")
    assert changes == ["leave"]
    supervisor._watch_chips()
    state = read_status(record)
    assert state is not None and state.stage == Stage.HEALTHY
    assert summarize(record, None, state, healthy=True) == "healthy"
    assert changes == ["leave", "join"]


def test_the_chips_are_asked_at_most_every_interval(tmp_path: Path) -> None:
    asked: list[int] = []

    def probe() -> None:
        asked.append(1)

    record = _npu_record(tmp_path, manager="foreground")
    os.makedirs(Path(record.status_file).parent, exist_ok=True)
    supervisor = Supervisor(record, {}, SupervisorOptions(chip_probe=probe, chip_interval_s=3600.0),
                            notifier=Notifier(None))
    supervisor._set_stage(Stage.HEALTHY, "answers /health")
    for _ in range(3):
        supervisor._watch_chips()
    assert len(asked) == 1
