"""make_plan: a vLLM configuration for a model on a target, every value with its reason.

The planner is pure: a ModelSpec, a HardwareTarget, a Workload and the user's PlanOptions in, a Plan out.
Where a value differs from the seed document's advice (TP=8, block 32, max_num_batched_tokens 4096,
max_model_len 2048, float16, one OpenMP/OpenBLAS thread) the explanation says which and why.
With several nodes, `_plan_cluster` spreads the plan over them (npuops.plan.cluster): Ray TP x PP when one
instance needs more than a node, vLLM's native data parallel (with expert parallel for MoE) otherwise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from npuops.errors import BadInputError
from npuops.plan.cluster import ClusterPlan, check_strategy, hccl_buffsize_for_ep, routed_expert_fraction
from npuops.plan.constants import MemoryConstants, memory_constants
from npuops.plan.environment import (
    HCCL_DEFAULT_BUFFSIZE_MB,
    MOE_EP_HCCL_BUFFSIZE_MB,
    EnvSetting,
    default_release,
    environment_for,
    feature_available,
    parse_release,
)
from npuops.plan.memory import (
    MemoryBudget,
    activation_peak_bytes,
    graph_reserve_bytes,
    kv_bytes_per_token,
    kv_cache_tokens,
    max_concurrency,
    runtime_overhead_bytes,
    weights_per_device,
    weights_per_device_ep,
)
from npuops.plan.model import (
    QUANTIZATION_FLAGS,
    ModelArch,
    ModelSpec,
    count_parameters,
    dtype_bytes,
    weight_bytes_from_arch,
)
from npuops.plan.performance import PerfInputs, Prediction, predict
from npuops.plan.target import HardwareTarget

OBJECTIVES = ("throughput", "latency")

# The seed document's advice, which the explanations compare against.
SEED = {
    "tensor_parallel_size": 8,
    "block_size": 32,
    "max_num_batched_tokens": 4096,
    "max_model_len": 2048,
    "dtype": "float16",
}

ASCEND_BLOCK_SIZE = 128
# vLLM's default upper bound on running sequences; graph capture sizes stop at 512 on Ascend.
DEFAULT_MAX_NUM_SEQS = 256
MAX_CAPTURE_SIZE = 512
_CAPTURE_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


class PlanDoesNotFit(BadInputError):
    """The model and workload cannot be served on the given hardware; the message says what would fit."""


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    concurrency: int = 1
    request_rate: float | None = None
    objective: str = "throughput"


@dataclass(frozen=True)
class PlanOptions:
    """Values the user fixed; None means "let the planner decide"."""

    tp: int | None = None
    pp: int | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    dtype: str | None = None
    vllm_ascend_version: str | None = None
    enforce_eager: bool = False
    kv_cache_memory_bytes: int | None = None
    multinode: str = "auto"  # with nodes > 1: "ray", "dp" or "auto" (cluster.py)


@dataclass(frozen=True)
class FamilyRules:
    """What differs between chip generations when serving (ascend-facts.md section 5)."""

    utilization: float
    dtype: str
    graph: bool
    throughput_batched_tokens: int
    latency_batched_tokens: int
    max_num_seqs: int


_FAMILY_RULES = {
    "A2": FamilyRules(0.9, "bfloat16", True, 8192, 2048, DEFAULT_MAX_NUM_SEQS),
    "A3": FamilyRules(0.9, "bfloat16", True, 8192, 2048, DEFAULT_MAX_NUM_SEQS),
    # 310P: LPDDR instead of HBM, float16 only, eager in vllm-ascend's 310P support, smaller batches.
    "310P": FamilyRules(0.8, "float16", False, 4096, 2048, 64),
    "cpu": FamilyRules(0.9, "bfloat16", False, 2048, 2048, DEFAULT_MAX_NUM_SEQS),
}


@dataclass(frozen=True)
class Explanation:
    key: str
    value: Any
    why: str
    seed: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "value": self.value, "why": self.why}
        if self.seed:
            out["seed"] = self.seed
        return out


@dataclass(frozen=True)
class Replica:
    index: int
    node: int
    devices: tuple[int, ...]

    @property
    def visible_devices(self) -> str:
        return ",".join(str(d) for d in self.devices)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "node": self.node,
            "devices": list(self.devices),
            "visible_devices": self.visible_devices,
        }


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    target: HardwareTarget
    workload: Workload
    config: dict[str, Any]
    env: dict[str, str]
    memory: MemoryBudget
    max_concurrency: float
    prediction: Prediction
    explanations: tuple[Explanation, ...]
    warnings: tuple[str, ...]
    replicas: tuple[Replica, ...]
    vllm_args: tuple[str, ...]
    cluster: ClusterPlan | None = None

    def explanation(self, key: str) -> Explanation:
        for item in self.explanations:
            if item.key == key:
                return item
        raise KeyError(key)

    def to_json(self) -> dict[str, Any]:
        arch = self.model.arch
        counts = count_parameters(arch)
        chip = self.target.chip
        return {
            "model": {
                "name": self.model.served_name,
                "path": str(self.model.path) if self.model.path else None,
                "catalog_name": self.model.catalog_name,
                "model_type": arch.model_type,
                "architectures": list(arch.architectures),
                "num_layers": arch.num_layers,
                "hidden_size": arch.hidden_size,
                "num_attention_heads": arch.num_attention_heads,
                "num_kv_heads": arch.num_kv_heads,
                "head_dim": arch.head_dim,
                "max_position_embeddings": arch.max_position_embeddings,
                "moe": {"experts": arch.num_experts, "active_experts": arch.num_experts_per_tok}
                if arch.is_moe
                else None,
                "mla": arch.is_mla,
                "parameters": counts.total,
                "active_parameters": counts.active,
                "torch_dtype": arch.torch_dtype,
                "quantization": self.model.quantization,
                "weight_bytes": self.model.weight_bytes,
                "weight_bytes_source": self.model.weight_bytes_source,
                "weights_present": self.model.weights_present,
            },
            "hardware": {
                "kind": self.target.kind,
                "label": self.target.label,
                "chip": chip.name if chip else None,
                "family": self.target.family,
                "devices_per_node": self.target.devices_per_node,
                "nodes": self.target.nodes,
                "device_ids": list(self.target.device_ids),
                "memory_bytes_per_device": self.target.memory_bytes_per_device,
            },
            "workload": {
                "input_len": self.workload.input_len,
                "output_len": self.workload.output_len,
                "concurrency": self.workload.concurrency,
                "request_rate": self.workload.request_rate,
                "objective": self.workload.objective,
            },
            "config": dict(self.config),
            "env": dict(self.env),
            "memory": {
                "weights_bytes_per_device": self.memory.weights_bytes,
                "kv_cache_bytes_per_token": self.memory.kv_bytes_per_token,
                "kv_cache_tokens": self.memory.kv_cache_tokens,
                "max_concurrency": round(self.max_concurrency, 2),
                "device_bytes": self.memory.device_bytes,
                "usable_bytes": self.memory.usable_bytes,
                "activation_bytes": self.memory.activation_bytes,
                "graph_bytes": self.memory.graph_bytes,
                "runtime_bytes": self.memory.runtime_bytes,
                "kv_budget_bytes": self.memory.kv_budget_bytes,
            },
            "prediction": self.prediction.as_dict(),
            "explanations": [e.as_dict() for e in self.explanations],
            "warnings": list(self.warnings),
            "replicas": [r.as_dict() for r in self.replicas],
            "vllm_args": list(self.vllm_args),
            "cluster": self.cluster.as_dict() if self.cluster else None,
        }


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _device_memory(target: HardwareTarget) -> str:
    """How vendors name the chip's memory (64 GB for a 65536 MiB 910B), not a bytes conversion."""
    if target.chip is not None and target.memory_bytes_per_device == target.chip.memory_bytes:
        return f"{target.chip.memory_gb} GB"
    return f"{target.memory_bytes_per_device / 2**30:.1f} GiB"


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass
class _Notes:
    explanations: list[Explanation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def explain(self, key: str, value: Any, why: str, seed: str | None = None) -> None:
        """Explain a value; a later decision about the same key replaces the earlier one in place."""
        for i, item in enumerate(self.explanations):
            if item.key == key:
                self.explanations[i] = Explanation(key, value, why, seed)
                return
        self.explanations.append(Explanation(key, value, why, seed))

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)


