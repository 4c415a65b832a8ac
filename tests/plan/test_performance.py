"""The performance model: a regression guard on the calibration anchors and a few physical properties."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from npuops.plan.catalog import model_catalog
from npuops.plan.constants import perf_constants
from npuops.plan.performance import step_overhead_s

# Median |relative error| of TPOT over the published anchors (perf-anchors.md). The model gives ~15% today;
# the bound leaves room for honest recalibration but catches a change that breaks the model.
TPOT_MEDIAN_ERROR_BOUND = 0.25


def _calibration() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "calibration.py"
    spec = importlib.util.spec_from_file_location("npuops_calibration", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_tpot_median_error_over_the_anchors() -> None:
    calibration = _calibration()
    rows = calibration.all_rows()
    tpot_rows = [r for r in rows if r.metric == "tpot_ms"]
    assert len(tpot_rows) >= 8  # every anchor the model can place is evaluated
    assert calibration.median_abs_error(rows, "tpot_ms") < TPOT_MEDIAN_ERROR_BOUND


def test_skipped_anchors_say_why() -> None:
    calibration = _calibration()
    skipped = [a for a in calibration.ANCHORS if a.skip]
    assert {a.id for a in skipped} <= {"C8", "C10"}
    assert all(len(a.skip) > 20 for a in skipped)


def test_per_step_overhead_dominates_a_tp8_decode() -> None:
    """perf-anchors.md: bandwidth alone gives ~1.3 ms for Qwen3-8B on TP8, C6 measures ~10 ms."""
    arch = model_catalog()["qwen3-8b"].spec.arch
    c = perf_constants()
    overhead = step_overhead_s(arch, 8, 1, "full_decode_only", "npu", c)
    bandwidth_only = 16.4e9 / 8 / 1.6e12
    assert overhead > 3 * bandwidth_only
    assert step_overhead_s(arch, 8, 1, "full_decode_only", "npu", c) > step_overhead_s(
        arch, 1, 1, "full_decode_only", "npu", c
    )
    assert step_overhead_s(arch, 1, 1, "eager", "npu", c) > step_overhead_s(arch, 1, 1, "full_decode_only", "npu", c)
