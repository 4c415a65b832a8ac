"""Predicted versus published: the performance model of `npuops plan` against every anchor in perf-anchors.md.

Run: `python benchmarks/calibration.py` (from the repository root). Each anchor is planned with make_plan on the
published hardware, parallel size and vllm-ascend release, then the plan's prediction is compared with the
published number. Rows the model cannot place are listed as skipped, with the reason. The constants come from
npuops/data/perf_model.toml and are shared by all anchors; nothing here is tuned per anchor.

Workload assumptions where the source does not state them are written next to the anchor (`assumed`).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npuops.plan.catalog import load_model
from npuops.plan.environment import parse_release
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.performance import CalibrationFactors, predict
from npuops.plan.planner import make_plan
from npuops.plan.result import Plan
from npuops.plan.target import parse_hardware_spec

# ShareGPT as vLLM's benchmark samples it: ~230 prompt tokens per ~213 output tokens on average; the ratio is
# what C1's published totals imply (3143.9 total / 1512.2 output tok/s = 1.08 input per output token).
SHAREGPT_IN, SHAREGPT_OUT = 230, 213


@dataclass(frozen=True)
class Anchor:
    id: str
    model: str
    hardware: str
    tp: int
    release: str
    input_len: int
    output_len: int
    concurrency: int
    published: dict[str, float]  # metric -> value: "tpot_ms", "ttft_ms", "output_tokens_per_s"
    assumed: str = ""
    skip: str = ""
    # Speculative and quantized configurations (the S anchors): as the source ran them. A published acceptance
    # rate is an input of the prediction (the share of drafts a workload accepts), not a result it is scored on.
    quantization: str | None = None
    speculative: str | None = None
    acceptance: float | None = None
    replicas: int | None = None
    max_num_seqs: int = 256
    # The same source's run without speculation on the same node: its measured/predicted decode step and
    # throughput calibrate this anchor's prediction, as `npuops bench` calibrates a node (what is scored is then
    # what speculation changes, not the node's own speed).
    baseline: str | None = None
    # Every request exactly input_len / output_len (a fixed-length benchmark): a closed loop runs in waves.
    fixed_lengths: bool = False


ANCHORS: tuple[Anchor, ...] = (
    Anchor(
        "C1",
        "qwen3-8b",
        "910B3x1",
        1,
        "0.9.1",
        SHAREGPT_IN,
        SHAREGPT_OUT,
        1000,
        {"tpot_ms": 125.1, "output_tokens_per_s": 1512.2},
        "ShareGPT mean lengths; rate inf over 1000 prompts = 1000 in flight; 910B read as 910B3",
    ),
    Anchor(
        "C2",
        "qwen3-8b",
        "910B3x1",
        1,
        "0.9.1",
        4000,
        200,
        500,
        {"tpot_ms": 99.3, "output_tokens_per_s": 365.0},
        "rate inf over 500 prompts; 910B read as 910B3",
    ),
    Anchor(
        "C3",
        "qwen3-8b",
        "910B3x1",
        1,
        "0.9.1",
        2000,
        100,
        500,
        {"tpot_ms": 140.4},
        "prompt count not published, 500 as in C2; 910B read as 910B3",
    ),
    Anchor(
        "C4",
        "qwen3-8b",
        "910B3x1",
        1,
        "0.9.1",
        32000,
        100,
        100,
        {"tpot_ms": 344.0},
        "rate inf over 100 prompts; 910B read as 910B3",
    ),
    Anchor(
        "C5",
        "qwen3-30b-a3b",
        "910B3x2",
        2,
        "0.9.1",
        SHAREGPT_IN,
        SHAREGPT_OUT,
        4,
        {"ttft_ms": 360.0, "tpot_ms": 122.7, "output_tokens_per_s": 32.2},
        "ShareGPT mean lengths; 910B read as 910B3",
    ),
    Anchor(
        "C6",
        "qwen3-8b",
        "910B3x8",
        8,
        "0.23.0",
        64,
        128,
        1,
        {"ttft_ms": 71.7, "tpot_ms": 9.90},
        "vllm-ascend main of 2026-03 read as the latest release; CPU binding on",
    ),
    Anchor(
        "C7a",
        "qwen2.5-7b-instruct",
        "910B3x1",
        1,
        "0.7.3",
        128,
        128,
        1,
        {"ttft_ms": 86.6, "tpot_ms": 32.6},
        "benchmark workload not published: single stream, 128/128",
    ),
    Anchor(
        "C7b",
        "qwen2.5-7b-instruct",
        "910B3x1",
        1,
        "0.9.0rc1",
        128,
        128,
        1,
        {"ttft_ms": 48.0, "tpot_ms": 22.4},
        "benchmark workload not published: single stream, 128/128",
    ),
    Anchor(
        "C8",
        "qwen2.5-7b-instruct",
        "910B3x1",
        1,
        "0.7.3",
        0,
        0,
        0,
        {},
        skip="Qwen2.5-VL-7B: the LM part is Qwen2.5-7B, but the prompts' image-token counts are not published, "
        "so no input length can be placed",
    ),
    Anchor(
        "C9",
        "qwen3-30b-a3b",
        "910B2x2",
        2,
        "0.9.2rc1",
        128,
        512,
        1,
        {"tpot_ms": 1000 / 29.2},
        "single stream 29.2 tok/s read as TPOT = 1/29.2 s; lengths not published",
    ),
    Anchor(
        "C10",
        "glm-4.5v",
        "910B4x4",
        4,
        "0.11.0",
        0,
        0,
        0,
        {},
        skip="GLM-4.5V's language model (GLM-4.5-Air, 106B MoE) is not in the catalog and its config.json "
        "could not be verified from the stored sources",
    ),
)


def _s1(letter: str, dataset: str, concurrency: int, input_len: int, output_len: int,
        baseline: tuple[float, float], suffix: tuple[float, float], acceptance: float) -> tuple[Anchor, Anchor]:
    """One row of vllm-ascend's suffix-decoding tutorial: Qwen3-32B TP4 on one Atlas 800T A2 (4 cards), image
    v0.13.0rc1, AISBench at temperature 0; the row gives the dataset's mean lengths and (TPOT ms, output tok/s)
    without (the baseline, S1x0) and with suffix decoding k=3 (S1x), and the acceptance it measured."""
    assumed = f"{dataset} mean lengths; Atlas 800T A2 read as 910B3; image v0.13.0rc1 read as 0.13.0"

    def anchor(anchor_id: str, figures: tuple[float, float], speculative: str | None = None,
               spec_of: str | None = None) -> Anchor:
        return Anchor(anchor_id, "qwen3-32b", "910B3x4", 4, "0.13.0", input_len, output_len, concurrency,
                      {"tpot_ms": figures[0], "output_tokens_per_s": figures[1]}, assumed, speculative=speculative,
                      acceptance=acceptance if speculative else None, baseline=spec_of)

    return (anchor(f"S1{letter}0", baseline),
            anchor(f"S1{letter}", suffix, "suffix:3", f"S1{letter}0"))


# Source of S1: vllm-project/vllm-ascend docs/source/tutorials/features/suffix_speculative_decoding.md (commit
# be5b66de, PR #6323). S10: vllm-ascend issue #16637. The speculative and quantized rows of vllm-ascend's nightly
# CI configs (tests/e2e/nightly/...) are deliberately not used: they are kept aside to score the model.
SPEC_QUANT_ANCHORS: tuple[Anchor, ...] = (
    *_s1("a", "GSM8K", 1, 67, 1570, (55.5, 18.0), (35.7, 28.5), 0.311),
    *_s1("b", "HumanEval", 1, 150, 2700, (55.1, 18.1), (37.9, 26.3), 0.270),
    *_s1("c", "ShareGPT", 1, 666, 231, (54.1, 18.3), (39.2, 24.1), 0.239),
    *_s1("d", "AGIEval", 1, 735, 1880, (53.1, 18.7), (31.8, 34.1), 0.503),
    *_s1("e", "AGIEval", 34, 735, 1880, (70.0, 494.6), (50.2, 768.4), 0.503),
    *_s1("f", "ARC", 15, 76, 960, (59.8, 245.8), (48.9, 311.7), 0.239),
    *_s1("g", "SuperGLUE_BoolQ", 32, 207, 314, (62.7, 396.4), (47.8, 507.5), 0.334),
    *_s1("h", "HumanEval", 26, 150, 2700, (64.7, 403.8), (50.9, 519.2), 0.270),
    Anchor("S10", "qwen3.5-27b", "910B4x4", 2, "0.26.0rc1", 2048, 256, 16,
           {"tpot_ms": 24.7, "output_tokens_per_s": 333.0},
           "DP2 x TP2 as two replicas of TP2; 32 sequences per engine; 'fixed 2048-in/256-out' as waves; acceptance "
           "not published (the MTP default)",
           quantization="W8A8", speculative="mtp:3", replicas=2, max_num_seqs=32, fixed_lengths=True),
)


@dataclass(frozen=True)
class Row:
    anchor: str
    metric: str
    predicted: float
    published: float

    @property
    def error(self) -> float:
        return (self.predicted - self.published) / self.published


def _plan(anchor: Anchor) -> Plan:
    model = load_model(anchor.model, anchor.quantization)
    target = parse_hardware_spec(anchor.hardware)
    workload = Workload(anchor.input_len, anchor.output_len, anchor.concurrency, None, "throughput",
                        fixed_lengths=anchor.fixed_lengths)
    # vLLM's defaults of the time: up to 256 running sequences, and a 2048-token step budget for online serving
    # on devices under 70 GiB (vLLM's EngineArgs default before the 0.11 series raised it).
    batched = 2048 if parse_release(anchor.release) < parse_release("0.11.0") else None
    options = PlanOptions(
        tp=anchor.tp, vllm_ascend_version=anchor.release, max_num_seqs=anchor.max_num_seqs,
        max_num_batched_tokens=batched, speculative=anchor.speculative or "none", spec_acceptance=anchor.acceptance,
        replicas=anchor.replicas,
    )
    return make_plan(model, target, workload, options)


def _factors(anchor: Anchor) -> CalibrationFactors:
    """The baseline anchor's measured / predicted step and throughput (1.0 without a baseline)."""
    if anchor.baseline is None:
        return CalibrationFactors()
    base = next(a for a in SPEC_QUANT_ANCHORS if a.id == anchor.baseline)
    plan = _plan(base)
    step = base.published["tpot_ms"] / plan.prediction.tpot_ms
    stepped = predict(plan.perf, factors=CalibrationFactors(step=step))
    return CalibrationFactors(step=step, throughput=base.published["output_tokens_per_s"] /
                              stepped.output_tokens_per_s)