# ---------------------------------------------------------------------------------------------------------
# Validation and the single-valued decisions
# ---------------------------------------------------------------------------------------------------------


def _check_workload(w: Workload) -> None:
    if w.input_len < 1 or w.output_len < 1:
        raise BadInputError(
            f"input length {w.input_len} / output length {w.output_len}", "both must be at least 1 token"
        )
    if w.concurrency < 1:
        raise BadInputError(f"concurrency {w.concurrency}", "use at least 1 request in flight")
    if w.request_rate is not None and not w.request_rate > 0:
        raise BadInputError(f"request rate {w.request_rate}", "use a positive number of requests per second")
    if w.objective not in OBJECTIVES:
        raise BadInputError(f"objective {w.objective!r}", f"use one of {', '.join(OBJECTIVES)}")


def _rules(target: HardwareTarget) -> FamilyRules:
    family = target.family
    if family not in _FAMILY_RULES:
        raise BadInputError(
            f"vllm-ascend does not support {target.chip.name if target.chip else family} ({family})",
            "plan for an A2 (910B), A3 or 310P node, or for --hardware cpu",
        )
    return _FAMILY_RULES[family]


def _choose_dtype(model: ModelSpec, target: HardwareTarget, options: PlanOptions, notes: _Notes) -> str:
    asked = options.dtype.lower() if options.dtype else None
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    if asked is not None:
        asked = aliases.get(asked, asked)
        if asked not in ("bfloat16", "float16", "float32"):
            raise BadInputError(f"--dtype {options.dtype!r}", "use bfloat16, float16 or float32")
    torch_dtype = model.arch.torch_dtype
    if target.kind == "cpu":
        if asked == "float16":
            notes.warn("float16 on the CPU engine is slow or unsupported; planned bfloat16 instead")
            asked = "bfloat16"
        dtype = asked or ("float32" if torch_dtype == "float32" else "bfloat16")
        notes.explain(
            "dtype",
            dtype,
            "the vLLM CPU engine computes in float32 or bfloat16"
            + (" (as asked)" if asked else f"; {dtype} follows the checkpoint's {torch_dtype}"),
            None if dtype == SEED["dtype"] else "the seed's float16 is not a CPU-engine dtype",
        )
        return dtype
    chip = target.chip
    assert chip is not None
    if not chip.bf16:
        if asked == "bfloat16":
            # Operator-friendly: plan what works and say so, rather than refuse.
            notes.warn(
                f"{chip.name} has no bfloat16 kernels (EZ1001 ... DT_BFLOAT16 at start-up); planned float16 instead"
            )
        dtype = "float32" if asked == "float32" else "float16"
        notes.explain(
            "dtype", dtype, f"{chip.name} ({chip.family}) runs float16 only: its bfloat16 kernels do not exist"
        )
        return dtype
    dtype = asked or "bfloat16"
    if asked:
        why = f"{dtype} as asked; {chip.family} supports bfloat16 and float16"
    else:
        why = (
            f"bfloat16 is the dtype vllm-ascend's {chip.family} kernels are built and tested for; "
            "same 2 bytes as float16"
        )
        if torch_dtype == "float16":
            why += " (the checkpoint is float16; vLLM casts it once at load)"
    seed = None
    if dtype != SEED["dtype"]:
        seed = "the seed uses float16, which works on A2/A3 but gains nothing over bfloat16 there and risks overflow"
    notes.explain("dtype", dtype, why, seed)
    if dtype == "float32":
        notes.warn("float32 doubles weight and KV memory on the NPU and halves matmul throughput")
    return dtype


def _choose_block_size(target: HardwareTarget, options: PlanOptions, notes: _Notes) -> int:
    asked = options.block_size
    if target.kind == "cpu":
        block = asked or 128
        if block < 32 or block % 32:
            raise BadInputError(
                f"--block-size {block} on the CPU engine", "use a multiple of 32 (the CPU attention backend needs it)"
            )
        notes.explain(
            "block_size",
            block,
            "the CPU attention backend pages the KV cache in blocks that are a multiple of 32"
            + ("" if asked else "; 128 is vLLM's CPU default"),
            None
            if block == SEED["block_size"]
            else "the seed's 32 also works on CPU; 128 means fewer block-table entries",
        )
        return block
    if asked is not None and asked != ASCEND_BLOCK_SIZE:
        notes.warn(
            f"--block-size {asked} is overridden: vllm-ascend forces 128 when prefix caching or chunked prefill is on "
            "(the default)"
        )
    why = "vllm-ascend forces block size 128 with prefix caching or chunked prefill (both on by default)"
    if asked is not None and asked != ASCEND_BLOCK_SIZE:
        why += f"; the {asked} asked for would be replaced at start-up anyway"
    notes.explain(
        "block_size",
        ASCEND_BLOCK_SIZE,
        why,
        "the seed's block_size=32 is overridden to 128 by vllm-ascend on current stacks",
    )
    return ASCEND_BLOCK_SIZE


def _choose_utilization(target: HardwareTarget, rules: FamilyRules, options: PlanOptions, notes: _Notes) -> float:
    util = options.gpu_memory_utilization
    if util is not None and not 0.1 <= util <= 0.98:
        raise BadInputError(f"--gpu-memory-utilization {util}", "use a fraction between 0.1 and 0.98")
    if target.kind == "cpu":
        return util or rules.utilization
    value = util or rules.utilization
    why = (
        "as asked"
        if util
        else (
            "0.8 on 310P: its LPDDR is shared with more runtime state and 0.8 is the common working value"
            if target.family == "310P"
            else "vLLM's default 0.9; start-up fails if free HBM is below total x utilization"
        )
    )
    notes.explain("gpu_memory_utilization", value, why)
    return value


def _graph_mode(target: HardwareTarget, rules: FamilyRules, release: str, options: PlanOptions) -> str:
    if target.kind == "cpu" or options.enforce_eager or not rules.graph:
        return "eager"
    if feature_available("full_decode_only", release):
        return "full_decode_only"
    if feature_available("piecewise_graph", release):
        return "piecewise"
    return "eager"


def _capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    cap = min(max_num_seqs, MAX_CAPTURE_SIZE)
    sizes = {s for s in _CAPTURE_LADDER if s <= cap}
    sizes.add(cap)
    return tuple(sorted(sizes))


