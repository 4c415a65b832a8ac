"""Parallel layouts (TP x PP) and how much of a device each one leaves for the KV cache.

A layout is evaluated on one device's memory (npuops.plan.memory); which layouts a target offers and how its
memory is spent are the target's rules (npuops.plan.rules). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from npuops.plan.inputs import Workload
from npuops.plan.memory import MemoryBudget, max_concurrency
from npuops.plan.model import ModelArch, ModelSpec, routed_weight_share
from npuops.plan.performance import PerfInputs, cpu_peak_flops_per_s, predict
from npuops.plan.quantization import expert_decode_factor, matmul_speedup
from npuops.plan.speculative import SpeculativePlan
from npuops.plan.target import HardwareTarget

# vLLM's default upper bound on running sequences; graph capture sizes stop at 512 on Ascend.
DEFAULT_MAX_NUM_SEQS = 256
MAX_CAPTURE_SIZE = 512
_CAPTURE_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes ACL graphs are captured for: a ladder up to min(max_num_seqs, 512), ending on the cap."""
    cap = min(max_num_seqs, MAX_CAPTURE_SIZE)
    sizes = {s for s in _CAPTURE_LADDER if s <= cap}
    sizes.add(cap)
    return tuple(sorted(sizes))


def tp_is_valid(arch: ModelArch, tp: int) -> bool:
    """vLLM's constraints: TP divides the attention heads; KV heads split evenly or replicate evenly; FFNs split."""
    if arch.num_attention_heads % tp:
        return False
    if not arch.is_mla and arch.num_kv_heads % tp and tp % arch.num_kv_heads:
        return False
    if arch.intermediate_size % tp:
        return False
    return not (arch.is_moe and arch.moe_intermediate_size % tp)


def valid_tp_sizes(arch: ModelArch, limit: int) -> list[int]:
    return [tp for tp in range(1, limit + 1) if tp_is_valid(arch, tp)]


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int

    @property
    def chips(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class Sizing:
    """Everything a memory evaluation needs besides the layout."""

    arch: ModelArch
    weight_bytes: int
    act_bytes: float
    block_size: int
    utilization: float
    max_num_batched_tokens: int
    seq_cap: int
    graph: bool
    moe_ep: bool
    cpu_kv_bytes: int | None
    # Bytes per element of the KV cache: the activation dtype's, or 1 for an int8 (C8) cache.
    kv_dtype_bytes: float
    # A speculative draft's own weights (whole) and KV bytes per token (unsplit): MTP layers or a draft model.
    draft_weight_bytes: int = 0
    draft_kv_bytes_per_token: int = 0


@dataclass(frozen=True)
class Evaluated:
    """A layout that fits, with its memory budget and how many replicas of it the target holds."""

    layout: Layout
    budget: MemoryBudget
    replicas: int


def layout_group(target: HardwareTarget) -> Callable[[Layout], int]:
    """0: TP within a node; 1: pipeline stages within a node; 2: an instance spanning nodes."""

    def group(lay: Layout) -> int:
        return 0 if lay.pp == 1 else (1 if lay.chips <= target.devices_per_node else 2)

    return group


def holds_share(ev: Evaluated, concurrency: int, seq_cap: int, need: int, block: int) -> bool:
    """Whether one replica's KV cache holds its share of the requests in flight."""
    share = math.ceil(concurrency / ev.replicas)
    return ev.budget.kv_cache_tokens >= min(share, seq_cap) * round_up(need, block)


def most_served(evaluated: list[Evaluated], need: int, block: int) -> Evaluated:
    """The layout that serves the most requests at once over all its replicas (fewest chips on a tie)."""
    return max(evaluated, key=lambda ev: (ev.replicas * max_concurrency(ev.budget.kv_cache_tokens, need, block),
                                          -ev.layout.chips))


def perf_inputs(model: ModelSpec, target: HardwareTarget, workload: Workload, s: Sizing, ev: Evaluated, mode: str,
                max_num_seqs: int, spec: SpeculativePlan | None = None, ep_size: int | None = None) -> PerfInputs:
    """What the performance model needs about one evaluated layout; `ep_size` is a multi-node cluster's expert-
    parallel group (None: the layout's own devices when the model runs expert parallel)."""
    if ep_size is None:
        ep_size = ev.layout.tp * ev.layout.pp if s.moe_ep and ev.layout.chips > 1 else 1
    return PerfInputs(
        arch=model.arch, kind=target.kind, tp=ev.layout.tp, pp=ev.layout.pp, replicas=ev.replicas,
        weight_bytes=s.weight_bytes, kv_bytes_per_token=ev.budget.kv_bytes_per_token, act_dtype_bytes=s.act_bytes,
        flops_per_s=target.flops_per_s or cpu_peak_flops_per_s(target.cpu_features, target.cpu_count or 1,
                                                                "bfloat16" if s.act_bytes == 2 else "float32",
                                                                matmul=target.cpu_matmul),
        bandwidth_bytes_per_s=target.bandwidth_bytes_per_s, mode=mode,
        input_len=workload.input_len, output_len=workload.output_len, concurrency=workload.concurrency,
        request_rate=workload.request_rate, max_num_seqs=max_num_seqs, kv_cache_tokens=ev.budget.kv_cache_tokens,
        cpu_count=target.cpu_count, max_num_batched_tokens=s.max_num_batched_tokens,
        fixed_lengths=workload.fixed_lengths,
        spec_tokens=spec.num_tokens if spec else 0, spec_acceptance=spec.acceptance if spec else 0.0,
        draft_layers=spec.draft_layers if spec else 0, draft_weight_bytes=spec.draft_weight_bytes if spec else 0,
        draft_parallel=spec.parallel if spec else False,
        routed_weight_share=routed_weight_share(model.arch, s.act_bytes, model.quantization),
        linear_speedup=matmul_speedup(model.quantization),
        expert_decode_factor=expert_decode_factor(model.quantization), expert_parallel_size=ep_size,
    )


def choose_layout(model: ModelSpec, target: HardwareTarget, workload: Workload, s: Sizing,
                  evaluated: list[Evaluated], mode: str) -> Evaluated:
    """Throughput: the fewest chips per instance whose KV holds its share of the workload (replicas use the rest).
    Latency: the single instance with the lowest predicted TPOT at the workload's concurrency."""
    need = workload.request_tokens
    if workload.objective == "latency":

        def tpot(ev: Evaluated) -> tuple[float, int]:
            perf = predict(perf_inputs(model, target, workload, s, ev, mode, s.seq_cap))
            return (round(perf.tpot_ms, 2), ev.layout.chips)

        within_node = [ev for ev in evaluated if ev.layout.chips <= target.devices_per_node] or evaluated
        return min(within_node, key=tpot)
    for ev in evaluated:
        if holds_share(ev, workload.concurrency, s.seq_cap, need, s.block_size):
            return ev
    # Nothing holds the whole share: take the layout that serves the most requests at once.
    return most_served(evaluated, need, s.block_size)
