"""Predicted versus published: the performance model of `npuops plan` against every published anchor (ANCHORS,
C1-C10, each with its source above the table), then against published speculative and quantized configurations
(SPEC_QUANT_ANCHORS, S-rows), then against long prompts at high concurrency (LONG_ANCHORS, L-rows).

Run: `python benchmarks/calibration.py` (from the repository root). Each anchor is planned with make_plan on the
published hardware, parallel size and vllm-ascend release (and the source's graph mode, draft model, quantization
and KV cache), then the plan's prediction is compared with the published number. Rows the model cannot place are
listed as skipped, with the reason. The constants come from npuops/data/perf_model.toml and are shared by all
anchors; nothing here is tuned per anchor. The last line says whether the issue's goal for the S-rows (output
throughput: median |error| <= 15%, none above 30%) is met: PASS or MISS, with the rows that miss.

Workload assumptions where the source does not state them are written next to the anchor (`assumed`).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npuops.plan.catalog import load_model
from npuops.plan.environment import parse_release
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.model import ModelSpec, arch_from_config, weight_bytes_from_arch
from npuops.plan.performance import CalibrationFactors, PerfInputs, predict
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
    # The draft model of a draft-model method: a catalog name or a key of DRAFTS (a cited config.json).
    draft: str | None = None
    kv_cache: str | None = None  # "C8": the checkpoint stores its KV cache in int8
    max_num_batched_tokens: int | None = None  # as the source's server ran (None: vLLM's default of the release)
    request_rate: float | None = None  # requests/s of an open-loop run (None: a closed loop at `concurrency`)
    # The graph mode the source ran, where it differs from the plan's (None: the plan's). A plan pins
    # FULL_DECODE_ONLY from 0.11.0; a server that sets no cudagraph_mode runs its release's default, which
    # vllm-ascend turned from vLLM's FULL_AND_PIECEWISE into PIECEWISE up to 0.22 (vllm_ascend/platform.py,
    # check_and_update_config, at v0.13.0 .. v0.20.2rc1) and keeps for decode from 0.23.0.
    graph_mode: str | None = None
    nodes: int = 1  # nodes of `hardware` each (one data-parallel deployment over all of them)
    # The source's expert-parallel group where it differs from the plan's: 1 = every expert split over the TP group
    # (no --enable-expert-parallel); N = whole experts over N devices (vLLM's DP ranks of one server share it).
    expert_parallel_size: int | None = None


# Sources: C1-C4 GPUStack's performance lab, github.com/gpustack/gpustack docs/performance-lab/qwen3-8b/910b.md;
# C5 the same lab's docs/performance-lab/qwen3-30b-a3b/910b.md; C6 vllm-ascend issue #6966 (the CPU binding RFC:
# TTFT 71.7 ms, TPOT 9.90 ms with binding, 11.78 ms without); C7 issue #904 and PR #878; C8 issue #776; C9 issue
# #2328; C10 issue #4120 (all github.com/vllm-project/vllm-ascend).
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
    assumed = (f"{dataset} mean lengths; Atlas 800T A2 read as 910B3; image v0.13.0rc1 read as 0.13.0; graph mode "
               "not set: the release's PIECEWISE")

    def anchor(anchor_id: str, figures: tuple[float, float], speculative: str | None = None,
               spec_of: str | None = None) -> Anchor:
        return Anchor(anchor_id, "qwen3-32b", "910B3x4", 4, "0.13.0", input_len, output_len, concurrency,
                      {"tpot_ms": figures[0], "output_tokens_per_s": figures[1]}, assumed, speculative=speculative,
                      acceptance=acceptance if speculative else None, baseline=spec_of, graph_mode="piecewise")

    return (anchor(f"S1{letter}0", baseline),
            anchor(f"S1{letter}", suffix, "suffix:3", f"S1{letter}0"))


def _s2(anchor_id: str, figures: tuple[float, float], speculative: str | None = None) -> Anchor:
    """vllm-ascend PR #6766 (commit df1ee807, first released in v0.17.0rc1): Llama-3.1-8B-Instruct TP1 on one NPU,
    mt-bench through `vllm bench serve` at max concurrency 1, temperature 0; without speculation (S2_0) and with
    PARD-Llama-3.2-1B drafting k=8 in parallel (S2), (TPOT ms, output tok/s) as published. The eight per-position
    acceptances (79.48% ... 7.61%) average 0.321: vLLM's accepted / proposed drafts."""
    return Anchor(anchor_id, "llama-3.1-8b", "910B3x1", 1, "0.17.0rc1", 100, 256, 1,
                  {"tpot_ms": figures[0], "output_tokens_per_s": figures[1]},
                  "chip not published (one device), read as 910B3; vLLM v0.15.0 on vllm-ascend main of 2026-03 read as "
                  "0.17.0rc1, the first release with the commit; mt-bench's first turns with the chat template read "
                  "as 100 tokens; output 256, vLLM's MTBenchDataset default (the published TPOT and throughput agree: "
                  "79 + 255 x 27.0 ms = 6.96 s for 256 tokens); PARD-Llama-3.2-1B read as Llama-3.2-1B's "
                  "architecture with PARD's mask token (the run's speculative config sets parallel_drafting); graph "
                  "mode not set: the release's PIECEWISE",
                  speculative=speculative, acceptance=0.321 if speculative else None,
                  draft="pard-llama-3.2-1b" if speculative else None, baseline="S2_0" if speculative else None,
                  graph_mode="piecewise")