# ---------------------------------------------------------------------------------------------------------
# Parallelism and memory
# ---------------------------------------------------------------------------------------------------------


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
class _Layout:
    tp: int
    pp: int

    @property
    def chips(self) -> int:
        return self.tp * self.pp


def _parallel_candidates(arch: ModelArch, target: HardwareTarget, options: PlanOptions) -> list[_Layout]:
    if target.kind == "cpu":
        if (options.tp or 1) != 1:
            raise BadInputError("the CPU engine runs without tensor parallel", "drop --tp with --hardware cpu")
        if target.nodes == 1:
            if (options.pp or 1) != 1:
                raise BadInputError("the CPU plan runs one engine process", "drop --pp with --hardware cpu")
            return [_Layout(1, 1)]
        # CPU hosts: one engine process per host, as pipeline stages (ray) or data-parallel ranks.
        pp = options.pp or target.nodes
        if pp > target.nodes or pp > arch.num_layers:
            raise BadInputError(f"--pp {pp} with {target.nodes} CPU hosts",
                                f"use at most {min(target.nodes, arch.num_layers)}")
        return [_Layout(1, 1), _Layout(1, pp)] if pp > 1 else [_Layout(1, 1)]
    per_node = target.devices_per_node
    tps = valid_tp_sizes(arch, per_node)
    if options.tp is not None:
        if options.tp not in tps:
            raise BadInputError(
                f"--tp {options.tp} does not work for this model on {per_node} devices per node "
                f"({arch.num_attention_heads} heads, {arch.num_kv_heads} KV heads)",
                f"use one of {', '.join(str(t) for t in tps)}",
            )
        tps = [options.tp]
    layouts = []
    max_pp = min(arch.num_layers, per_node * target.nodes)
    pps = [options.pp] if options.pp is not None else list(range(1, max_pp + 1))
    for pp in pps:
        if pp < 1 or pp > arch.num_layers:
            raise BadInputError(f"--pp {pp}", f"use 1 to {arch.num_layers} (the model's layer count)")
        for tp in tps:
            chips = tp * pp
            if chips > per_node * target.nodes:
                continue
            if chips > per_node and (chips % per_node or per_node % tp):
                # Spanning nodes: whole nodes, and no TP group straddling a node boundary.
                continue
            layouts.append(_Layout(tp, pp))
    # Tensor parallel within a node first (no pipeline bubbles, lowest per-token latency), then pipeline stages
    # within a node (for head counts TP alone cannot split far enough), then instances spanning nodes.
    group = _layout_group(target)
    return sorted(layouts, key=lambda lay: (group(lay), lay.chips, -lay.tp))


def _layout_group(target: HardwareTarget) -> Callable[[_Layout], int]:
    def group(lay: _Layout) -> int:
        return 0 if lay.pp == 1 else (1 if lay.chips <= target.devices_per_node else 2)

    return group


@dataclass(frozen=True)
class _Sizing:
    """Everything the memory evaluation needs besides the layout."""

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


def _budget(target: HardwareTarget, s: _Sizing, layout: _Layout, c: MemoryConstants) -> MemoryBudget:
    arch = s.arch
    weights = weights_per_device(s.weight_bytes, arch, layout.tp, layout.pp, s.act_bytes)
    per_token = kv_bytes_per_token(arch, s.act_bytes, layout.tp, layout.pp)
    device = target.memory_bytes_per_device
    if target.kind == "cpu":
        kv_budget = s.cpu_kv_bytes or 0
        process = c.cpu_process_bytes
        if weights + kv_budget + process > device:
            kv_budget = -1  # does not fit the NUMA node's RAM
        tokens = kv_cache_tokens(kv_budget, arch, s.block_size, s.act_bytes, 1, 1)
        return MemoryBudget(device, kv_budget, weights, 0, 0, process, kv_budget, per_token, tokens)
    usable = int(device * c.visible_fraction.get(target.family, 1.0) * s.utilization)
    activation = activation_peak_bytes(arch, s.max_num_batched_tokens, s.seq_cap, layout.tp, s.act_bytes, c)
    graph = graph_reserve_bytes(_capture_sizes(s.seq_cap), c) if s.graph else 0
    buff = MOE_EP_HCCL_BUFFSIZE_MB if s.moe_ep else HCCL_DEFAULT_BUFFSIZE_MB
    runtime = runtime_overhead_bytes(layout.tp * layout.pp, buff, c, kind=target.kind)
    kv_budget = usable - weights - activation - graph - runtime
    tokens = kv_cache_tokens(kv_budget, arch, s.block_size, s.act_bytes, layout.tp, layout.pp)
    return MemoryBudget(device, usable, weights, activation, graph, runtime, kv_budget, per_token, tokens)


def _serving_weight_bytes(model: ModelSpec, dtype: str) -> int:
    """Weight bytes in device memory at the serving dtype (a float32 plan doubles a bf16 checkpoint)."""
    arch = model.arch
    if model.weight_bytes is None:
        return weight_bytes_from_arch(arch, dtype, model.quantization)
    if model.quantization is not None:
        return model.weight_bytes
    stored = dtype_bytes(arch.torch_dtype)
    return int(model.weight_bytes * dtype_bytes(dtype) / stored)


# ---------------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Evaluated:
    layout: _Layout
    budget: MemoryBudget
    replicas: int


