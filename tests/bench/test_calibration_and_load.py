"""The load model (concurrency over replicas), the plan's stored performance inputs, and calibration."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from npuops.errors import BadInputError
from npuops.plan.calibration import CalibrationSample, CalibrationStore, fit
from npuops.plan.catalog import load_model
from npuops.plan.constants import perf_constants
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.performance import CalibrationFactors, PerfInputs, decode_step_s, predict, prefill_s
from npuops.plan.planner import make_plan
from npuops.plan.target import parse_hardware_spec
from npuops.plan.text import render_plan_text

STACK = {"vllm": "0.32.0+cpu", "vllm_ascend": None, "torch": "2.13.0+cpu", "torch_npu": None}


def claims_plan(concurrency: int = 1, **kw: object):  # type: ignore[no-untyped-def]
    """The scenario of docs/claims.md: LLaMA2-13B-Chat on 8 x 910B3, 512 in / 128 out tokens."""
    return make_plan(load_model("llama-2-13b-chat"), parse_hardware_spec("910B3x8"),
                     Workload(input_len=512, output_len=128, concurrency=concurrency), PlanOptions(), **kw)


def test_concurrency_one_over_eight_replicas_is_one_stream() -> None:
    """The issue's case: eight replicas at concurrency 1 serve one stream, not eight."""
    plan = claims_plan(1)
    assert plan.replica_count == 8
    p = plan.prediction
    assert p.busy_replicas == 1 and p.running_per_replica == 1 and p.queued_per_replica == 0
    one_stream = p.output_len / (p.e2e_ms / 1e3)
    assert p.output_tokens_per_s == pytest.approx(one_stream, rel=1e-6)
    text = " ".join(render_plan_text(plan).split())  # unwrapped
    assert "1 in flight" in text and "on 1 of 8 replicas (the others idle)" in text
    # Sixteen in flight keep every replica busy with two each: eight streams' worth and more.
    busy = claims_plan(16).prediction
    assert busy.busy_replicas == 8 and busy.running_per_replica == 2
    assert busy.output_tokens_per_s > 8 * p.output_tokens_per_s


def test_e2e_is_ttft_plus_the_other_tokens_decode_steps() -> None:
    p = claims_plan(4).prediction
    assert p.e2e_ms == pytest.approx(p.ttft_ms + (p.output_len - 1) * p.tpot_ms)
    assert p.requests_per_s == pytest.approx(p.output_tokens_per_s / p.output_len)


def test_perf_inputs_round_trip_through_json() -> None:
    perf = claims_plan(4).perf
    data = json.loads(json.dumps(perf.to_json()))
    assert PerfInputs.from_json(data) == perf
    moved = perf.for_load(input_len=64, output_len=8, concurrency=2, request_rate=None)
    assert (moved.input_len, moved.output_len, moved.concurrency, moved.tp) == (64, 8, 2, perf.tp)
    with pytest.raises(KeyError):
        PerfInputs.from_json({"kind": "npu"})


def test_fixed_lengths_in_a_closed_loop_run_in_waves() -> None:
    """A bench's load (fixed lengths, closed loop): the first prompt of a wave alone, the others in one step, then
    lockstep decode with no prompt in the step; throughput is the wave's requests over the wave's last one."""
    c = perf_constants()
    mixed = claims_plan(32).perf
    waves = replace(mixed, fixed_lengths=True)
    assert waves.in_waves and not mixed.in_waves
    p = predict(waves)
    running = p.running_per_replica
    assert running >= 3 and p.queued_per_replica == 0
    step, _ = decode_step_s(waves, running, c, interleave=False)
    assert p.tpot_ms == pytest.approx(step * 1e3)
    # No prompt rides in a wave's decode step: never slower than the mixed-length step that carries them, and
    # faster where those prompts make the step compute-bound.
    assert p.tpot_ms <= predict(mixed).tpot_ms
    long_prompts = replace(waves, input_len=4096, output_len=16)
    assert predict(long_prompts).tpot_ms < predict(replace(long_prompts, fixed_lengths=False)).tpot_ms
    alone, together = prefill_s(waves, c), prefill_s(waves, c, running - 1)
    assert together > alone  # the other prompts' compute, in one step
    # The API server takes a wave's requests in one after another: the middle one waits for (B + 1) / 2 overheads.
    assert p.ttft_ms == pytest.approx(c.request_overhead_ms * (running + 1) / 2 + (alone + together) * 1e3)
    last_ttft_ms = c.request_overhead_ms * running + (alone + together) * 1e3
    wave_s = (last_ttft_ms + (waves.output_len - 1) * p.tpot_ms) / 1e3
    assert p.output_tokens_per_s == pytest.approx(p.busy_replicas * running * waves.output_len / wave_s)
    assert p.e2e_ms == pytest.approx(p.ttft_ms + (waves.output_len - 1) * p.tpot_ms)
    # Two in flight: the medians halfway between the first request (prefilled alone) and the second.
    two = replace(waves, concurrency=2, replicas=1)
    pair = predict(two)
    together_one = prefill_s(two, c, 1.0)
    assert pair.ttft_ms == pytest.approx(c.request_overhead_ms * 1.5 + (prefill_s(two, c) + together_one / 2) * 1e3)
    pair_step, _ = decode_step_s(two, 2.0, c, interleave=False)
    assert pair.tpot_ms == pytest.approx((pair_step + together_one / 2 / (two.output_len - 1)) * 1e3)
    # One in flight: nothing to synchronize, the same as the mixed-length model.
    one = replace(waves, concurrency=1)
    assert predict(one).as_dict() == predict(replace(one, fixed_lengths=False)).as_dict()
    # A request rate is an open loop: no waves, fixed lengths or not.
    rated = replace(waves, request_rate=2.0)
    assert not rated.in_waves and predict(rated) == predict(replace(rated, fixed_lengths=False))