def _s3(anchor_id: str, k: int, acceptance_length: float, figures: tuple[float, float]) -> Anchor:
    """vllm-ascend PR #8118 (commit 36b1e040, first released in v0.19.1rc1): Qwen3-8B DP1/TP1, gsm8k repeated to
    3.5K in / 1.5K out, 400 prompts at batch size 16, temperature 0, FULL_DECODE_ONLY, EAGLE-3 at k=3 and k=8;
    (TPOT ms, output tok/s) as published. The mean acceptance length AL = 1 + k x rate gives the per-draft-token
    rate (AL - 1) / k the model takes."""
    return Anchor(anchor_id, "qwen3-8b", "910B3x1", 1, "0.19.1rc1", 3500, 1500, 16,
                  {"tpot_ms": figures[0], "output_tokens_per_s": figures[1]},
                  "chip not published, read as 910B3; vLLM v0.19.0 read as 0.19.1rc1, the first release with the "
                  "commit; batch_size 16 read as 16 in flight, arriving staggered (the throughput is 97% of 16 / "
                  "TPOT, which synchronized waves of 56K-token prefills would not leave); the EAGLE-3 draft is not "
                  "named: read as AngelSlim's Qwen3-8B layout (one layer, draft vocabulary 32000)",
                  speculative=f"eagle3:{k}", acceptance=round((acceptance_length - 1) / k, 3), draft="qwen3-8b-eagle3")


def _s4(anchor_id: str, concurrency: int, ttft: float, tpot: float, throughput: float) -> Anchor:
    """vllm-ascend tutorial Kimi-K2-Thinking.md section 8 (commit b80d4e62): vllm-ascend v0.20.2rc1 on one Atlas 800
    A3 (64G x 16), TP16 with expert parallel, max-num-seqs 12, max-num-batched-tokens 8192; `vllm bench serve` random
    1024 in / 1024 out, rate inf, max concurrency 1..16 with 10 prompts per slot. The checkpoint's experts are int4
    weight-only (compressed-tensors, W4A16), the rest bf16."""
    return Anchor(anchor_id, "kimi-k2-instruct", "Ascend910x16", 16, "0.20.2rc1", 1024, 1024, concurrency,
                  {"ttft_ms": ttft, "tpot_ms": tpot, "output_tokens_per_s": throughput},
                  "Kimi-K2-Thinking read as the Kimi-K2-Instruct architecture in the catalog (both 1T total / 32B "
                  "active; the Thinking config.json is not in a stored source); experts W4A16, the rest bf16; the "
                  "random dataset's fixed lengths as waves (the durations say every request ran its 1024 tokens); "
                  "graph mode not set (the tutorial's server command): the release's PIECEWISE",
                  quantization="W4A16", max_num_seqs=12, max_num_batched_tokens=8192, fixed_lengths=True,
                  graph_mode="piecewise")