def _replica_count(target: HardwareTarget, layout: _Layout, objective: str) -> int:
    if target.kind == "cpu" or objective != "throughput":
        return 1
    per_node = target.devices_per_node
    if layout.chips > per_node:
        return max(1, target.total_devices // layout.chips)
    return (per_node // layout.chips) * target.nodes


def _replica_layout(target: HardwareTarget, layout: _Layout, count: int) -> tuple[Replica, ...]:
    if target.kind == "cpu":
        return (Replica(0, 0, ()),)
    ids = target.device_ids
    replicas = []
    if layout.chips > target.devices_per_node:
        # One instance spanning nodes: the same device ids on every node it uses.
        return (Replica(0, 0, ids),)
    per_node = target.devices_per_node // layout.chips
    index = 0
    for node in range(target.nodes):
        for slot in range(per_node):
            if index >= count:
                break
            replicas.append(Replica(index, node, ids[slot * layout.chips : (slot + 1) * layout.chips]))
            index += 1
    return tuple(replicas)


def _perf_inputs(
    model: ModelSpec,
    target: HardwareTarget,
    workload: Workload,
    s: _Sizing,
    ev: _Evaluated,
    mode: str,
    max_num_seqs: int,
) -> PerfInputs:
    return PerfInputs(
        arch=model.arch,
        kind=target.kind,
        tp=ev.layout.tp,
        pp=ev.layout.pp,
        replicas=ev.replicas,
        weight_bytes=s.weight_bytes,
        kv_bytes_per_token=ev.budget.kv_bytes_per_token,
        act_dtype_bytes=s.act_bytes,
        flops_per_s=target.flops_per_s,
        bandwidth_bytes_per_s=target.bandwidth_bytes_per_s,
        mode=mode,
        input_len=workload.input_len,
        output_len=workload.output_len,
        concurrency=workload.concurrency,
        request_rate=workload.request_rate,
        max_num_seqs=max_num_seqs,
        kv_cache_tokens=ev.budget.kv_cache_tokens,
        cpu_count=target.cpu_count,
        max_num_batched_tokens=s.max_num_batched_tokens,
    )


def _does_not_fit(
    model: ModelSpec,
    target: HardwareTarget,
    workload: Workload,
    s: _Sizing,
    candidates: list[_Layout],
    required_tokens: int,
    c: MemoryConstants,
) -> PlanDoesNotFit:
    """Say what would fit: more chips, a quantization, or a shorter max_model_len."""
    arch = model.arch
    best = max((_budget(target, s, lay, c) for lay in candidates), key=lambda b: b.kv_budget_bytes, default=None)
    need = workload.input_len + workload.output_len
    problem = (
        f"{model.served_name} ({_gb(s.weight_bytes)} of weights) does not fit {target.label} "
        f"with KV room for one {required_tokens}-token request"
    )
    alternatives: list[str] = []
    if best is not None and best.kv_cache_tokens >= need:
        alternatives.append(
            f"a shorter --max-model-len (at most {best.kv_cache_tokens // s.block_size * s.block_size})"
        )
    if target.kind == "npu":
        per_node = target.devices_per_node
        tps = valid_tp_sizes(arch, per_node)
        for nodes in range(target.nodes + 1, target.nodes + 8):
            for tp in sorted(tps, reverse=True):
                pp_total = nodes * per_node // tp
                if per_node % tp or pp_total > arch.num_layers:
                    continue
                lay = _Layout(tp, pp_total)
                if _budget(target, s, lay, c).kv_cache_tokens >= required_tokens:
                    alternatives.append(
                        f"{nodes} nodes of {target.chip.name if target.chip else 'this kind'}x{per_node} "
                        f"(--nodes {nodes}: TP{tp} x PP{pp_total})"
                    )
                    break
            else:
                continue
            break
        if model.quantization is None:
            for quant in ("W8A8", "W4A8"):
                q_bytes = weight_bytes_from_arch(arch, "bfloat16" if s.act_bytes == 2 else "float32", quant)
                q_sizing = replace(s, weight_bytes=q_bytes)
                if any(_budget(target, q_sizing, lay, c).kv_cache_tokens >= required_tokens for lay in candidates):
                    alternatives.append(f"--quantization {quant} ({_gb(q_bytes)} of weights, ModelSlim-quantized)")
                    break
    else:
        alternatives.append("a larger --kv-cache-memory-bytes or a machine with more RAM per NUMA node")
    fix = "use " + "; or ".join(alternatives) if alternatives else "use a smaller model or a bigger target"
    return PlanDoesNotFit(problem, fix)


def make_plan(model: ModelSpec, target: HardwareTarget, workload: Workload, options: PlanOptions | None = None) -> Plan:
    options = options or PlanOptions()
    _check_workload(workload)
    rules = _rules(target)
    c = memory_constants()
    notes = _Notes()
    arch = model.arch
    for note in model.notes:
        notes.warn(note)

    release = options.vllm_ascend_version or default_release()
    parse_release(release)
    if target.kind == "npu" and target.chip is not None and not target.chip.vllm_ascend:
        raise BadInputError(
            f"vllm-ascend does not support {target.chip.name} ({target.chip.family})",
            "plan for an A2 (910B), A3 or 310P node",
        )

    dtype = _choose_dtype(model, target, options, notes)
    act_bytes = dtype_bytes(dtype)
    weight_bytes = _serving_weight_bytes(model, dtype)
    block = _choose_block_size(target, options, notes)
    utilization = _choose_utilization(target, rules, options, notes)
    mode = _graph_mode(target, rules, release, options)
    need = workload.input_len + workload.output_len
    if need > arch.max_position_embeddings:
        raise BadInputError(
            f"input {workload.input_len} + output {workload.output_len} = {need} tokens exceeds the model's "
            f"{arch.max_position_embeddings} positions",
            f"shorten the workload to at most {arch.max_position_embeddings} tokens per request",
        )

    # max_model_len: explicit, else headroom above the workload within the model's positions.
    if options.max_model_len is not None:
        if options.max_model_len > arch.max_position_embeddings:
            raise BadInputError(
                f"--max-model-len {options.max_model_len} exceeds the model's {arch.max_position_embeddings} positions",
                f"use at most {arch.max_position_embeddings}",
            )
        if options.max_model_len < need:
            raise BadInputError(
                f"--max-model-len {options.max_model_len} is shorter than a workload request ({need} tokens)",
                f"use at least {need}, or shorten --input-len/--output-len",
            )
        wanted_len = options.max_model_len
    elif target.family == "310P":
        wanted_len = min(arch.max_position_embeddings, max(1024, _round_up(need, 512)))
    elif target.kind == "cpu":
        wanted_len = min(arch.max_position_embeddings, max(512, _pow2_at_least(need)))
    else:
        wanted_len = min(arch.max_position_embeddings, max(4096, _pow2_at_least(2 * need)))

    # max_num_batched_tokens: the prefill chunk, chosen before the layout because it sizes the activations.
    if options.max_num_batched_tokens is not None:
        if options.max_num_batched_tokens < 1:
            raise BadInputError("--max-num-batched-tokens must be positive", "use e.g. 8192")
        batched = options.max_num_batched_tokens
    elif workload.objective == "throughput":
        batched = max(rules.throughput_batched_tokens, min(_round_up(workload.input_len, block), 16384))
    else:
        batched = min(16384, max(rules.latency_batched_tokens, _round_up(workload.input_len, block)))
    seq_cap = options.max_num_seqs or rules.max_num_seqs

    moe_ep = arch.is_moe and target.kind == "npu"
    cpu_kv = None
    if target.kind == "cpu":
        cpu_kv = options.kv_cache_memory_bytes
        if cpu_kv is None:
            room = target.memory_bytes_per_device // 2 - weight_bytes - c.cpu_process_bytes
            cpu_kv = max(0, min(c.cpu_default_kv_bytes, room)) // 2**20 * 2**20
        elif cpu_kv <= 0:
            raise BadInputError(f"--kv-cache-memory-bytes {cpu_kv}", "use a positive size, e.g. 256M")
    elif options.kv_cache_memory_bytes is not None:
        raise BadInputError("--kv-cache-memory-bytes applies to the CPU target", "use --gpu-memory-utilization on NPUs")

    sizing = _Sizing(
        arch, weight_bytes, act_bytes, block, utilization, batched, seq_cap, mode != "eager", moe_ep, cpu_kv
    )
    candidates = _parallel_candidates(arch, target, options)
    strategy = check_strategy(options.multinode)
    if strategy != "auto" and target.nodes == 1:
        raise BadInputError(f"--multinode {strategy} plans for several nodes", "add --nodes N (N > 1), or drop it")
    if strategy == "ray":
        spanning = [lay for lay in candidates if lay.chips > target.devices_per_node]
        if not spanning:
            raise BadInputError(
                f"--multinode ray: no TP x PP split of {arch.num_layers} layers spans "
                f"{target.nodes} nodes of {target.devices_per_node} devices",
                "use --multinode dp, or fewer --nodes")
        candidates = spanning
    elif (strategy == "dp" and not (arch.is_moe and target.kind == "npu")) or target.kind == "cpu":
        # Native data parallel: every rank holds the whole model, so no rank spans nodes. (MoE ranks share the
        # experts instead: _plan_cluster sizes that, whatever single-instance layouts fit.)
        candidates = [lay for lay in candidates if lay.chips <= target.devices_per_node]
    # Expert parallel only makes sense with more than one device holding experts.
    evaluated: list[_Evaluated] = []
    required = _round_up(need, block)
    group_of = _layout_group(target)
    for layout in candidates:
        if evaluated and group_of(layout) != group_of(evaluated[0].layout):
            break  # a simpler kind of layout already fits: do not reach for pipeline stages or more nodes
        s = sizing if layout.chips > 1 or not moe_ep else replace(sizing, moe_ep=False)
        budget = _budget(target, s, layout, c)
        if budget.kv_cache_tokens >= max(required, options.max_model_len or 0):
            evaluated.append(_Evaluated(layout, budget, _replica_count(target, layout, workload.objective)))
    if not evaluated:
        raise _does_not_fit(model, target, workload, sizing, candidates, max(required, options.max_model_len or 0), c)

    chosen = _choose_layout(model, target, workload, sizing, evaluated, mode, seq_cap, need, block)
    cluster: ClusterPlan | None = None
    if target.nodes > 1:
        chosen, cluster = _plan_cluster(model, target, workload, sizing, chosen, strategy, options, mode, need,
                                        max(required, options.max_model_len or 0), c, notes)
    layout, budget = chosen.layout, chosen.budget
    moe_ep = (moe_ep and layout.chips > 1) or (cluster is not None and cluster.expert_parallel)
    if target.kind == "cpu" and layout.pp > 1:
        # vLLM's CPU engine creates the tensors a later pipeline stage receives only in its warm-up run, which
        # --enforce-eager skips: the first request then fails (AssertionError: intermediate_tensors is not None).
        if options.enforce_eager:
            notes.warn("--enforce-eager with pipeline stages on the CPU engine: /health answers, but the first "
                       "request fails (the CPU model runner skips the warm-up that creates the stage tensors)")
        else:
            mode = "cpu_compiled"

    # max_model_len must leave KV room for at least one full-length request (vLLM checks at start-up).
    if options.max_model_len is None and budget.kv_cache_tokens < wanted_len:
        fitted = max(required, budget.kv_cache_tokens // block * block)
        notes.warn(
            f"max_model_len lowered from {wanted_len} to {fitted}: "
            f"the KV cache holds only {budget.kv_cache_tokens} tokens"
        )
        wanted_len = fitted
    max_model_len = wanted_len

    kv_conc = int(max_concurrency(budget.kv_cache_tokens, need, block))
    per_replica = math.ceil(workload.concurrency / chosen.replicas)
    if options.max_num_seqs is not None:
        max_num_seqs = options.max_num_seqs
        seqs_why = "as asked"
    elif workload.objective == "throughput":
        max_num_seqs = max(1, min(seq_cap, kv_conc))
        if max_num_seqs >= 16:
            max_num_seqs = max_num_seqs // 8 * 8
        seqs_why = (
            f"as many sequences as the KV cache holds at {need} tokens each ({kv_conc}), capped at {seq_cap}: "
            "a bigger decode batch reads the same weights for more tokens"
        )
    else:
        max_num_seqs = max(1, min(seq_cap, kv_conc, max(8, _round_up(per_replica, 8))))
        seqs_why = (
            f"room for the workload's {per_replica} concurrent requests with little slack: a small decode batch keeps "
            "each step short"
        )
    if max_num_seqs > batched:
        max_num_seqs = batched
    if kv_conc < per_replica:
        notes.warn(
            f"KV fits only {kv_conc} concurrent {need}-token requests per instance; the rest of the "
            f"{workload.concurrency} queue (more chips, a quantization or shorter requests would help)"
        )

    capture = _capture_sizes(max_num_seqs) if mode != "eager" else ()
    settings = _environment(target, release, layout, moe_ep, 1 if cluster else chosen.replicas, notes,
                            collective=layout.chips > 1 or cluster is not None)
    # A cluster is one instance: every node gives it all its planned devices.
    replicas = (Replica(0, 0, target.device_ids if target.kind == "npu" else ()),) if cluster else (
        _replica_layout(target, layout, chosen.replicas))
    env = {e.name: e.value for e in settings}
    if len(replicas) == 1 and target.kind == "npu":
        env["ASCEND_RT_VISIBLE_DEVICES"] = replicas[0].visible_devices
    if moe_ep and target.kind == "npu":
        # The memory budget above assumed the flat 1024 MB; the kernels' own formula usually needs less.
        buffer = hccl_buffsize_for_ep(arch, cluster.ep_size if cluster else layout.tp, max_num_seqs)
        if cluster is not None:
            cluster = replace(cluster, hccl_buffsize_mb=buffer.mb)
        env["HCCL_BUFFSIZE"] = str(buffer.mb)
        notes.explain("env.HCCL_BUFFSIZE", buffer.mb, buffer.why + f" ({max_num_seqs} sequences per rank per step)",
                      f"the usual advice is a flat {MOE_EP_HCCL_BUFFSIZE_MB}: sized from the model and batch instead")

    prediction = predict(_perf_inputs(model, target, workload, sizing, chosen, mode, max_num_seqs))

    _explain_parallelism(model, target, workload, sizing, chosen, notes)
    if cluster is not None:
        _explain_cluster_parallelism(model, cluster, budget, notes)
    _explain_lengths(arch, target, workload, max_model_len, batched, options, need, notes)
    notes.explain("max_num_seqs", max_num_seqs, seqs_why)
    _explain_memory(target, budget, kv_conc, need, notes)
    _explain_graph(target, mode, capture, release, options, notes)

    config: dict[str, Any] = {
        "tensor_parallel_size": layout.tp,
        "pipeline_parallel_size": layout.pp,
        "data_parallel_size": chosen.replicas,
        "dtype": dtype,
        "block_size": block,
        "max_model_len": max_model_len,
        "max_num_batched_tokens": batched,
        "max_num_seqs": max_num_seqs,
        "gpu_memory_utilization": utilization if target.kind == "npu" else None,
        "kv_cache_memory_bytes": cpu_kv if target.kind == "cpu" else None,
        "quantization": "ascend" if model.quantization and target.kind == "npu" else None,
        "quantization_scheme": model.quantization,
        "enable_expert_parallel": moe_ep,
        "enforce_eager": mode == "eager",
        "compilation_config": (
            {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": list(capture)}
            if mode == "full_decode_only"
            else None
        ),
        "graph_mode": mode,
        "distributed_executor_backend": "ray" if (cluster.strategy == "ray" if cluster else
                                                  layout.chips > target.devices_per_node) else None,
        "data_parallel_size_local": cluster.dp_local if cluster else None,
        "multinode": cluster.strategy if cluster else None,
        "trust_remote_code": "ChatGLMModel" in arch.architectures,
        "served_model_name": model.served_name,
        "vllm_ascend_version": release if target.kind == "npu" else None,
        "replica_mode": (f"one endpoint over {cluster.nodes} nodes" if cluster else
                         "independent instances" if chosen.replicas > 1 else "single instance"),
    }
    if cluster is not None:
        config["data_parallel_size"] = cluster.dp
        config["enable_expert_parallel"] = cluster.expert_parallel
    if model.quantization and target.kind == "npu":
        notes.explain(
            "quantization",
            "ascend",
            f"{model.quantization} weights (from {model.quantization_source or 'the checkpoint'}) "
            "are served through vllm-ascend's ModelSlim loader, --quantization ascend",
        )
    if cluster is not None and cluster.nodes < target.nodes:
        notes.warn(f"the plan uses {cluster.nodes} of the {target.nodes} nodes; launch another group on the rest")
    if not model.weights_present and model.path is not None:
        notes.warn(f"weights are not downloaded in {model.path}; the plan uses the architecture's size")
    if workload.request_rate is not None and prediction.saturated:
        notes.warn(
            f"{workload.request_rate} requests/s exceeds what the plan serves "
            f"(~{prediction.output_tokens_per_s / workload.output_len:.2f} requests/s): the queue would grow"
        )
    return Plan(
        model=model,
        target=target,
        workload=workload,
        config=config,
        env=env,
        memory=budget,
        max_concurrency=max_concurrency(budget.kv_cache_tokens, need, block),
        prediction=prediction,
        explanations=tuple(notes.explanations),
        warnings=tuple(notes.warnings),
        replicas=replicas,
        vllm_args=tuple(_vllm_args(model, target, config)),
        cluster=cluster,
    )


def _dp_ep_budget(target: HardwareTarget, s: _Sizing, tp: int, c: MemoryConstants, expert_fraction: float
                  ) -> MemoryBudget:
    """One device's budget when every device of the cluster is one expert-parallel rank and TP=tp inside a node."""
    arch = s.arch
    ep = target.total_devices
    weights = weights_per_device_ep(s.weight_bytes, arch, tp, ep, s.act_bytes, expert_fraction)
    per_token = kv_bytes_per_token(arch, s.act_bytes, tp, 1)
    device = target.memory_bytes_per_device
    usable = int(device * c.visible_fraction.get(target.family, 1.0) * s.utilization)
    activation = activation_peak_bytes(arch, s.max_num_batched_tokens, s.seq_cap, tp, s.act_bytes, c)
    graph = graph_reserve_bytes(_capture_sizes(s.seq_cap), c) if s.graph else 0
    # Sized for the largest batch the rank may run; the final value follows the chosen max_num_seqs.
    buff = hccl_buffsize_for_ep(arch, ep, s.seq_cap).mb
    runtime = runtime_overhead_bytes(max(2, tp), buff, c, kind=target.kind)  # the all-to-all always communicates
    kv_budget = usable - weights - activation - graph - runtime
    tokens = kv_cache_tokens(kv_budget, arch, s.block_size, s.act_bytes, tp, 1)
    return MemoryBudget(device, usable, weights, activation, graph, runtime, kv_budget, per_token, tokens)


def _plan_cluster(
    model: ModelSpec,
    target: HardwareTarget,
    workload: Workload,
    s: _Sizing,
    chosen: _Evaluated,
    strategy: str,
    options: PlanOptions,
    mode: str,
    need: int,
    required: int,
    c: MemoryConstants,
    notes: _Notes,
) -> tuple[_Evaluated, ClusterPlan]:
    """Spread the plan over the target's nodes: Ray TP x PP when one instance needs more than a node, native data
    parallel (expert parallel for MoE) otherwise; the why names the alternative and why it lost."""
    arch = model.arch
    per_node = target.devices_per_node
    layout = chosen.layout
    npu = target.kind == "npu"
    weights = _gb(s.weight_bytes)
    if arch.is_moe and npu and strategy != "ray":
        # Expert parallel first for MoE: experts stay whole, and no token waits for pipeline stages on other nodes.
        rejected = ["ray (TP x PP across nodes): for MoE, data + expert parallel spreads the experts whole and "
                    "keeps every rank busy, where pipeline stages across nodes add bubbles and inter-node hops"]
        fraction = routed_expert_fraction(count_parameters(arch).total, arch)
        tps = [tp for tp in valid_tp_sizes(arch, per_node) if per_node % tp == 0]
        if options.tp is not None:
            tps = [tp for tp in tps if tp == options.tp]
        fitting = []
        for tp in tps:
            budget = _dp_ep_budget(target, s, tp, c, fraction)
            if budget.kv_cache_tokens >= required:
                fitting.append(_Evaluated(_Layout(tp, 1), budget, target.total_devices // tp))
        if fitting:
            ev = _choose_layout(model, target, workload, s, fitting, mode, s.seq_cap, need, s.block_size)
            tp = ev.layout.tp
            dp = target.total_devices // tp
            why = (
                f"MoE over {target.nodes} nodes: data parallel {dp} x TP {tp} with expert parallel over all "
                f"{target.total_devices} devices: the {arch.num_experts} routed experts ({fraction:.0%} of the "
                f"weights) spread whole, {math.ceil(arch.num_experts / target.total_devices)} per device, and "
                f"attention is split by TP={tp} inside a node, {_gb(ev.budget.weights_bytes)} of weights per "
                "device; vLLM's native --data-parallel-* engine with --headless followers, no Ray"
            )
            notes.explain("multinode", "dp", f"{why}; not {rejected[0]}")
            return ev, ClusterPlan("dp", target.nodes, per_node, tp, 1, dp, per_node // tp, True, None, why,
                                   tuple(rejected))
        if strategy == "dp":
            raise BadInputError(
                f"--multinode dp: {model.served_name} does not fit {target.label} as data + expert parallel "
                "with KV room for one request",
                "use --multinode ray, more --nodes, or a quantization")
    if layout.chips > per_node:
        nodes_used = layout.chips // per_node
        why = (
            f"{weights} of weights need {layout.chips} devices, more than one node's {per_node}: TP={layout.tp} inside "
            f"each node keeps the per-layer all-reduces on the node's own links and PP={layout.pp} stages over "
            f"{nodes_used} nodes pass only activations between nodes; Ray places the workers and the head's vllm serve "
            "drives them"
            if npu else
            f"one engine process per CPU host: {layout.pp} pipeline stages over {nodes_used} hosts, placed by Ray"
        )
        rejected = []
        if arch.is_moe and npu:
            rejected.append("dp (data + expert parallel): asked for ray" if strategy == "ray" else
                            "dp (data + expert parallel): no TP inside a node leaves KV room with experts spread "
                            f"over {target.total_devices} devices")
        elif strategy != "ray":
            rejected.append("dp (data parallel): every rank would need the whole model, which does not fit a node")
        else:
            rejected.append("dp: asked for ray")
        cluster = ClusterPlan("ray", nodes_used, per_node, layout.tp, layout.pp, 1, 1, arch.is_moe and npu, None,
                              why, tuple(rejected))
        notes.explain("multinode", "ray", f"{why}; not {rejected[0]}")
        return replace(chosen, replicas=1), cluster

    rejected = ["ray (TP x PP across nodes): asked for dp" if strategy == "dp" else
                f"ray (TP x PP across nodes): the model fits {layout.chips} device(s), so pipeline stages across "
                "nodes would only add bubbles and inter-node hops"]
    ranks_per_node = max(1, per_node // layout.chips)
    dp = ranks_per_node * target.nodes
    why = (
        f"{weights} of weights fit {layout.chips} device(s): {dp} independent engine ranks ({ranks_per_node} per "
        f"node, TP={layout.tp}) behind one endpoint with vLLM's native data parallel; the leader's API server "
        "spreads requests and the other nodes run --headless"
        if npu else
        f"one engine per CPU host: {dp} data-parallel ranks behind the leader's endpoint"
    )
    notes.explain("multinode", "dp", f"{why}; not {rejected[0]}")
    return (replace(chosen, replicas=dp),
            ClusterPlan("dp", target.nodes, per_node, layout.tp, layout.pp, dp, ranks_per_node, False, None, why,
                        tuple(rejected)))


def _choose_layout(
    model: ModelSpec,
    target: HardwareTarget,
    workload: Workload,
    s: _Sizing,
    evaluated: list[_Evaluated],
    mode: str,
    seq_cap: int,
    need: int,
    block: int,
) -> _Evaluated:
    """Throughput: the fewest chips per instance whose KV holds its share of the workload (replicas use the rest).
    Latency: the single instance with the lowest predicted TPOT at the workload's concurrency."""
    if workload.objective == "latency":

        def tpot(ev: _Evaluated) -> tuple[float, int]:
            perf = predict(_perf_inputs(model, target, workload, s, ev, mode, seq_cap))
            return (round(perf.tpot_ms, 2), ev.layout.chips)

        within_node = [ev for ev in evaluated if ev.layout.chips <= target.devices_per_node] or evaluated
        return min(within_node, key=tpot)
    for ev in evaluated:
        share = math.ceil(workload.concurrency / ev.replicas)
        if ev.budget.kv_cache_tokens >= min(share, seq_cap) * _round_up(need, block):
            return ev
    # Nothing holds the whole share: take the layout that serves the most requests at once.
    return max(
        evaluated,
        key=lambda ev: (ev.replicas * max_concurrency(ev.budget.kv_cache_tokens, need, block), -ev.layout.chips),
    )


def _environment(
    target: HardwareTarget, release: str, layout: _Layout, moe_ep: bool, replicas: int, notes: _Notes,
    *, collective: bool,
) -> list[EnvSetting]:
    if target.kind == "cpu":
        notes.explain(
            "env.OMP_NUM_THREADS",
            None,
            "not set: on the CPU engine OpenMP threads do the model's math and vLLM binds them itself "
            "(VLLM_CPU_OMP_THREADS_BIND)",
            "the seed sets OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1, right for an NPU host, "
            "crippling on the CPU engine",
        )
        return []
    settings = environment_for(release, collective=collective, moe_ep=moe_ep, devices=None)
    for setting in settings:
        notes.explain(f"env.{setting.name}", setting.value, setting.why, setting.seed)
    mask_why = (
        "each replica gets its own ASCEND_RT_VISIBLE_DEVICES (see replicas)"
        if replicas > 1
        else "the device mask (CUDA_VISIBLE_DEVICES' analogue): the instance sees only its own NPUs"
    )
    notes.explain("env.ASCEND_RT_VISIBLE_DEVICES", None if replicas > 1 else "per plan", mask_why)
    return settings


def _explain_parallelism(
    model: ModelSpec, target: HardwareTarget, workload: Workload, s: _Sizing, ev: _Evaluated, notes: _Notes
) -> None:
    layout = ev.layout
    arch = model.arch
    if target.kind == "cpu":
        notes.explain(
            "tensor_parallel_size",
            1,
            "one CPU engine process on one NUMA node",
            "the seed's TP=8 is for an 8-NPU server; the CPU engine plan uses one process",
        )
        notes.explain("pipeline_parallel_size", 1, "the model fits one process")
        notes.explain("data_parallel_size", 1, "one engine")
        return
    weights = s.weight_bytes
    chip_name = target.chip.name if target.chip else "device"
    constraint = f"TP divides the {arch.num_attention_heads} heads and suits the {arch.num_kv_heads} KV heads"
    if workload.objective == "latency":
        why = (
            f"of the splits that fit ({constraint}), the one with the lowest predicted TPOT at "
            f"{workload.concurrency} concurrent requests: {_gb(ev.budget.weights_bytes)} of weights per device"
        )
    elif layout.tp == 1 and layout.pp == 1:
        why = (
            f"{_gb(weights)} of weights fit one {_device_memory(target)} {chip_name} with "
            f"{_gb(ev.budget.kv_budget_bytes)} left for KV: no collectives on the decode path"
        )
    else:
        why = (
            f"the smallest split whose {_gb(ev.budget.weights_bytes)} of weights per device plus a KV budget fit "
            f"({constraint})"
        )
    fits_one = weights < target.memory_bytes_per_device * 0.8
    if layout.tp == SEED["tensor_parallel_size"]:
        seed = "the seed's tensor_parallel_size=8 agrees here"
        if fits_one:
            seed = (
                f"the seed's tensor_parallel_size=8 agrees for the latency objective only: {_gb(weights)} of "
                f"weights fit one {_device_memory(target)} chip, so for throughput {target.devices_per_node} "
                "independent TP=1 replicas serve more requests than one TP=8 instance"
            )
    else:
        seed = (
            f"the seed uses tensor_parallel_size=8: for {_gb(weights)} of weights on {target.devices_per_node} x "
            f"{_device_memory(target)} chips that leaves each chip {_gb(weights / 8)} of weights and mostly idle "
            "memory, and pays two all-reduces per layer on every token; "
            + (
                f"{ev.replicas} independent TP={layout.tp} replicas serve more requests"
                if ev.replicas > 1
                else f"TP={layout.tp} is the better trade here"
            )
        )
    notes.explain("tensor_parallel_size", layout.tp, why, seed)
    notes.explain(
        "pipeline_parallel_size",
        layout.pp,
        "one stage: TP within a node holds the model"
        if layout.pp == 1
        else f"{layout.pp} stages: TP alone within a node cannot hold the weights"
        + (" (stages span nodes over Ray)" if layout.chips > target.devices_per_node else ""),
    )
    if ev.replicas > 1:
        notes.explain(
            "data_parallel_size",
            ev.replicas,
            f"the model needs {layout.chips} of {target.total_devices} chips, so {ev.replicas} independent instances "
            "(one vllm serve each, own device mask and port) multiply throughput without collectives between them",
        )
    else:
        notes.explain(
            "data_parallel_size",
            1,
            "one instance"
            + (
                ": the latency objective gives it the fastest split; spare chips can run other models"
                if workload.objective == "latency" and layout.chips < target.total_devices
                else ""
            ),
        )
    if arch.is_moe and layout.chips > 1:
        notes.explain(
            "enable_expert_parallel",
            True,
            f"{arch.num_experts} experts spread whole over the {layout.chips} devices instead of slicing each "
            f"expert; HCCL_BUFFSIZE={MOE_EP_HCCL_BUFFSIZE_MB} for the all-to-all",
        )


def _explain_cluster_parallelism(model: ModelSpec, cluster: ClusterPlan, budget: MemoryBudget, notes: _Notes) -> None:
    """A cluster's parallel sizes explained as one instance over its nodes (replacing the single-node wording)."""
    arch = model.arch
    per_device = _gb(budget.weights_bytes)
    if cluster.strategy == "ray":
        notes.explain("tensor_parallel_size", cluster.tp,
                      f"TP inside each node over its {cluster.devices_per_node} devices: the all-reduces twice per "
                      f"layer stay on the node's own links; {per_device} of weights per device")
        notes.explain("pipeline_parallel_size", cluster.pp,
                      f"{cluster.pp} stages over {cluster.nodes} nodes (Ray): only activations cross between nodes")
        notes.explain("data_parallel_size", 1, "one instance over the cluster")
    else:
        notes.explain("tensor_parallel_size", cluster.tp,
                      f"TP {cluster.tp} inside each data-parallel rank"
                      + (" (attention and the dense layers; the experts are spread by expert parallel)"
                         if cluster.expert_parallel else "")
                      + f": {per_device} of weights per device")
        if cluster.pp == 1:
            notes.explain("pipeline_parallel_size", 1,
                          "one stage: each data-parallel rank runs every layer"
                          + (", with its share of the experts" if cluster.expert_parallel else ""))
        notes.explain("data_parallel_size", cluster.dp,
                      f"{cluster.dp} data-parallel ranks, {cluster.dp_local} per node, behind the leader's one "
                      "endpoint (vLLM's --data-parallel-*; followers --headless)"
                      + (": the ranks run the expert layers together (all-to-all every MoE layer)"
                         if cluster.expert_parallel else ": independent engines, no collectives between them"))
    if cluster.expert_parallel:
        buffer = cluster.hccl_buffsize_mb or MOE_EP_HCCL_BUFFSIZE_MB
        notes.explain("enable_expert_parallel", True,
                      f"the {arch.num_experts} routed experts spread whole over the {cluster.ep_size} devices of the "
                      f"expert-parallel group instead of slicing each expert; HCCL_BUFFSIZE={buffer} for the "
                      "all-to-all")


def _explain_lengths(
    arch: ModelArch,
    target: HardwareTarget,
    workload: Workload,
    max_model_len: int,
    batched: int,
    options: PlanOptions,
    need: int,
    notes: _Notes,
) -> None:
    if options.max_model_len is not None:
        why = "as asked"
    elif target.family == "310P":
        why = (
            f"explicit and modest on 310P: its attention mask is max_model_len^2 float16; {need} tokens per request "
            "rounded up"
        )
    else:
        why = (
            f"headroom above the workload's {need} tokens, within the model's {arch.max_position_embeddings} "
            "positions; paged KV makes a longer limit cost nothing until used"
        )
    seed = None
    if max_model_len != SEED["max_model_len"]:
        seed = f"the seed uses max_model_len=2048; {max_model_len} " + (
            "fits this workload and model" if max_model_len >= need else "is what fits"
        )
    notes.explain("max_model_len", max_model_len, why, seed)
    if options.max_num_batched_tokens is not None:
        bwhy = "as asked"
    elif workload.objective == "throughput":
        bwhy = (
            "a large prefill chunk: prompts are processed in fewer, more efficient steps (higher throughput, "
            "slightly longer decode steps while a chunk runs)"
        )
    else:
        bwhy = (
            "a prefill chunk that takes the workload's prompt in one step (low TTFT) without stalling running "
            "decodes for long"
        )
    notes.explain(
        "max_num_batched_tokens",
        batched,
        bwhy,
        None
        if batched == SEED["max_num_batched_tokens"]
        else f"the seed uses 4096; {batched} suits the {workload.objective} objective here",
    )


def _explain_memory(target: HardwareTarget, budget: MemoryBudget, kv_conc: int, need: int, notes: _Notes) -> None:
    if target.kind == "cpu":
        notes.explain(
            "kv_cache_memory_bytes",
            budget.kv_budget_bytes,
            "the CPU engine's KV budget is exactly this (--kv-cache-memory-bytes); the plan's token count is computed "
            "the way vLLM does and matches its 'KV cache size' log line",
        )
    notes.explain(
        "memory.kv_cache_tokens",
        budget.kv_cache_tokens,
        f"{_gb(budget.kv_budget_bytes)} of KV budget / {budget.kv_bytes_per_token} bytes per token, in whole blocks: "
        f"{kv_conc} concurrent {need}-token requests",
    )


def _explain_graph(
    target: HardwareTarget, mode: str, capture: tuple[int, ...], release: str, options: PlanOptions, notes: _Notes
) -> None:
    if mode == "cpu_compiled":
        notes.explain(
            "enforce_eager",
            False,
            "pipeline stages on the CPU engine need its compile warm-up: in eager mode the first request fails "
            "(the tensors passed between stages are only created by the warm-up run)",
        )
    elif mode == "full_decode_only":
        notes.explain(
            "compilation_config",
            {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": list(capture)},
            f"whole decode steps replay as ACL graphs, removing most per-layer launch cost; {len(capture)} capture "
            f"sizes up to min(max_num_seqs, {MAX_CAPTURE_SIZE}) stay clear of the 207008/207005 capture errors",
        )
    elif mode == "piecewise":
        notes.explain(
            "compilation_config",
            None,
            f"vllm-ascend {release} predates FULL_DECODE_ONLY; its default piecewise ACL graphs are kept",
        )
    else:
        if options.enforce_eager:
            why = "as asked"
        elif target.kind == "cpu":
            why = "the CPU engine runs eager"
        elif target.family == "310P":
            why = "310P support in vllm-ascend runs eager; graph capture is an A2/A3 feature"
        else:
            why = f"vllm-ascend {release} has no ACL graph mode"
        notes.explain("enforce_eager", True, why)


def _vllm_args(model: ModelSpec, target: HardwareTarget, config: dict[str, Any]) -> list[str]:
    """The `vllm serve MODEL ...` flags the config implies, in a stable order; one replica's view."""
    args = ["--served-model-name", str(config["served_model_name"])]
    args += ["--tensor-parallel-size", str(config["tensor_parallel_size"])]
    if config["pipeline_parallel_size"] > 1:
        args += ["--pipeline-parallel-size", str(config["pipeline_parallel_size"])]
    args += ["--dtype", str(config["dtype"]), "--block-size", str(config["block_size"])]
    args += ["--max-model-len", str(config["max_model_len"])]
    args += ["--max-num-batched-tokens", str(config["max_num_batched_tokens"])]
    args += ["--max-num-seqs", str(config["max_num_seqs"])]
    if target.kind == "cpu":
        args += ["--kv-cache-memory-bytes", str(config["kv_cache_memory_bytes"])]
    else:
        args += ["--gpu-memory-utilization", str(config["gpu_memory_utilization"])]
    if config["quantization"]:
        args += ["--quantization", str(config["quantization"])]
    if config["enable_expert_parallel"]:
        args.append("--enable-expert-parallel")
    if config["compilation_config"] is not None:
        args += ["--compilation-config", json.dumps(config["compilation_config"], separators=(",", ":"))]
    elif config["enforce_eager"]:
        args.append("--enforce-eager")
    if config["distributed_executor_backend"]:
        args += ["--distributed-executor-backend", str(config["distributed_executor_backend"])]
    if config["trust_remote_code"]:
        args.append("--trust-remote-code")
    return args


__all__ = [
    "OBJECTIVES",
    "QUANTIZATION_FLAGS",
    "Explanation",
    "Plan",
    "PlanDoesNotFit",
    "PlanOptions",
    "Replica",
    "Workload",
    "make_plan",
    "tp_is_valid",
    "valid_tp_sizes",
]
