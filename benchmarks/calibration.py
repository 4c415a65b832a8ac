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
from npuops.plan.planner import make_plan
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


@dataclass(frozen=True)
class Row:
    anchor: str
    metric: str
    predicted: float
    published: float

    @property
    def error(self) -> float:
        return (self.predicted - self.published) / self.published


def evaluate(anchor: Anchor) -> list[Row]:
    model = load_model(anchor.model)
    target = parse_hardware_spec(anchor.hardware)
    workload = Workload(anchor.input_len, anchor.output_len, anchor.concurrency, None, "throughput")
    # vLLM's defaults of the time: up to 256 running sequences, and a 2048-token step budget for online serving
    # on devices under 70 GiB (vLLM's EngineArgs default before the 0.11 series raised it).
    batched = 2048 if parse_release(anchor.release) < parse_release("0.11.0") else None
    options = PlanOptions(
        tp=anchor.tp, vllm_ascend_version=anchor.release, max_num_seqs=256, max_num_batched_tokens=batched
    )
    plan = make_plan(model, target, workload, options)
    predicted = plan.prediction.as_dict()
    return [Row(anchor.id, metric, float(predicted[metric]), value) for metric, value in anchor.published.items()]


def all_rows() -> list[Row]:
    rows: list[Row] = []
    for anchor in ANCHORS:
        if not anchor.skip:
            rows.extend(evaluate(anchor))
    return rows


def median_abs_error(rows: list[Row], metric: str) -> float:
    return statistics.median(abs(r.error) for r in rows if r.metric == metric)


def main() -> int:
    rows = all_rows()
    print(f"{'anchor':7} {'metric':20} {'predicted':>10} {'published':>10} {'error':>8}")
    for row in rows:
        print(f"{row.anchor:7} {row.metric:20} {row.predicted:10.1f} {row.published:10.1f} {row.error:+8.0%}")
    for anchor in ANCHORS:
        if anchor.skip:
            print(f"{anchor.id:7} skipped: {anchor.skip}")
    print()
    for anchor in ANCHORS:
        if anchor.assumed:
            print(f"{anchor.id:7} assumed: {anchor.assumed}")
    print()
    for metric in ("tpot_ms", "ttft_ms", "output_tokens_per_s"):
        errors = [abs(r.error) for r in rows if r.metric == metric]
        if errors:
            print(
                f"{metric:20} median |error| {statistics.median(errors):5.0%}   max |error| {max(errors):5.0%}"
                f"   ({len(errors)} anchors)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
