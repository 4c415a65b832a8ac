"""The host's dense matmul rate (npuops/hardware/matmul_rate.py): its script's output parsed, kept with the
calibration, and what the CPU plan makes of it. The measurement itself in a serving stack with torch runs in
tests/engine/test_plan_predicts_bench.py; here, in npuops' own interpreter, which has none. What a plan makes of
the rates: tests/plan/test_cpu_rules.py."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from npuops.errors import BadInputError
from npuops.hardware.matmul_rate import MeasuredMatmul, measure_matmul_rates, parse_measurement
from npuops.hardware.probe import Probe
from npuops.parsing import ParseError
from npuops.plan.calibration import CalibrationStore
from npuops.settings import Settings

# The script's line on the Zen 5 test machine (2026-12-05, the engine venv's torch, two busy loops beside it).
ZEN5_LINE = ('{"torch": "2.13.0+cpu", "threads": 2, "cores": 2, "shape": [512, 2048, 2048], "rates": {"float32": '
             '232390320524.06244, "bfloat16": 1023633716677.8766}, "all_threads": {"float32": 213414368493.04843, '
             '"bfloat16": 796600347693.8112}, "one_thread": {"float32": 116195160262.03122, "bfloat16": '
             '511816858338.9383}}')


def test_the_scripts_line_gives_the_rates_by_dtype_and_how() -> None:
    measured = parse_measurement("a warning torch printed\n" + ZEN5_LINE + "\n", at=0.0)
    assert measured.rates == {"float32": 232390320524.06244, "bfloat16": 1023633716677.8766}
    assert measured.threads == 2
    assert measured.how == ("torch 2.13.0+cpu linear 512x2048->2048 by CPU time: 2 threads, or one thread x 2 "
                            "cores, best of 5")
    # A share of the host (a prefill/decode pool's engine) gets its share of the rate.
    assert measured.rate("bfloat16", 1) == pytest.approx(1023633716677.8766 / 2)
    assert measured.rate("float16", 2) is None
    assert measured.describe("bfloat16").startswith("1024 GFLOP/s measured on this host 1970-01-01 (torch 2.13")


@pytest.mark.parametrize("text", [
    "", "Traceback (most recent call last):", '{"threads": 2}', '{"threads": 0, "rates": {}}',
    '{"threads": true, "rates": {}}', '{"threads": 2, "rates": {"float32": -1}}',
    '{"threads": 2, "rates": {"int8": 1e9}}', '{"threads": 2, "rates": {"float32": "fast"}}', "[1, 2]",
])
def test_garbage_from_the_script_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError, match="cannot parse matmul measurement"):
        parse_measurement(text, at=0.0)


def test_the_rates_are_kept_with_the_calibration_and_a_bad_entry_is_named(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    label = "cpu (2 CPUs, 24 GiB RAM, 1 NUMA)"
    assert store.host_matmul(label) is None
    measured = parse_measurement(ZEN5_LINE, at=1.0)
    store.keep_host_matmul(label, measured)
    assert store.host_matmul(label) == measured and store.host_matmul("cpu (other)") is None
    data = json.loads(store.path.read_text())
    data["host_matmul_rate"][label]["rates"]["bfloat16"] = 0
    store.path.write_text(json.dumps(data))
    with pytest.raises(BadInputError, match="is not a calibration file npuops wrote"):
        store.host_matmul(label)
    store.path.write_text('{"samples": [], "host_matmul_rate": {"' + label + '": []}}')
    with pytest.raises(BadInputError, match="is not a calibration file npuops wrote"):
        store.host_matmul(label)


def test_a_stack_without_torch_measures_nothing_and_says_why(tmp_path: Path) -> None:
    outcome = measure_matmul_rates(Probe(Settings(stack_python=sys.executable, state_dir=tmp_path)))
    assert outcome.measured is None and outcome.why_not == "the serving stack has no torch"


def test_a_kept_measurement_reads_back_as_it_was_written() -> None:
    measured = parse_measurement(ZEN5_LINE, at=123.0)
    assert MeasuredMatmul.from_json(json.loads(json.dumps(measured.to_json()))) == measured
    with pytest.raises(ValueError):
        MeasuredMatmul.from_json({**measured.to_json(), "threads": 0})
    assert dataclasses.replace(measured, at=5.0) != measured