def evaluate(anchor: Anchor) -> list[Row]:
    plan = _plan(anchor)
    predicted = predict(plan.perf, factors=_factors(anchor)).as_dict()
    return [Row(anchor.id, metric, float(predicted[metric]), value) for metric, value in anchor.published.items()]


def all_rows(anchors: tuple[Anchor, ...] = ANCHORS) -> list[Row]:
    rows: list[Row] = []
    for anchor in anchors:
        if not anchor.skip:
            rows.extend(evaluate(anchor))
    return rows


def median_abs_error(rows: list[Row], metric: str) -> float:
    return statistics.median(abs(r.error) for r in rows if r.metric == metric)


def _print_rows(rows: list[Row]) -> None:
    print(f"{'anchor':7} {'metric':20} {'predicted':>10} {'published':>10} {'error':>8}")
    for row in rows:
        print(f"{row.anchor:7} {row.metric:20} {row.predicted:10.1f} {row.published:10.1f} {row.error:+8.0%}")


def _print_summary(rows: list[Row]) -> None:
    for metric in ("tpot_ms", "ttft_ms", "output_tokens_per_s"):
        errors = [abs(r.error) for r in rows if r.metric == metric]
        if errors:
            print(
                f"{metric:20} median |error| {statistics.median(errors):5.0%}   max |error| {max(errors):5.0%}"
                f"   ({len(errors)} anchors)"
            )


def main() -> int:
    rows = all_rows()
    _print_rows(rows)
    for anchor in ANCHORS:
        if anchor.skip:
            print(f"{anchor.id:7} skipped: {anchor.skip}")
    print()
    for anchor in ANCHORS:
        if anchor.assumed:
            print(f"{anchor.id:7} assumed: {anchor.assumed}")
    print()
    _print_summary(rows)
    print("\nSpeculative and quantized configurations (goal: median throughput error <= 15%, none above 30%):")
    baselines = {a.baseline for a in SPEC_QUANT_ANCHORS if a.baseline}
    spec_rows = [r for r in all_rows(SPEC_QUANT_ANCHORS) if r.anchor not in baselines]
    _print_rows(spec_rows)
    for anchor in SPEC_QUANT_ANCHORS:
        if anchor.assumed:
            print(f"{anchor.id:7} assumed: {anchor.assumed}")
    _print_summary(spec_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