def _s9(anchor_id: str, concurrency: int, tpot_ms: float, quantization: str | None, baseline: str | None) -> Anchor:
    """vllm-ascend issue #2514: Qwen3-32B BF16 against W8A8 on vllm-ascend 0.9.1rc2 (CANN 8.1.RC1), average
    incremental-token latency at concurrency 1 and 8; the BF16 run of the same issue calibrates the node."""
    return Anchor(anchor_id, "qwen3-32b", "910B3x4", 4, "0.9.1rc2", 2048, 512, concurrency, {"tpot_ms": tpot_ms},
                  "chip, TP and lengths not published: 910B3 with TP4 (a 32B bf16 model's usual split on one A2; "
                  "the 31 ms BF16 step fits it) and 2048 in / 512 out assumed; only TPOT is published",
                  quantization=quantization, baseline=baseline)


def _s22(anchor_id: str, hardware: str, tp: int, nodes: int, published: tuple[float, float, float],
         layout: str) -> Anchor:
    """vllm-ascend PR #7265 (its head commit c52a93c6, a tutorial not merged): Qwen3.5-397B-A17B W8A8, text only,
    8192 in / 1024 out at concurrency 7, 28 prompts (AISBench), FULL_DECODE_ONLY, max-num-batched-tokens 16384,
    no MTP; mean TTFT, mean TPOT and output throughput as published."""
    ttft, tpot, throughput = published
    return Anchor(anchor_id, "qwen3.5-397b-a17b", hardware, tp, "0.15.0rc1", 8192, 1024, 7,
                  {"ttft_ms": ttft, "tpot_ms": tpot, "output_tokens_per_s": throughput},
                  f"{layout}; vllm-ascend 0.14.0rc2.dev119 (a build of main, 2026-03) read as 0.15.0rc1; the "
                  "published totals (8.01 input per output token, 28 x 1024 tokens in 170 s) say four waves of 7 "
                  "fixed-length requests; the checkpoint's W8A8 read as ModelSlim's W8A8",
                  quantization="W8A8", max_num_seqs=64, max_num_batched_tokens=16384, fixed_lengths=True,
                  graph_mode="full_decode_only", nodes=nodes)


def _s23(anchor_id: str, model: str, published: tuple[float, float]) -> Anchor:
    """vllm-ascend commit 92616f3a (PR #13946, its "PR" rows): a plain MoE and a hybrid one of ~3B active each, bf16,
    served the same way on the same machine (DP2 x TP2 + EP, max-num-seqs 32, vLLM v0.27.1), random 4096/2048, 50
    prompts at max-concurrency 32: what the hybrid's Gated DeltaNet layers add to prefill (mean TTFT 3963 against
    2355 ms) checks the linear-attention cost S10 and S22 set."""
    ttft, tpot = published
    return Anchor(anchor_id, model, "Ascend910x4", 2, "0.27.1rc1", 4096, 2048, 32, {"ttft_ms": ttft, "tpot_ms": tpot},
                  "chip not named: read as A3 dies; DP2 x TP2 as two replicas of TP2, their experts one EP group of "
                  "4 (vLLM's data parallel in one server); vLLM v0.27.1 read as 0.27.1rc1; every output 2048 tokens "
                  "(102400 in the run), fixed lengths as waves of 32; output throughput not scored: 50 prompts make "
                  "one wave of 32 and one of 18, which a steady-state prediction does not describe",
                  replicas=2, max_num_seqs=32, fixed_lengths=True, expert_parallel_size=4)


def _skip(anchor_id: str, reason: str) -> Anchor:
    return Anchor(anchor_id, "qwen3-8b", "910B3x1", 1, "0.23.0", 0, 0, 0, {}, skip=reason)


# The draft models of the S anchors that the catalog does not hold, each from a cited config.json. PARD-Llama-3.2-1B
# is Llama-3.2-1B retrained to draft in parallel (AMD-AGI/PARD's training config reuses the base's unused token ids
# as mask tokens; vLLM finds the mask token in the draft's config and then drafts all k in one forward).
DRAFT_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # Tencent/AngelSlim angelslim/compressor/speculative/train/configs/qwen3-8b-eagle3.json @ 1c786f25 (the config
    # AngelSlim trains its Qwen3-8B EAGLE-3 heads with; vLLM's SpeculativeConfig names AngelSlim/Qwen3-8B_eagle3 among
    # its eagle3 examples).
    "qwen3-8b-eagle3": ("AngelSlim/Qwen3-8B_eagle3", {
        "architectures": ["Eagle3LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
        "head_dim": 128, "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960,
        "num_attention_heads": 32, "num_hidden_layers": 1, "num_key_value_heads": 8, "tie_word_embeddings": False,
        "vocab_size": 151936, "draft_vocab_size": 32000}),
}