def test_the_plan_says_when_it_assumes_a_bench_load() -> None:
    plan = make_plan(load_model("llama-2-13b-chat"), parse_hardware_spec("910B3x8"),
                     Workload(input_len=512, output_len=128, concurrency=32, fixed_lengths=True), PlanOptions())
    assert plan.perf.fixed_lengths and plan.to_json()["workload"]["fixed_lengths"] is True
    assert "512 in / 128 out tokens exactly (in waves, as a bench sends them)" in " ".join(
        render_plan_text(plan).split())
    assert "exactly" not in render_plan_text(claims_plan(32))


def _sample(perf: PerfInputs, ttft_scale: float, step_scale: float, hardware: str = "910B3x8",
            stack: dict[str, str | None] | None = None, at: float = 1.0) -> CalibrationSample:
    base = predict(perf)
    measured = predict(perf, factors=CalibrationFactors(ttft=ttft_scale, step=step_scale))
    return CalibrationSample(hardware=hardware, stack=stack or STACK, model="llama-2-13b-chat", perf=perf,
                             ttft_ms=base.ttft_ms * ttft_scale, tpot_ms=base.tpot_ms * step_scale,
                             output_tokens_per_s=measured.output_tokens_per_s * 0.9, at=at)


def test_fit_recovers_the_measured_scales() -> None:
    perf = claims_plan(4).perf
    factors = fit([_sample(perf, 0.5, 2.0)])
    assert factors.ttft == pytest.approx(0.5) and factors.step == pytest.approx(2.0)
    assert factors.throughput == pytest.approx(0.9)
    # Two benches: the geometric mean, so a 2x and a 0.5x cancel.
    assert fit([_sample(perf, 2.0, 2.0), _sample(perf, 0.5, 0.5)]).step == pytest.approx(1.0)
    assert fit([]) == CalibrationFactors()
    # A stored sample without a positive TPOT (an older npuops stored one from a bursty stream) is left out rather
    # than turning the step factor to zero, or the logarithm into an error.
    zero = replace(_sample(perf, 0.5, 2.0), tpot_ms=0.0)
    assert fit([zero, _sample(perf, 0.5, 2.0)]).step == pytest.approx(2.0)
    assert fit([zero]) == CalibrationFactors()


def test_a_calibrated_plan_predicts_what_was_measured(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    plain = claims_plan(4)
    sample = _sample(plain.perf, 0.6, 1.7)
    store.add(sample)
    choice = store.choose("910B3x8", {**STACK, "npuops": "any"})
    assert choice.applied is not None and choice.applied.samples == 1
    calibrated = claims_plan(4, calibration=choice)
    p = calibrated.prediction
    assert p.ttft_ms == pytest.approx(sample.ttft_ms, rel=1e-6)
    assert p.tpot_ms == pytest.approx(sample.tpot_ms, rel=1e-6)
    assert p.output_tokens_per_s == pytest.approx(sample.output_tokens_per_s, rel=1e-6)
    assert calibrated.explanation("calibration").value == "applied"
    assert "--no-calibration ignores it" in calibrated.explanation("calibration").why
    data = calibrated.to_json()["calibration"]
    assert data["applied"]["step_factor"] == pytest.approx(1.7, rel=1e-3)
    assert data["uncalibrated_prediction"] == plain.prediction.as_dict()


def test_a_calibration_of_another_stack_or_node_does_not_apply(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    store.add(_sample(claims_plan(4).perf, 0.6, 1.7))
    other = store.choose("910B3x8", {**STACK, "vllm": "0.33.0+cpu"})
    assert other.applied is None and "other stacks only" in other.why and "vllm 0.32.0+cpu" in other.why
    unknown = store.choose("910B4x8", STACK)
    assert unknown.applied is None and "no bench of 910B4x8" in unknown.why
    assert claims_plan(4, calibration=other).prediction == claims_plan(4).prediction


def test_the_store_keeps_the_newest_samples_per_node(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    perf = claims_plan(4).perf
    for i in range(25):
        store.add(_sample(perf, 1.0, 1.0 + i / 100, at=float(i)))
    store.add(_sample(perf, 1.0, 1.0, hardware="910B4x8"))
    samples = store.samples()
    assert len([s for s in samples if s.hardware == "910B3x8"]) == 20
    assert min(s.at for s in samples if s.hardware == "910B3x8") == 5.0
    assert any(s.hardware == "910B4x8" for s in samples)
    assert (tmp_path / "calibration.json").stat().st_mode & 0o777 == 0o644


def test_a_damaged_calibration_file_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "calibration.json").write_text("{not json")
    with pytest.raises(BadInputError, match=r"not a calibration file npuops wrote.*--no-calibration"):
        CalibrationStore(tmp_path).samples()


def test_request_rate_samples_leave_the_throughput_factor_alone() -> None:
    perf = replace(claims_plan(4).perf, request_rate=0.5)
    assert fit([_sample(perf, 1.0, 1.0)]).throughput == 1.0
