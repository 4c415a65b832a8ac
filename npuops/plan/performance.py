"""Predicted TTFT, TPOT and output tokens/s of a planned deployment.

The model (constants in npuops/data/perf_model.toml):

* A decode step reads every weight on the device once, plus the KV cache of every running sequence, from
  HBM: time = bytes / (bandwidth x efficiency), the KV's paged reads at an efficiency of their own. At large batch
  the matmuls turn compute-bound instead.
* MoE layers only read the experts the batch routes to; with expert parallelism each device holds whole experts
  and the step waits for the device the batch hits most. Weight-only int4 experts cost their dequantized size.
* Prefill is compute-bound: 2 x active parameters x tokens, plus attention's 4 x layers x context x width,
  over TP x FLOPS x MFU, plus a per-token cost of MoE routing and of linear-attention (Gated DeltaNet) layers, and
  a fixed cost per MoE layer and prompt step.
* Every step also pays a host/launch cost per layer that depends on the execution mode (eager, ACL piecewise
  graphs, FULL_DECODE_ONLY) and, with TP > 1, two all-reduces per layer whose latency grows with the group.
  This is why a TP8 decode step costs ~10 ms where bandwidth alone says ~1.3 ms (anchor C6 of
  benchmarks/calibration.py: vllm-ascend #6966).
* With several requests in flight, chunked prefill interleaves the other requests' prompts with decode
  steps, so each step also carries (B - 1) x input/output prompt tokens: requests of mixed lengths arrive and finish
  at random times, so a step of B running sequences carries on average the prompts of the ones that finished. Their
  matmuls share the step's weight reads; their routing runs after them.
* Requests of one fixed length in a closed loop (a benchmark: vLLM's random dataset with `--ignore-eos`, which
  `npuops bench` sends) do not interleave: they run in *waves* that start and finish together. Of each wave the
  first request is prefilled alone (it reaches an idle engine), the other B - 1 together in the next step, then all
  B decode in lockstep with no prompt in the step; when they finish, the client sends the next B at once, and the
  API server takes them in one after another (each waits for the overheads of those before it). Seen in vLLM's
  per-request timings (`vllm bench serve --save-detailed`, docs/calibration.md).
* Concurrency: a fixed concurrency runs min(concurrency, max_num_seqs, KV capacity) sequences per replica and
  queues the rest; a request rate is turned into concurrency with Little's law.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from npuops.hardware.cpu_features import CpuFeatures
from npuops.hardware.matmul_rate import MeasuredMatmul
from npuops.plan.constants import PerfConstants, perf_constants
from npuops.plan.model import ModelArch, count_parameters, routed_weight_share


@dataclass(frozen=True)
class PerfInputs:
    """Everything the prediction needs; the planner and the calibration script both build one."""

    arch: ModelArch
    kind: str  # "npu" | "cpu"
    tp: int
    pp: int
    replicas: int
    weight_bytes: int  # whole model as served (quantized if it is)
    kv_bytes_per_token: int  # per device, all layers of a stage
    act_dtype_bytes: float
    flops_per_s: float | None  # per device
    bandwidth_bytes_per_s: float | None  # per device
    mode: str  # "eager" | "piecewise" | "full_decode_only"
    input_len: int
    output_len: int
    concurrency: int  # requests in flight across the whole deployment
    request_rate: float | None  # requests/s across the deployment; wins over concurrency when set
    max_num_seqs: int
    kv_cache_tokens: int
    cpu_count: int | None = None
    max_num_batched_tokens: int = 0  # tokens one step may carry; 0 = no limit
    # Every request exactly input_len in / output_len out, as a benchmark sends them: a closed loop then runs in waves.
    fixed_lengths: bool = False
    # Speculative decoding: K draft tokens a step, the share of them accepted (vLLM's rate), and one draft forward's
    # decoder layers and weights (0: the proposer drafts from the text, on the host).
    spec_tokens: int = 0
    spec_acceptance: float = 0.0
    draft_layers: int = 0
    draft_weight_bytes: int = 0
    # A parallel drafter (DFlash, DSpark, a PARD draft) proposes all K tokens in one forward of K tokens per
    # sequence; the others run K forwards of one token each, one after another.
    draft_parallel: bool = False
    # How much faster than bf16 the quantized linear layers' matmuls run: int8 activations (W8A8, W4A8) take the
    # cube unit's int8 path at its int8 rate (quantization.toml's matmul_speedup); 1.0 unquantized or weight-only.
    linear_speedup: float = 1.0
    # Share of weight_bytes in routed experts, as served (a W4A16 checkpoint's experts are a smaller share of its
    # bytes than of its parameters); None (an older instance.json): their share of the parameters.
    routed_weight_share: float | None = None
    # Devices that each hold whole routed experts (vLLM's --enable-expert-parallel: TP x DP of the engine); 1: every
    # expert is split over the TP group instead (vllm-ascend's expert_tensor_parallel_size, the all-gather path).
    expert_parallel_size: int = 1
    # What a decode step's routed experts cost over their bytes in memory (quantization.toml expert_decode_bytes:
    # weight-only int4 experts are dequantized to bf16 before the matmul).
    expert_decode_factor: float = 1.0

    def to_json(self) -> dict[str, Any]:
        """What a launched instance keeps (instance.json), so a bench predicts the configuration that runs."""
        data = asdict(self)
        data["arch"]["architectures"] = list(self.arch.architectures)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PerfInputs:
        """The inverse of to_json; KeyError/TypeError/ValueError on a malformed one (callers name the file)."""
        arch_data = dict(data["arch"])
        arch_data["architectures"] = tuple(arch_data["architectures"])
        known = {f.name for f in fields(ModelArch)}
        arch = ModelArch(**{k: v for k, v in arch_data.items() if k in known})
        own = {f.name for f in fields(cls)} - {"arch"}
        return cls(arch=arch, **{k: v for k, v in data.items() if k in own})

    def for_load(self, *, input_len: int, output_len: int, concurrency: int,
                 request_rate: float | None, fixed_lengths: bool = False) -> PerfInputs:
        """The same deployment under another load (a bench's, a tune trial's)."""
        return replace(self, input_len=input_len, output_len=output_len, concurrency=concurrency,
                       request_rate=request_rate, fixed_lengths=fixed_lengths)

    @property
    def in_waves(self) -> bool:
        """Whether the load runs in synchronized waves (fixed lengths in a closed loop)."""
        return self.fixed_lengths and self.request_rate is None


@dataclass(frozen=True)
class CalibrationFactors:
    """Measured / predicted on one node and stack: TTFT (request overhead and prefill) and the decode step.
    1.0 is the uncalibrated model."""

    ttft: float = 1.0
    step: float = 1.0
    # A closed loop's measured throughput over what the median latencies give through Little's law: the latency
    # tail (a mean above the median) and the run's ramp-up and drain, which no median shows.
    throughput: float = 1.0


@dataclass(frozen=True)
class Prediction:
    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float
    running_per_replica: float  # sequences decoding together in one replica
    queued_per_replica: float  # requests waiting for a slot
    saturated: bool  # the request rate exceeds what the deployment can serve
    decode_bound: str  # "memory" | "compute"
    e2e_ms: float = 0.0  # one request from sent to its last token
    busy_replicas: float = 1.0  # replicas the load keeps busy

    output_len: int = 0  # of the workload predicted for

    @property
    def requests_per_s(self) -> float:
        return self.output_tokens_per_s / self.output_len if self.output_len else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "ttft_ms": round(self.ttft_ms, 1),
            "tpot_ms": round(self.tpot_ms, 2),
            "e2e_ms": round(self.e2e_ms, 1),
            "output_tokens_per_s": round(self.output_tokens_per_s, 1),
            "requests_per_s": round(self.requests_per_s, 3),
            "running_per_replica": round(self.running_per_replica, 2),
            "queued_per_replica": round(self.queued_per_replica, 2),
            "busy_replicas": self.busy_replicas,
        }


def _device_rates(p: PerfInputs, c: PerfConstants) -> tuple[float, float]:
    if p.kind == "cpu":
        cores = p.cpu_count or 1
        flops = p.flops_per_s or cores * c.cpu_flops_per_core
        bandwidth = p.bandwidth_bytes_per_s or c.cpu_memory_bandwidth_bytes_per_s
        return flops, bandwidth
    # An unpublished figure (910A bandwidth) falls back to an A2-like chip rather than dividing by zero.
    return p.flops_per_s or 300e12, p.bandwidth_bytes_per_s or 1.6e12


@dataclass(frozen=True)
class CpuPeak:
    """The CPU engine's peak rate in one dtype and what it is made of: the dense matmul rate measured on the host
    (npuops/hardware/matmul_rate.py), else cores x clock x FLOPs a cycle (perf_model.toml [performance.cpu])."""

    cores: int
    ghz: float
    flops_per_cycle: float
    unit: str  # the instructions that set flops_per_cycle: a native bfloat16 flag, a vector unit, "emulated ..."
    clock_known: bool
    measured_flops_per_s: float | None = None
    measured_how: str = ""

    @property
    def flops_per_s(self) -> float:
        if self.measured_flops_per_s is not None:
            return self.measured_flops_per_s
        return self.cores * self.ghz * 1e9 * self.flops_per_cycle

    def describe(self) -> str:
        """How the peak is made, without the peak itself (which the caller shows once, where it belongs)."""
        if self.measured_flops_per_s is not None:
            return f"a matmul's rate measured on this host ({self.measured_how})"
        clock = f"{self.ghz:g} GHz" + ("" if self.clock_known else " (assumed: cpuinfo names no clock)")
        cores = f"{self.cores} core{'s' * (self.cores != 1)}"
        return f"{cores} x {clock} x {self.flops_per_cycle:g} FLOPs a cycle ({self.unit})"


def cpu_peak(features: CpuFeatures | None, cpus: int, dtype: str, c: PerfConstants | None = None,
             matmul: MeasuredMatmul | None = None) -> CpuPeak | None:
    """The CPU engine's peak in `dtype` on `cpus` allowed CPUs: the host's measured matmul rate where it was
    measured (two hosts with the same flags differ ~3x), else cores (SMT siblings share one core's vector units)
    x clock x FLOPs per cycle; None with neither (the model then takes flops_per_core per CPU)."""
    c = c or perf_constants()
    measured = matmul.rate(dtype, cpus) if matmul is not None else None
    if features is None:
        if measured is None:
            return None
        return CpuPeak(cpus, c.cpu_default_ghz, 0.0, "", False, measured, matmul.how if matmul else "")
    cores = max(1, cpus // max(1, features.threads_per_core))
    vector = features.vector_isa
    per_cycle, unit = c.cpu_flops_per_cycle_float32[vector], f"{vector}, float32"
    if dtype != "float32":
        native = features.native_bf16
        if native:
            per_cycle, unit = c.cpu_flops_per_cycle_bfloat16[native], f"{native}, bfloat16"
        else:
            per_cycle, unit = per_cycle * c.cpu_emulated_bfloat16_factor, f"{vector}, bfloat16 widened to float32"
    return CpuPeak(cores, features.ghz or c.cpu_default_ghz, per_cycle, unit, features.ghz is not None, measured,
                   matmul.how if matmul is not None else "")


def cpu_peak_flops_per_s(features: CpuFeatures | None, cpus: int, dtype: str, c: PerfConstants | None = None,
                         matmul: MeasuredMatmul | None = None) -> float | None:
    peak = cpu_peak(features, cpus, dtype, c, matmul)
    return peak.flops_per_s if peak is not None else None


def step_overhead_s(arch: ModelArch, tp: int, pp: int, mode: str, kind: str, c: PerfConstants,
                    act_dtype_bytes: float = 2.0) -> float:
    """Host, launch and collective cost of one forward step, independent of the data moved (on the CPU engine eager
    bfloat16 also runs the casts around each operator that compilation fuses away)."""
    if kind == "cpu":
        if mode != "eager":
            per_layer = c.cpu_compiled_us_per_layer
        else:
            per_layer = c.cpu_us_per_layer if act_dtype_bytes >= 4 else c.cpu_eager_bfloat16_us_per_layer
        return arch.num_layers * per_layer * 1e-6
    per_layer_us = {
        "eager": c.eager_us_per_layer,
        "piecewise": c.piecewise_us_per_layer,
        "full_decode_only": c.full_graph_us_per_layer,
    }[mode]
    dense_layers = arch.num_layers - arch.num_moe_layers
    layer_cost = per_layer_us * (dense_layers + arch.num_moe_layers * c.moe_layer_overhead_factor)
    # A MoE layer's routing, token permutation and grouped matmuls also take device time no graph removes.
    layer_cost += arch.num_moe_layers * c.moe_layer_us
    allreduce = 0.0
    if tp > 1:
        allreduce = 2 * arch.num_layers * (c.allreduce_us + c.allreduce_us_per_doubling * math.log2(tp))
    pipeline = (pp - 1) * c.pp_send_us
    return (layer_cost + allreduce + pipeline) * 1e-6


def _weights_read_per_step(p: PerfInputs, batch: float) -> float:
    """Weight bytes a decode step streams on one device: MoE layers only touch the experts the batch routes to."""
    arch = p.arch
    per_device = p.weight_bytes / (p.tp * p.pp)
    if not arch.is_moe:
        return per_device
    routed_share = p.routed_weight_share
    if routed_share is None:
        routed_share = routed_weight_share(arch, p.act_dtype_bytes, None)
    # Expected share of routed experts hit by `batch` tokens each picking k of E (uniform routing).
    k, e = arch.num_experts_per_tok, arch.num_experts
    hit: float = 1.0 - math.pow(1.0 - k / e, max(batch, 1.0))
    routed_cost = routed_share * p.expert_decode_factor
    ep = p.expert_parallel_size
    if ep <= 1 or e % ep:
        return per_device * ((1.0 - routed_share) + routed_cost * hit)
    # Expert parallel: each device holds E/ep whole experts and the step waits for the device the batch hits most.
    # The tokens of the whole EP group route together (DP ranks of one engine step in lockstep).
    group_hit = 1.0 - math.pow(1.0 - k / e, max(batch * ep / (p.tp * p.pp), 1.0))
    expert_bytes = p.weight_bytes * routed_cost / e / p.pp
    return per_device * (1.0 - routed_share) + expert_bytes * expected_busiest(e // ep, group_hit, ep)


def expected_busiest(experts: int, hit: float, devices: int) -> float:
    """Expected most experts hit on one of `devices` devices of `experts` each, each expert hit with chance `hit`
    (independently): E[max] = sum over m of P(max >= m) = 1 - P(one device < m) ** devices."""
    cdf, total = 0.0, 0.0
    for m in range(experts):
        cdf += math.comb(experts, m) * hit ** m * (1.0 - hit) ** (experts - m)
        total += 1.0 - min(cdf, 1.0) ** devices
    return total


def prefill_flops(arch: ModelArch, tokens: float, context: float) -> float:
    """FLOPs to prefill `tokens` tokens whose average attended context is `context` (only full-attention layers
    attend to the context; a linear-attention layer's recurrence is in _prefill_token_work_s)."""
    active = count_parameters(arch).active
    attn_width = arch.num_attention_heads * (
        (arch.qk_nope_head_dim + arch.qk_rope_head_dim) if arch.is_mla else arch.head_dim
    )
    return tokens * (2.0 * active + 4.0 * arch.kv_cache_layers * context * attn_width)


def _prefill_token_work_s(p: PerfInputs, tokens: float, c: PerfConstants) -> float:
    """Device time of `tokens` prompt tokens beside their matmuls, which no FLOPs rate carries: a MoE layer routes,
    permutes and dispatches every token (on each device of the group, which all see every token), and a Gated
    DeltaNet layer runs its chunked recurrence, convolution and gating per token and value head (heads split over
    TP: the state each head carries is what the kernels stream)."""
    if p.kind == "cpu":
        return 0.0
    arch = p.arch
    value_heads_per_device = arch.linear_num_value_heads / p.tp
    per_token_us = (arch.num_moe_layers * c.moe_prefill_token_us
                    + arch.num_linear_layers * value_heads_per_device * c.linear_attention_prefill_token_us)
    return tokens * per_token_us * 1e-6


def _matmul_flops(p: PerfInputs, tokens: float) -> float:
    """The weights' FLOPs of `tokens` tokens in bf16-equivalent time: quantized linear layers with int8 activations
    run at `linear_speedup`, the LM head and the rest in the activation dtype."""
    counts = count_parameters(p.arch)
    linear = 2.0 * counts.linear_active * tokens
    return 2.0 * counts.active * tokens - linear + linear / p.linear_speedup


def _prefill_time_flops(p: PerfInputs, tokens: float) -> float:
    """prefill_flops of `tokens` prompt tokens (average context half the prompt), in bf16-equivalent time."""
    weights = 2.0 * count_parameters(p.arch).active * tokens
    return prefill_flops(p.arch, tokens, p.input_len / 2) - weights + _matmul_flops(p, tokens)


def decode_step_s(p: PerfInputs, batch: float, c: PerfConstants, scale: float = 1.0,
                  interleave: bool = True) -> tuple[float, str]:
    """Time per output token of a decode step with `batch` sequences (with speculation: the verify step and its
    drafts over the tokens a step yields), including the prompts chunked prefill interleaves (unless `interleave`
    is False: a wave's lockstep decode); `scale` is a calibration's measured/predicted step."""
    step, bound = _verify_step_s(p, batch, c, interleave)
    if p.spec_tokens <= 0:
        return step * scale, bound
    return (step + _draft_s(p, batch, c)) / (1.0 + p.spec_tokens * p.spec_acceptance) * scale, bound


def _draft_s(p: PerfInputs, batch: float, c: PerfConstants) -> float:
    """The draft forwards of one speculative step and the proposer's host work; a text proposer (ngram, suffix)
    only the latter. A sequential drafter runs K forwards of one token per sequence, a parallel one (DFlash, PARD)
    one forward of K tokens per sequence: each forward pays the draft's launch cost per layer and reads its weights
    once, or computes its tokens, whichever is longer."""
    if p.kind == "cpu":
        host = (c.cpu_spec_host_us_per_seq * batch + c.cpu_spec_step_us) * 1e-6
    else:
        host = (c.spec_host_us_per_seq * batch + c.spec_step_us) * 1e-6
    if p.draft_layers <= 0:
        return host
    flops, bandwidth = _device_rates(p, c)
    per_layer = step_overhead_s(p.arch, p.tp, 1, p.mode, p.kind, c, p.act_dtype_bytes) / max(p.arch.num_layers, 1)
    forwards, tokens = (1, p.spec_tokens) if p.draft_parallel else (p.spec_tokens, 1)
    memory = p.draft_weight_bytes / p.tp / (bandwidth * c.bandwidth_efficiency)
    compute = 2.0 * p.draft_weight_bytes / p.act_dtype_bytes * batch * tokens / (p.tp * flops * c.decode_mfu)
    # Besides its layers, every draft forward has a fixed cost of its own (the proposer prepares its positions,
    # slots and attention metadata, then computes logits and samples): what makes K sequential forwards dearer
    # than one parallel forward of K tokens.
    return forwards * (p.draft_layers * per_layer + max(memory, compute) + c.spec_forward_us * 1e-6) + host


def _verify_step_s(p: PerfInputs, batch: float, c: PerfConstants, interleave: bool) -> tuple[float, str]:
    """One forward step of `batch` sequences, each carrying 1 + K tokens (the drafts to verify)."""
    flops, bandwidth = _device_rates(p, c)
    # Each sequence carries 1 + K tokens, each routed to its own experts.
    weights = _weights_read_per_step(p, batch * (1 + p.spec_tokens))
    # Stages run one after another for a given token, so PP does not shorten the per-token path.
    memory_s = p.pp * (weights / (bandwidth * c.bandwidth_efficiency) + kv_read_s(p, batch, c))
    compute_s = _matmul_flops(p, batch * (1 + p.spec_tokens)) / (p.tp * flops * c.decode_mfu)
    interleaved_tokens = max(batch - 1.0, 0.0) * p.input_len / max(p.output_len, 1) if interleave else 0.0
    if p.max_num_batched_tokens:
        interleaved_tokens = min(interleaved_tokens, max(p.max_num_batched_tokens - batch, 0.0))
    # Interleaved prompt chunks ride in the same matmuls as the decode tokens: the step reads the weights once
    # and is bound by whichever of memory traffic and total compute is larger.
    compute_s += _prefill_time_flops(p, interleaved_tokens) / (p.tp * flops * c.prefill_mfu)
    # A MoE layer's routing and dispatch of the chunks' tokens (and a Gated DeltaNet layer's recurrence) run as
    # kernels of their own, one after another with the step's matmuls: nothing streams beside them to hide under.
    serial_s = _prefill_token_work_s(p, interleaved_tokens, c)
    # The host schedules, samples and detokenizes every running sequence each step.
    per_seq_us = c.cpu_host_us_per_seq if p.kind == "cpu" else c.host_us_per_seq
    overhead_s = step_overhead_s(p.arch, p.tp, p.pp, p.mode, p.kind, c, p.act_dtype_bytes) + batch * per_seq_us * 1e-6
    bound = "memory" if memory_s >= compute_s else "compute"
    return overhead_s + max(memory_s, compute_s) + serial_s, bound


def kv_read_s(p: PerfInputs, batch: float, c: PerfConstants) -> float:
    """A decode step's attention reading every running sequence's KV cache (their mean context: the prompt and
    half the output), at the bandwidth paged attention reaches on an NPU (perf_model.toml kv_bandwidth_efficiency);
    the CPU engine's reads count as its other memory traffic."""
    _flops, bandwidth = _device_rates(p, c)
    efficiency = c.bandwidth_efficiency if p.kind == "cpu" else c.kv_bandwidth_efficiency
    return batch * (p.input_len + p.output_len / 2) * p.kv_bytes_per_token / (bandwidth * efficiency)


def prefill_s(p: PerfInputs, c: PerfConstants, prompts: float = 1.0) -> float:
    """Time to prefill `prompts` prompts in one step: compute-bound, but never faster than one pass over the
    weights (which the prompts of one step share)."""
    flops, bandwidth = _device_rates(p, c)
    tokens = prompts * p.input_len
    compute = (_prefill_time_flops(p, tokens) / (p.tp * p.pp * flops * c.prefill_mfu)
               + _prefill_token_work_s(p, tokens, c))
    memory = p.pp * _weights_read_per_step(p, tokens) / (bandwidth * c.bandwidth_efficiency)
    # Eager prefill pays the launch cost once per step like decode; graphs do not cover prefill.
    mode = "eager" if p.mode == "full_decode_only" else p.mode
    return (max(compute, memory) + step_overhead_s(p.arch, p.tp, p.pp, mode, p.kind, c, p.act_dtype_bytes)
            + moe_prefill_step_s(p, c))


def moe_prefill_step_s(p: PerfInputs, c: PerfConstants) -> float:
    """A prompt-only step's fixed device time in its MoE layers beside their per-token work (perf_model.toml
    moe_prefill_layer_us); none on the CPU engine, whose anchors are dense."""
    return 0.0 if p.kind == "cpu" else p.arch.num_moe_layers * c.moe_prefill_layer_us * 1e-6


def _slots_per_replica(p: PerfInputs) -> float:
    request_len = p.input_len + p.output_len
    kv_slots = p.kv_cache_tokens / request_len if request_len else 0.0
    slots = min(float(p.max_num_seqs), kv_slots)
    if p.max_num_batched_tokens:
        # In steady state each step must also prefill the prompts of the requests that finished: B decode tokens
        # plus B x input/output prompt tokens have to fit the step's token budget.
        slots = min(slots, p.max_num_batched_tokens / (1.0 + p.input_len / max(p.output_len, 1)))
    return max(1.0, slots)


def _closed_loop_share(p: PerfInputs, slots: float) -> tuple[float, float, float, float]:
    """(busy replicas, requests per busy replica, running, queued) of a fixed concurrency: with fewer requests than
    replicas only as many replicas are ever busy (concurrency 1 over eight replicas is one stream, not eight)."""
    busy_replicas = float(min(max(p.replicas, 1), max(p.concurrency, 1)))
    per_replica = max(p.concurrency, 1) / busy_replicas
    running = min(per_replica, slots)
    return busy_replicas, per_replica, running, per_replica - running


def request_overhead_s(kind: str, c: PerfConstants) -> float:
    """A request's cost outside the model (HTTP, tokenizer, scheduling, detokenizer) on a host of `kind`."""
    return (c.cpu_request_overhead_ms if kind == "cpu" else c.request_overhead_ms) / 1e3


def _prefill_chunks(p: PerfInputs, prompts: float) -> int:
    """The steps that prefill `prompts` prompts together under the step's token budget (1 without one)."""
    tokens = max(prompts, 0.0) * p.input_len
    if not p.max_num_batched_tokens or tokens <= p.max_num_batched_tokens:
        return 1
    return math.ceil(tokens / p.max_num_batched_tokens)


def _predict_waves(p: PerfInputs, c: PerfConstants, factors: CalibrationFactors, slots: float) -> Prediction:
    """A closed loop of fixed-length requests: synchronized waves (module docstring)."""
    busy_replicas, _per_replica, running, queued = _closed_loop_share(p, slots)
    step, bound = decode_step_s(p, running, c, factors.step, interleave=False)
    overhead = request_overhead_s(p.kind, c) * factors.ttft
    alone = prefill_s(p, c) * factors.ttft
    together = prefill_s(p, c, running - 1.0) * factors.ttft if running > 1 else 0.0
    # A wave's requests reach the API server together, which takes them in one after another: the k-th request's
    # first token waits for k requests' overhead (the tiny model's median TTFT at 4 and 2 in flight, 16.1 and
    # 9.5 ms, is 2.5 and 1.5 times the same 6 ms). The wave ends with its last request: all the overheads, the
    # first prompt alone, the others in one step, then lockstep decode.
    wave = overhead * running + alone + together + max(p.output_len - 1, 0) * step
    # The medians: the middle request's overhead; from three running on the later requests' prefill; with two,
    # halfway between the first (early first token, its second waiting for the other prompt) and the second.
    later_share = min(max(running - 1.0, 0.0) / 2.0, 1.0)
    # Prompts longer together than a step's token budget are prefilled in chunks, one step each, and a prompt's
    # first token comes with the chunk that ends it: the middle request's after half the chunks, and its next
    # tokens one per remaining chunk step before the lockstep decode (the small model on 2 cores, 15 x 512 prompt
    # tokens in 2048-token chunks: median TTFT about half the wave's prefill, TPOT ~1.6x the lockstep step).
    chunks = _prefill_chunks(p, running - 1.0)
    done = math.ceil(chunks / 2) / chunks
    decode = max(p.output_len - 1, 1)
    ttft = overhead * (running + 1.0) / 2.0 + alone + together * later_share * done
    during = min((1.0 - done) * chunks, decode)
    tpot = (step * (decode - later_share * during) + later_share * (1.0 - done) * together
            + (1.0 - later_share) * together) / decode
    if queued > 0:
        # Requests beyond the free slots wait for whole waves to finish.
        ttft += queued / running * wave
    e2e = ttft + max(p.output_len - 1, 0) * tpot
    output_per_s = busy_replicas * running * p.output_len / wave * factors.throughput if wave > 0 else 0.0
    return Prediction(ttft_ms=ttft * 1e3, tpot_ms=tpot * 1e3, output_tokens_per_s=output_per_s,
                      running_per_replica=running, queued_per_replica=queued, saturated=False, decode_bound=bound,
                      e2e_ms=e2e * 1e3, busy_replicas=busy_replicas, output_len=p.output_len)


def predict(p: PerfInputs, c: PerfConstants | None = None,
            factors: CalibrationFactors | None = None) -> Prediction:
    c = c or perf_constants()
    factors = factors or CalibrationFactors()
    replicas = max(p.replicas, 1)
    slots = _slots_per_replica(p)
    if p.in_waves:
        return _predict_waves(p, c, factors, slots)
    first = prefill_s(p, c) * factors.ttft
    saturated = False

    if p.request_rate is not None:
        # Little's law per replica: in flight = rate x time in system; iterate to a fixed point.
        rate = p.request_rate / replicas
        running = 1.0
        for _ in range(50):
            step, _bound = decode_step_s(p, running, c, factors.step)
            in_system = rate * (first + p.output_len * step)
            running = min(max(in_system, 1.0), slots)
        step, bound = decode_step_s(p, running, c, factors.step)
        capacity = slots / (first + p.output_len * step)
        saturated = rate > capacity
        queued = 0.0
        if saturated:
            # Past capacity the queue grows without bound; report a full batch and the served rate.
            running = slots
            step, bound = decode_step_s(p, running, c, factors.step)
        served_rate = min(rate, slots / (first + p.output_len * step))
        output_per_s = replicas * served_rate * p.output_len
        busy_replicas = float(replicas)
    else:
        busy_replicas, per_replica, running, queued = _closed_loop_share(p, slots)
        step, bound = decode_step_s(p, running, c, factors.step)

    ttft = request_overhead_s(p.kind, c) * factors.ttft + first
    if running > 1:
        # A new prompt waits for the decode step in flight before its chunk is scheduled.
        ttft += step / 2
    if p.request_rate is None and queued > 0:
        # Requests beyond the free slots wait for a running one to finish.
        ttft += queued / running * (first + p.output_len * step)
    # The first token comes with the prefill; the other output_len - 1 one decode step each.
    e2e = ttft + max(p.output_len - 1, 0) * step
    if p.request_rate is None:
        # Little's law over a closed loop: each busy replica keeps per_replica requests in its system, each of
        # which takes e2e; so a replica finishes per_replica / e2e requests a second.
        output_per_s = busy_replicas * per_replica * p.output_len / e2e * factors.throughput if e2e > 0 else 0.0
    return Prediction(
        ttft_ms=ttft * 1e3,
        tpot_ms=step * 1e3,
        output_tokens_per_s=output_per_s,
        running_per_replica=running,
        queued_per_replica=queued if p.request_rate is None else 0.0,
        saturated=saturated,
        decode_bound=bound,
        e2e_ms=e2e * 1e3,
        busy_replicas=busy_replicas,
        output_len=p.output_len,
    )


@dataclass(frozen=True)
class Roofline:
    """What the hardware allows one load at most, from the chips' published peak figures (no efficiency, no
    overhead): a measurement divided by these is the fraction of the hardware it uses."""

    decode_tokens_per_s: float  # output tokens/s if every decode step only streamed its bytes at full bandwidth
    prefill_flops_per_s: float  # peak dense FLOPs of one replica's devices
    bandwidth_bytes_per_s: float  # per device
    batch: float  # sequences per busy replica the decode roofline is for
    busy_replicas: float

    @property
    def fastest_step_s(self) -> float:
        """The fastest decode step the bandwidth allows: a busy replica's batch over its share of the tokens/s."""
        return self.busy_replicas * self.batch / self.decode_tokens_per_s

    def as_dict(self) -> dict[str, float]:
        return {"decode_tokens_per_s": round(self.decode_tokens_per_s, 1),
                "prefill_flops_per_s": self.prefill_flops_per_s,
                "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                "batch": round(self.batch, 2), "busy_replicas": self.busy_replicas}


def roofline(p: PerfInputs, c: PerfConstants | None = None) -> Roofline:
    """The HBM-bandwidth roofline of decode and the FLOPs peak of prefill for the load in `p`."""
    c = c or perf_constants()
    flops, bandwidth = _device_rates(p, c)
    concurrency = max(p.concurrency, 1)
    busy = float(min(max(p.replicas, 1), concurrency))
    batch = max(1.0, min(concurrency / busy, _slots_per_replica(p)))
    context = p.input_len + p.output_len / 2
    # The bytes themselves, at the hardware's bandwidth: not what a dequantizing kernel makes of them.
    bytes_read = (_weights_read_per_step(replace(p, expert_decode_factor=1.0), batch)
                  + batch * context * p.kv_bytes_per_token)
    fastest_step = p.pp * bytes_read / bandwidth
    return Roofline(decode_tokens_per_s=busy * batch / fastest_step, prefill_flops_per_s=p.tp * p.pp * flops,
                    bandwidth_bytes_per_s=bandwidth, batch=batch, busy_replicas=busy)