def _draft(name: str | None) -> ModelSpec | None:
    if name is None:
        return None
    if name == "pard-llama-3.2-1b":
        base = load_model("llama-3.2-1b")
        return replace(base, arch=replace(base.arch, parallel_draft=True), served_name="PARD-Llama-3.2-1B")
    if name in DRAFT_CONFIGS:
        served, config = DRAFT_CONFIGS[name]
        arch = arch_from_config(config, name)
        return ModelSpec(arch=arch, weight_bytes=weight_bytes_from_arch(arch, arch.torch_dtype),
                         weights_present=False, quantization=None, path=None, served_name=served)
    return load_model(name)


# Sources: S1 vllm-project/vllm-ascend docs/source/tutorials/features/suffix_speculative_decoding.md (commit
# be5b66de, PR #6323); S2 PR #6766 (commit df1ee807); S3 PR #8118 (commit 36b1e040); S4 the Kimi-K2-Thinking
# tutorial (docs/source/tutorials/models/Kimi-K2-Thinking.md, commit b80d4e62); S5 PR #7474 (commit 2965280b);
# S6 PR #1353 (commit 0fc9b56d, its "Before Improvement" run); S7 PR #9008 (commit b2bee9a4); S9 issue #2514;
# S10 issue #16637; S22 PR #7265 (commit c52a93c6); S23 commit 92616f3a (PR #13946) (all
# github.com/vllm-project/vllm-ascend). S10's issue is newer than the stored corpora (which end near #14760,
# 2026-08): its figures are as first read, not re-read since. The rows considered and not placed (and S6's expert
# layout, the EP sweeps) were worked out in notes that are not part of this repository. The speculative and
# quantized rows of vllm-ascend's nightly CI configs (tests/e2e/nightly/...) are deliberately not used: they are kept
# aside to score the model.
SPEC_QUANT_ANCHORS: tuple[Anchor, ...] = (
    *_s1("a", "GSM8K", 1, 67, 1570, (55.5, 18.0), (35.7, 28.5), 0.311),
    *_s1("b", "HumanEval", 1, 150, 2700, (55.1, 18.1), (37.9, 26.3), 0.270),
    *_s1("c", "ShareGPT", 1, 666, 231, (54.1, 18.3), (39.2, 24.1), 0.239),
    *_s1("d", "AGIEval", 1, 735, 1880, (53.1, 18.7), (31.8, 34.1), 0.503),
    *_s1("e", "AGIEval", 34, 735, 1880, (70.0, 494.6), (50.2, 768.4), 0.503),
    *_s1("f", "ARC", 15, 76, 960, (59.8, 245.8), (48.9, 311.7), 0.239),
    *_s1("g", "SuperGLUE_BoolQ", 32, 207, 314, (62.7, 396.4), (47.8, 507.5), 0.334),
    *_s1("h", "HumanEval", 26, 150, 2700, (64.7, 403.8), (50.9, 519.2), 0.270),
    _s2("S2_0", (26.99, 36.75)),
    _s2("S2", (13.45, 72.98), "draft_model:8"),
    _s3("S3a", 3, 2.81, (16.4, 943.60)),
    _s3("S3b", 8, 3.60, (19.5, 795.34)),
    _skip("S3c", "DFlash k=8 (PIECEWISE, draft eager): the draft z-lab/Qwen3-8B-DFlash-b16's config.json is not in a "
          "stored source, and second-hand copies disagree (4 or 5 layers, FFN 11008 or 12288)"),
    _s4("S4a", 1, 473.71, 57.71, 17.21),
    _s4("S4b", 2, 708.16, 60.29, 32.83),
    _s4("S4c", 4, 956.11, 69.97, 56.47),
    _s4("S4d", 8, 1361.85, 87.37, 90.28),
    _skip("S4e", "Kimi-K2-Thinking at max concurrency 16 over max-num-seqs 12: a queueing run (mean TTFT 77 s, TPOT "
          "222 ms against 87 ms at 8) the published table itself calls severe queueing delay"),
    Anchor("S5", "qwen3-32b", "910B3x8", 8, "0.18.0rc1", 10240, 2048, 192,
           {"ttft_ms": 24598.51, "tpot_ms": 120.76, "output_tokens_per_s": 1445.85},
           "chip not published: TP8 read as one 8-card A2 (910B3); vLLM v0.17.0 on main of 2026-03 read as "
           "0.18.0rc1, the first release with C8; W8A8 weights with the C8 (int8) KV cache; the random dataset's "
           "fixed lengths as waves (960 x 10240 in and 960 x 2048 out, as published); graph mode not set: the "
           "release's PIECEWISE",
           quantization="W8A8", kv_cache="C8", fixed_lengths=True, graph_mode="piecewise"),
    Anchor("S6", "deepseek-v3", "Ascend910x16", 16, "0.9.2rc1", 4096, 1536, 24,
           {"ttft_ms": 942.70, "tpot_ms": 68.96, "output_tokens_per_s": 320.47},
           "16 NPUs in one TP16 group read as one Atlas 800 A3 (16 dies); main of 2025-07 read as 0.9.2rc1, the "
           "first release with the commit; DeepSeek-R1-W8A8 (ModelSlim) read as W8A8_DYNAMIC on the DeepSeek-V3 "
           "architecture, no MTP; rate 1 capped at max-concurrency 24: 24 in flight, arriving staggered; torchair "
           "graph mode (the whole decode step one graph) read as FULL_DECODE_ONLY; the Ascend scheduler read as "
           "vLLM's; no expert parallelism (the run sets expert_tensor_parallel_size 16 without "
           "--enable-expert-parallel: every expert split 16 ways, the all-gather path)",
           quantization="W8A8_DYNAMIC", max_num_seqs=24, max_num_batched_tokens=8192, graph_mode="full_decode_only",
           expert_parallel_size=1),
    Anchor("S7", "qwen3-14b", "910B3x1", 1, "0.19.1rc1", 128, 100, 1,
           {"ttft_ms": 330.0, "tpot_ms": 39.0},
           "chip not published, read as 910B3; vLLM v0.19.1 read as 0.19.1rc1; sonnet 128 in / 100 out at 2 "
           "requests/s (40 prompts, ignore-eos); ngram k=3 with the synchronous scheduler (the PR's baseline row); "
           "acceptance not published (the ngram default); graph mode not set: the release's PIECEWISE",
           speculative="ngram:3", request_rate=2.0, graph_mode="piecewise"),
    _skip("S8", "DeepSeek-R1 W8A8 MTP on/off (issue #3097): a 2P1D disaggregated run over four A2 nodes whose decode "
          "layout and k are not published"),
    _s9("S9a0", 1, 31.0, None, None),
    _s9("S9a", 1, 30.0, "W8A8", "S9a0"),
    _s9("S9b0", 8, 54.0, None, None),
    _s9("S9b", 8, 54.0, "W8A8", "S9b0"),
    Anchor("S10", "qwen3.5-27b", "910B4x4", 2, "0.26.0rc1", 2048, 256, 16,
           {"tpot_ms": 24.7, "output_tokens_per_s": 333.0},
           "DP2 x TP2 as two replicas of TP2; 32 sequences per engine; 'fixed 2048-in/256-out' as waves; acceptance "
           "not published (the MTP default)",
           quantization="W8A8", speculative="mtp:3", replicas=2, max_num_seqs=32, fixed_lengths=True),
    _skip("S11", "Qwen3-14B with a Qwen3-0.6B draft (issue #12890): k, chip and TP not published, and the draft is "
          "not in the catalog; the issue reports a regression whose cause is its subject"),
    _skip("S12", "Qwen3-8B DFlash k=5/7/9 at batch 128 (PR #13819): dataset, lengths, chip and TP not published, and "
          "the DFlash draft's config.json is not in a stored source"),
    _skip("S13", "DeepSeek-V3.1 W8A8 MTP (tutorial): a 2P1D disaggregated deployment over four A3 nodes; only its "
          "per-card figure is published"),
    _skip("S14", "DeepSeek-V3.2 W8A8 MTP (tutorial): a 1P1D disaggregated deployment over four A3 nodes; whether "
          "'tps' is per card or in total is not said"),
    _skip("S15", "Qwen3-235B int8 on 8x 910B4 (issue #4395): the output lengths are in a comment not read"),
    # vllm-ascend issue #1015 (v0.8.4rc2, 910B3, TP4, QwQ-32B-w8a8, one request at a time: TTFT 160.36 ms, TPOT
    # 95.17 ms, 10.49 tok/s) is the issue's own report of a regression (that W8A8 run slower than fp16): like S11, a
    # measurement of the bug the issue is about, not of what the configuration does, so it does not score the model.
    _skip("S16", "QwQ-32B W8A8 TP4 on 910B3 (issue #1015): the issue reports this run as a regression (W8A8 slower "
          "than fp16 on 0.8.4rc2), so it measures the bug the issue is about; the model would predict 27 tok/s"),
    _skip("S17", "W8A16 against BF16 at TP2 (PR #4541): the model is not named"),
    _skip("S18", "Qwen3-30B-A3B EAGLE-3 (PR #10023): chip and TP not published, the draft not named"),
    _skip("S19", "Qwen3.5 MTP rejection-sampler variants (PR #9772): no hardware or workload published"),
    _skip("S20", "Qwen3-30B-A3B W8A8 TP2 (issue #3231): lengths not published and the bf16 half not readable"),
    _skip("S21", "Gemma4-31B BF16 against W8A8 (issue #9750): Gemma4 is not in the catalog"),
    _s22("S22a", "Ascend910x16", 16, 1, (2730.0, 39.0, 168.19), "one Atlas 800 A3: TP16 + EP16"),
    _s22("S22b", "910B3x8", 8, 2, (5880.0, 40.8, 150.31),
         "two Atlas 800 A2 (64 GB cards, the tutorial's requirement; the chip not named): DP2 x TP8 + EP16, the "
         "expert all-to-all crossing the nodes' RoCE"),
    _s23("S23a", "qwen3-30b-a3b", (2354.92, 24.96)),
    _s23("S23b", "qwen3.5-35b-a3b", (3962.52, 27.19)),
)


