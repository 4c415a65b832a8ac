"""The performance model: a regression guard on the calibration anchors and a few physical properties."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from npuops.plan.catalog import load_model, model_catalog
from npuops.plan.constants import perf_constants
from npuops.plan.performance import (
    PerfInputs,
    decode_step_s,
    expected_busiest,
    prefill_s,
    roofline,
    step_overhead_s,
)
from npuops.plan.quantization import expert_decode_factor

# Median |relative error| of TPOT over the published anchors (benchmarks/calibration.py). The model gives ~15% today;
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


def test_the_speculative_and_quantized_anchors_meet_the_goal() -> None:
    """The issue's goal over the S-rows: median output-throughput error <= 15%, none above 30%."""
    calibration = _calibration()
    rows = calibration.spec_quant_rows()
    throughput = [r for r in rows if r.metric == "output_tokens_per_s"]
    assert len(throughput) >= 20  # S1a-h, S2, S3a-b, S4a-d, S5, S6, S10, S22a-b
    goal = calibration.goal(rows)
    assert goal.met, goal.line()
    assert goal.line().startswith("goal PASS")


def test_the_goal_line_says_pass_or_miss() -> None:
    calibration = _calibration()

    def row(anchor: str, error: float) -> object:
        return calibration.Row(anchor, "output_tokens_per_s", 100.0 * (1 + error), 100.0)

    met = calibration.goal([row("A", 0.1), row("B", -0.2), row("C", 0.05), row("D", 0.02)])
    assert met.met and met.line().startswith("goal PASS") and "above 30%: none" in met.line()
    one_far = calibration.goal([row("A", 0.1), row("B", -0.35), row("C", 0.05)])
    assert not one_far.met and "B -35%" in one_far.line()
    wide = calibration.goal([row("A", 0.2), row("B", -0.25), row("C", 0.18)])
    assert not wide.met and wide.median == pytest.approx(0.2) and not wide.misses


def test_every_speculative_and_quantized_anchor_says_what_it_assumes_or_why_not_placed() -> None:
    calibration = _calibration()
    for anchor in calibration.SPEC_QUANT_ANCHORS:
        assert len(anchor.skip) > 20 if anchor.skip else len(anchor.assumed) > 20, anchor.id
        if anchor.baseline:
            base = next(a for a in calibration.SPEC_QUANT_ANCHORS if a.id == anchor.baseline)
            assert not base.speculative and not base.skip and base.model == anchor.model
    ids = [a.id for a in calibration.SPEC_QUANT_ANCHORS]
    assert len(ids) == len(set(ids))


def test_the_long_prompt_anchors_are_placed_and_their_decode_held() -> None:
    """The L-rows (long prompts at high concurrency) each say what they assume or why they are not placed; the ones
    on an A2 node (L5a-c, 8k prompts at 16-48 in flight) keep their TPOT within 30%, which the KV read and the
    serial MoE routing of interleaved prompts brought them to (from -15..-24%)."""
    calibration = _calibration()
    for anchor in calibration.LONG_ANCHORS:
        assert len(anchor.skip) > 20 if anchor.skip else len(anchor.assumed) > 20, anchor.id
    ids = [a.id for a in calibration.ANCHORS + calibration.SPEC_QUANT_ANCHORS + calibration.LONG_ANCHORS]
    assert len(ids) == len(set(ids))
    rows = calibration.all_rows(calibration.LONG_ANCHORS)
    a2 = [r for r in rows if r.anchor.startswith("L5") and r.metric == "tpot_ms"]
    assert len(a2) == 3 and all(abs(r.error) < 0.3 for r in a2), [(r.anchor, round(r.error, 3)) for r in a2]


def test_per_step_overhead_dominates_a_tp8_decode() -> None:
    """Bandwidth alone gives ~1.3 ms for Qwen3-8B on TP8, anchor C6 (vllm-ascend #6966) measures ~10 ms."""
    arch = model_catalog()["qwen3-8b"].spec.arch
    c = perf_constants()
    overhead = step_overhead_s(arch, 8, 1, "full_decode_only", "npu", c)
    bandwidth_only = 16.4e9 / 8 / 1.6e12
    assert overhead > 3 * bandwidth_only
    assert step_overhead_s(arch, 8, 1, "full_decode_only", "npu", c) > step_overhead_s(
        arch, 1, 1, "full_decode_only", "npu", c
    )
    assert step_overhead_s(arch, 1, 1, "eager", "npu", c) > step_overhead_s(arch, 1, 1, "full_decode_only", "npu", c)