# Sources, long prompts at high concurrency (the L rows; vllm-ascend = github.com/vllm-project/vllm-ascend): L1 and L2
# the Qwen3-235B-A22B tutorial (docs/source/tutorials/models/Qwen3-235B-A22B.md, section 9.3) at commit 591f6450
# (also 6944effd), both only on PR #10142's branch, not in the merged docs; L3 the MiniMax-M2.5 tutorial
# (docs/source/tutorials/models/MiniMax-M2.5.md, "Performance Reference", commit fb8e22ec, PR #7296); L4 Alauda's
# validated-model page docs/en/plan/validated_models/minimax-m2.5-w8a8.mdx (github.com/alauda/aml-docs, commit
# db6f9cbd); L5 PR #8715's table (squash commit c97f3886), its workload and server from the xlite benchmark
# scripts that print that table (openeuler-mirror/GVirt xlite/tests/e2e, the version of 2026-04-10). Searched and
# not found: any published 310P / Atlas 300I Duo measurement at low concurrency with its lengths and figures in
# text (vllm-ascend issues #5263, #1487, #14695 give approximate figures, #7394 and #10082 screenshots only; the
# W8A8SC PRs #7075, #6454 and #11427 and the 310P tutorials publish none). vllm-ascend's nightly CI benchmark
# configs and baselines are not used here either.
def _l5(anchor_id: str, concurrency: int, published: tuple[float, float, float]) -> Anchor:
    """vllm-ascend PR #8715 (Xlite W8A8, its "baseline-aclgraph" rows): Qwen3-30B-A3B-Instruct-2507-w8a8, "8K 输入,
    1K 输出", vLLM v0.19.1 on main of 2026-05; mean TTFT, mean TPOT and output throughput as published."""
    ttft, tpot, throughput = published
    return Anchor(anchor_id, "qwen3-30b-a3b", "910B3x8", 8, "0.19.1rc1", 8192, 1024, concurrency,
                  {"ttft_ms": ttft, "tpot_ms": tpot, "output_tokens_per_s": throughput},
                  "hardware and server not in the PR: the xlite benchmark scripts that print its table run one A2 "
                  "node (910B3) at TP8 with expert parallel, FULL_DECODE_ONLY, max-num-seqs 64, max-num-batched-"
                  "tokens 65536, random 8192/1024 with a 20% range (so arriving staggered, not in waves), 10 "
                  "prompts per slot; the checkpoint's w8a8 read as ModelSlim's W8A8",
                  quantization="W8A8", max_num_seqs=64, max_num_batched_tokens=65536, graph_mode="full_decode_only")