def _perf(model: str, **fields: object) -> PerfInputs:
    """A plan's performance inputs for `model` on one A3 node (TP16), changed by `fields`."""
    from npuops.plan.inputs import PlanOptions, Workload
    from npuops.plan.planner import make_plan
    from npuops.plan.target import parse_hardware_spec

    plan = make_plan(load_model(model, fields.pop("quantization", None)),  # type: ignore[arg-type]
                     parse_hardware_spec("Ascend910x16"), Workload(1024, 1024, 8, None, "throughput"),
                     PlanOptions(tp=16, vllm_ascend_version="0.23.0"))
    return replace(plan.perf, **fields)  # type: ignore[arg-type]


def test_expected_busiest_device_of_expert_parallel() -> None:
    """The most experts any device is hit on: never fewer than the mean, at most all it holds; one device is the
    mean, and with every expert hit each device has all of its own."""
    assert expected_busiest(24, 0.0, 16) == pytest.approx(0.0)
    assert expected_busiest(24, 1.0, 16) == pytest.approx(24.0)
    assert expected_busiest(24, 0.1, 1) == pytest.approx(2.4)
    spread = [expected_busiest(24, 0.1, devices) for devices in (1, 2, 4, 16, 64)]
    assert spread == sorted(spread) and spread[-1] < 24.0


def test_expert_parallel_decode_waits_for_the_busiest_device() -> None:
    """With EP a decode step of a few sequences reads more than the mean share of experts (the device hit most),
    and the gap closes as the batch hits every expert; split experts (no EP) read exactly the mean."""
    ep = _perf("deepseek-v3", quantization="W8A8_DYNAMIC")
    assert ep.expert_parallel_size == 16
    split = replace(ep, expert_parallel_size=1)
    c = perf_constants()
    for batch in (1, 8):
        assert decode_step_s(ep, batch, c)[0] > decode_step_s(split, batch, c)[0]
    few = decode_step_s(ep, 1, c)[0] / decode_step_s(split, 1, c)[0]
    many = decode_step_s(ep, 4096, c)[0] / decode_step_s(split, 4096, c)[0]
    assert many == pytest.approx(1.0, rel=0.02) and few > many


def test_weight_only_int4_experts_decode_at_their_dequantized_cost() -> None:
    """W4A16 experts take half a byte in memory, but the grouped matmul converts them to bf16 first: decode reads
    cost what bf16 experts would (quantization.toml expert_decode_bytes), and the roofline keeps the real bytes."""
    assert expert_decode_factor("W4A16") == pytest.approx(4.0)
    assert expert_decode_factor("W8A8_DYNAMIC") == 1.0 and expert_decode_factor(None) == 1.0
    w4 = _perf("kimi-k2-instruct", quantization="W4A16")
    assert w4.expert_decode_factor == pytest.approx(4.0)
    c = perf_constants()
    cheap = replace(w4, expert_decode_factor=1.0)
    assert decode_step_s(w4, 8, c)[0] > decode_step_s(cheap, 8, c)[0]
    assert roofline(w4).decode_tokens_per_s == pytest.approx(roofline(cheap).decode_tokens_per_s)


def test_hybrid_and_moe_prefill_pay_a_cost_per_token() -> None:
    """Gated DeltaNet layers and MoE routing cost device time per prompt token beyond the matmuls' FLOPs; the linear
    attention part follows the value heads on a device (fewer with more TP), a dense full-attention model pays
    neither."""
    c = perf_constants()
    hybrid = _perf("qwen3.5-397b-a17b", quantization="W8A8", input_len=16384)  # compute-bound
    none = replace(c, moe_prefill_token_us=0.0, linear_attention_prefill_token_us=0.0)
    assert prefill_s(hybrid, c) > prefill_s(hybrid, none)
    extra = prefill_s(hybrid, c) - prefill_s(hybrid, none)
    arch = hybrid.arch
    per_token = arch.num_moe_layers * c.moe_prefill_token_us + arch.num_linear_layers * (
        arch.linear_num_value_heads / hybrid.tp * c.linear_attention_prefill_token_us)
    assert extra == pytest.approx(hybrid.input_len * per_token * 1e-6, rel=1e-6)
    wider = replace(hybrid, tp=32)
    assert prefill_s(wider, c) - prefill_s(wider, none) < extra
    dense = _perf("qwen3-32b", input_len=16384)
    assert prefill_s(dense, c) == pytest.approx(prefill_s(dense, none))