LONG_ANCHORS: tuple[Anchor, ...] = (
    Anchor("L1", "qwen3-235b-a22b", "Ascend910x4", 4, "0.22.1rc1", 3584, 1536, 144,
           {"ttft_ms": 4717.45, "tpot_ms": 48.69, "output_tokens_per_s": 2761.72},
           "one Atlas 800I A3 as DP4 x TP4 + EP16 (experts over all 16 dies) read as four nodes of 4 dies: a plan's "
           "replicas hold whole copies, and only a multi-node DP plan shares its experts over its ranks, whose "
           "collectives are then RoCE's where the A3's are HCCS's; main of 2026-06 read as 0.22.1rc1; random "
           "3584/1536 ignore-eos at rate 24 capped at 160, the table's 144 in flight, in waves (the cap is reached "
           "in 7 s and fixed lengths finish together); W8A8 read as W8A8_DYNAMIC (ModelSlim's MoE scheme); "
           "FULL_DECODE_ONLY, max-num-seqs 128 a rank, max-num-batched-tokens 16384; the page's command asks "
           "800 prompts, its table says 720",
           quantization="W8A8_DYNAMIC", max_num_seqs=128, max_num_batched_tokens=16384, fixed_lengths=True,
           graph_mode="full_decode_only", nodes=4),
    _skip("L2", "Qwen3-235B-A22B W8A8 over three A3 nodes as one prefill and two decode pools (PR #10142 branch): "
          "a disaggregated deployment, which this table does not plan"),
    Anchor("L3", "minimax-m2.5", "Ascend910x16", 16, "0.18.0", 4096, 1024, 16,
           {"ttft_ms": 616.2, "tpot_ms": 31.92, "output_tokens_per_s": 492.39},
           "one Atlas 800 A3, TP16 + EP16, the fp8 checkpoint served in bfloat16 (as the page says); '4k/1k@bs=16' "
           "with 16 prompts read as one wave of 16 fixed 4096/1024 requests (no bench command is published); "
           "FULL_DECODE_ONLY, max-num-seqs 32, max-num-batched-tokens 32768",
           max_num_seqs=32, max_num_batched_tokens=32768, fixed_lengths=True, graph_mode="full_decode_only",
           expert_parallel_size=16),
    _skip("L4", "MiniMax-M2.5 W8A8 on two A2 nodes at ~8k in / 128 out, 8-32 in flight (Alauda): the prompts share a "
          "system prompt the prefix cache serves in an unpublished share, so neither TTFT nor the prompt work "
          "interleaved with decode is known"),
    _l5("L5a", 16, (987.97, 36.11, 417.54)),
    _l5("L5b", 32, (1798.55, 43.38, 692.45)),
    _l5("L5c", 48, (2249.65, 57.51, 788.99)),
    _skip("L6", "MiniMax-M2.5 W8A8 EAGLE-3 on A3, '3.5k/1k@bs=217' (PR #7919): 217 is the number of requests, and "
          "the concurrency is not published"),
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
    if anchor.kv_cache:
        model = replace(model, kv_cache_quantization=anchor.kv_cache)
    target = parse_hardware_spec(anchor.hardware, nodes=anchor.nodes)
    workload = Workload(anchor.input_len, anchor.output_len, anchor.concurrency, anchor.request_rate, "throughput",
                        fixed_lengths=anchor.fixed_lengths)
    # vLLM's defaults of the time: up to 256 running sequences, and a 2048-token step budget for online serving
    # on devices under 70 GiB (vLLM's EngineArgs default before the 0.11 series raised it).
    batched = anchor.max_num_batched_tokens or (
        2048 if parse_release(anchor.release) < parse_release("0.11.0") else None)
    options = PlanOptions(
        tp=anchor.tp, vllm_ascend_version=anchor.release, max_num_seqs=anchor.max_num_seqs,
        max_num_batched_tokens=batched, speculative=anchor.speculative or "none", spec_acceptance=anchor.acceptance,
        replicas=anchor.replicas, draft=_draft(anchor.draft), multinode="dp" if anchor.nodes > 1 else "auto",
    )
    return make_plan(model, target, workload, options)


def _perf(anchor: Anchor) -> PerfInputs:
    """The plan's performance inputs, in the graph mode the source ran."""
    perf = _plan(anchor).perf
    if anchor.expert_parallel_size is not None:
        perf = replace(perf, expert_parallel_size=anchor.expert_parallel_size)
    return replace(perf, mode=anchor.graph_mode) if anchor.graph_mode else perf


def _factors(anchor: Anchor) -> CalibrationFactors:
    """The baseline anchor's measured / predicted step and throughput (1.0 without a baseline, or for a figure the
    baseline does not publish)."""
    if anchor.baseline is None:
        return CalibrationFactors()
    base = next(a for a in SPEC_QUANT_ANCHORS if a.id == anchor.baseline)
    perf = _perf(base)
    step = base.published["tpot_ms"] / predict(perf).tpot_ms
    if "output_tokens_per_s" not in base.published:
        return CalibrationFactors(step=step)
    stepped = predict(perf, factors=CalibrationFactors(step=step))
    return CalibrationFactors(step=step, throughput=base.published["output_tokens_per_s"] /
                              stepped.output_tokens_per_s)


def evaluate(anchor: Anchor) -> list[Row]:
    predicted = predict(_perf(anchor), factors=_factors(anchor)).as_dict()
    return [Row(anchor.id, metric, float(predicted[metric]), value) for metric, value in anchor.published.items()]


def all_rows(anchors: tuple[Anchor, ...] = ANCHORS) -> list[Row]:
    rows: list[Row] = []
    for anchor in anchors:
        if not anchor.skip:
            rows.extend(evaluate(anchor))
    return rows


def median_abs_error(rows: list[Row], metric: str) -> float:
    return statistics.median(abs(r.error) for r in rows if r.metric == metric)


# The goal for the speculative and quantized anchors, on output throughput.
GOAL_MEDIAN, GOAL_MAX = 0.15, 0.30


@dataclass(frozen=True)
class Goal:
    median: float  # median |error| of output throughput
    misses: tuple[Row, ...]  # the throughput rows above GOAL_MAX

    @property
    def met(self) -> bool:
        return self.median <= GOAL_MEDIAN and not self.misses

    def line(self) -> str:
        over = ", ".join(f"{r.anchor} {r.error:+.0%}" for r in self.misses) or "none"
        return (f"goal {'PASS' if self.met else 'MISS'}: output throughput median |error| {self.median:.0%} "
                f"(at most {GOAL_MEDIAN:.0%}), above {GOAL_MAX:.0%}: {over}")


def goal(rows: list[Row]) -> Goal:
    """The goal over the throughput rows of `rows`."""
    throughput = [r for r in rows if r.metric == "output_tokens_per_s"]
    return Goal(statistics.median(abs(r.error) for r in throughput),
                tuple(r for r in throughput if abs(r.error) > GOAL_MAX))


def spec_quant_rows() -> list[Row]:
    """The rows of the speculative and quantized anchors, without the baselines that calibrate them."""
    baselines = {a.baseline for a in SPEC_QUANT_ANCHORS if a.baseline}
    return [r for r in all_rows(SPEC_QUANT_ANCHORS) if r.anchor not in baselines]


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


def _print_notes(anchors: tuple[Anchor, ...]) -> None:
    """Skipped anchors with the reason, then each assumption once with the anchors it applies to."""
    for anchor in anchors:
        if anchor.skip:
            print(f"{anchor.id:7} skipped: {anchor.skip}")
    print()
    shared: dict[str, list[str]] = {}
    for anchor in anchors:
        if anchor.assumed and not anchor.skip:
            shared.setdefault(anchor.assumed, []).append(anchor.id)
    for text, ids in shared.items():
        print(f"{','.join(ids)} assumed: {text}")
    print()


def main() -> int:
    rows = all_rows()
    _print_rows(rows)
    _print_notes(ANCHORS)
    _print_summary(rows)
    print(f"\nSpeculative and quantized configurations (goal: median throughput error <= {GOAL_MEDIAN:.0%}, "
          f"none above {GOAL_MAX:.0%}); a row with a baseline (S1, S2, S9) is calibrated by it:")
    spec_rows = spec_quant_rows()
    _print_rows(spec_rows)
    _print_notes(SPEC_QUANT_ANCHORS)
    _print_summary(spec_rows)
    print(goal(spec_rows).line())
    print("\nLong prompts at high concurrency (L-rows, not used to set any constant but the ones their notes in "
          "perf_model.toml name):")
    long_rows = all_rows(LONG_ANCHORS)
    _print_rows(long_rows)
    _print_notes(LONG_ANCHORS)
    _print_summary(long_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
