"""The rules of each serving target: vLLM's CPU engine, and each Ascend chip family (A2, A3, 310P).

One rules object per target answers every question where targets differ: the dtype, the KV block size, how memory
is spent and which option sizes it, graph mode, the parallel layouts on offer and how replicas are placed, the
environment, and what would fit when nothing does. The numbers are data (npuops/data/target_rules.toml); the
planner (npuops/plan/planner.py) asks, and never branches on the kind of target itself. Pure.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from npuops.datafiles import load_data_toml
from npuops.errors import BadInputError
from npuops.plan.constants import MemoryConstants
from npuops.plan.environment import (
    HCCL_DEFAULT_BUFFSIZE_MB,
    MOE_EP_HCCL_BUFFSIZE_MB,
    EnvSetting,
    default_release,
    environment_for,
    feature_available,
    parse_release,
)
from npuops.plan.layout import Layout, Sizing, capture_sizes, layout_group, valid_tp_sizes
from npuops.plan.memory import (
    MemoryBudget,
    activation_peak_bytes,
    graph_reserve_bytes,
    kv_bytes_per_token,
    kv_cache_tokens,
    runtime_overhead_bytes,
    weights_per_device,
)
from npuops.plan.model import ModelArch, ModelSpec, weight_bytes_from_arch
from npuops.plan.quantization import COMPRESSED_TENSORS, check_kv_cache_runs, check_runs
from npuops.plan.target import HardwareTarget
from npuops.textout import human_bytes

ASCEND_BLOCK_SIZE = 128
CPU_BLOCK_MULTIPLE = 32


@dataclass(frozen=True)
class FamilyRules:
    """A target family's numbers (npuops/data/target_rules.toml, each key explained there)."""
    utilization: float
    dtype: str
    graph: bool
    throughput_batched_tokens: int
    latency_batched_tokens: int
    max_num_seqs: int
    modest_max_model_len: bool = False
    utilization_why: str = ""
    eager_why: str = ""
    graph_since: str = ""
    tp_capture_sizes: int = 0


@lru_cache(maxsize=1)
def _family_table() -> dict[str, FamilyRules]:
    data = load_data_toml("target_rules.toml")
    table = {name: FamilyRules(**raw) for name, raw in data["family"].items()}
    table["cpu"] = FamilyRules(**data["cpu"])
    return table


@dataclass(frozen=True)
class Replica:
    """One independent vllm serve of a plan: its node and its devices (ASCEND_RT_VISIBLE_DEVICES), or on the CPU
    engine the cores its OpenMP threads are bound to (VLLM_CPU_OMP_THREADS_BIND; "" leaves vLLM's own binding)."""

    index: int
    node: int
    devices: tuple[int, ...]
    cpus: str = ""

    @property
    def visible_devices(self) -> str:
        return ",".join(str(d) for d in self.devices)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "node": self.node, "devices": list(self.devices),
                               "visible_devices": self.visible_devices}
        if self.cpus:
            out["cpus"] = self.cpus
        return out


class TargetRules(abc.ABC):
    """What a target decides for itself. `family` holds its numbers."""

    # The CPU engine runs one process per host; an Ascend node runs one per replica over its devices.
    engine_per_host = False
    # Whether the engine needs CANN's environment (the set_env.sh scripts' effect) in its unit.
    needs_cann = False

    def __init__(self, target: HardwareTarget, family: FamilyRules) -> None:
        self.target = target
        self.family = family

    # --- values the planner asks for ----------------------------------------------------------------------------
    @abc.abstractmethod
    def dtype(self, model: ModelSpec, asked: str | None, warnings: list[str]) -> str:
        """The serving dtype; a substitution for what was asked goes to `warnings`."""

    @abc.abstractmethod
    def block_size(self, asked: int | None, warnings: list[str]) -> int: ...

    @abc.abstractmethod
    def graph_mode(self, release: str | None, eager: bool) -> str:
        """"eager", "piecewise" or "full_decode_only"."""

    @abc.abstractmethod
    def release(self, asked: str | None) -> str | None:
        """The vllm-ascend release the plan is for (None where there is none)."""

    def utilization(self, asked: float | None) -> float:
        return asked or self.family.utilization

    def utilization_why(self, asked: float | None) -> str | None:
        """Why the memory fraction is what it is, where the engine is told one (None: it is not)."""
        return None

    def max_model_len(self, need: int, positions: int) -> int:
        """The planned --max-model-len before the KV cache has a say: headroom above the workload's requests."""
        if self.family.modest_max_model_len:
            return min(positions, max(1024, -(-need // 512) * 512))
        return min(positions, max(4096, _pow2_at_least(2 * need)))

    def batched_tokens(self, input_len: int, objective: str, block: int) -> int:
        prompt = -(-input_len // block) * block
        if objective == "throughput":
            return max(self.family.throughput_batched_tokens, min(prompt, 16384))
        return min(16384, max(self.family.latency_batched_tokens, prompt))

    @abc.abstractmethod
    def kv_cache_bytes(self, weight_bytes: int, asked: int | None, c: MemoryConstants) -> int | None:
        """The KV cache size the engine is told (the CPU engine's --kv-cache-memory-bytes), or None."""

    @abc.abstractmethod
    def expert_parallel(self, arch: ModelArch) -> bool:
        """Whether an MoE model spreads its experts (expert parallel) on this target."""

    @abc.abstractmethod
    def parallel_candidates(self, arch: ModelArch, tp: int | None, pp: int | None) -> list[Layout]:
        """The TP x PP layouts to try, simplest first."""

    @abc.abstractmethod
    def budget(self, s: Sizing, layout: Layout, c: MemoryConstants) -> MemoryBudget: ...

    @abc.abstractmethod
    def replica_count(self, layout: Layout, objective: str) -> int: ...

    @abc.abstractmethod
    def replicas(self, layout: Layout, count: int, *, cluster: bool) -> tuple[Replica, ...]: ...

    @abc.abstractmethod
    def environment(self, release: str | None, *, collective: bool, moe_ep: bool,
                    devices: tuple[int, ...] | None) -> list[EnvSetting]:
        """The variables a replica gets; `devices`: the one replica's device mask, when there is one replica."""

    @abc.abstractmethod
    def memory_options(self, utilization: float, kv_bytes: int | None) -> dict[str, Any]:
        """The ServerOptions fields that size the engine's memory."""

    @abc.abstractmethod
    def quantization_option(self, model: ModelSpec) -> str | None:
        """vLLM's --quantization for the model's checkpoint."""

    @abc.abstractmethod
    def check_quantization(self, model: ModelSpec, release: str | None) -> None:
        """Refuse a quantization scheme (or int8 KV cache) this target and release cannot run."""

    @abc.abstractmethod
    def fit_alternatives(self, model: ModelSpec, s: Sizing, candidates: list[Layout], required: int,
                         c: MemoryConstants) -> list[str]:
        """What would fit when no layout does."""

    def pipeline_mode(self, mode: str, layout: Layout, eager_asked: bool, warnings: list[str]) -> str:
        """The graph mode once the layout is known (the CPU engine's pipeline stages need their warm-up)."""
        return mode

    def capture_sizes(self, mode: str, max_num_seqs: int, tp: int = 1) -> tuple[int, ...]:
        sizes = capture_sizes(max_num_seqs) if mode not in ("eager", "cpu_compiled") else ()
        # A family whose TP groups hold only a few graphs (310P's event ids) keeps the largest sizes.
        limit = self.family.tp_capture_sizes
        return sizes[-limit:] if limit and tp > 1 else sizes

    # --- texts the explanations need -----------------------------------------------------------------------------
    @abc.abstractmethod
    def dtype_why(self, dtype: str, asked: str | None, model: ModelSpec) -> tuple[str, str | None]:
        """(why, how it departs from the tested advice's float16 (docs/claims.md, claim 7) or None)."""

    @abc.abstractmethod
    def block_why(self, block: int, asked: int | None) -> tuple[str, str | None]: ...

    @abc.abstractmethod
    def eager_why(self, release: str | None) -> str: ...


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# The share of a CPU host's RAM the default KV budget leaves to the OS and the page cache: one tenth.
CPU_HOST_RESERVE_DIVISOR = 10


class CpuEngineRules(TargetRules):
    """vLLM's CPU engine: one process per host, float32 or bfloat16, a KV cache of a given size, eager."""

    engine_per_host = True

    def dtype(self, model: ModelSpec, asked: str | None, warnings: list[str]) -> str:
        own = self._own_dtype(model)
        if asked == "float16":
            # oneDNN has no float16 matmul on most CPUs: vLLM falls back to plain torch kernels.
            warnings.append(f"float16 on the CPU engine is slow or unsupported; planned {own} instead")
            return own
        return asked or own

    def _own_dtype(self, model: ModelSpec) -> str:
        features = self.target.cpu_features
        if features is None:
            # No flags to go by (a node model from an older npuops): the checkpoint's own width.
            return "float32" if model.arch.torch_dtype == "float32" else "bfloat16"
        return "bfloat16" if features.native_bf16 else "float32"

    def dtype_why(self, dtype: str, asked: str | None, model: ModelSpec) -> tuple[str, str | None]:
        seed = None if dtype == "float16" else "the tested advice's float16 is not a CPU-engine dtype"
        features = self.target.cpu_features
        if asked == dtype:
            return f"{dtype} as asked (the vLLM CPU engine computes in float32 or bfloat16)", seed
        if asked:
            # float16 asked: the engine's own choice instead (the warning says so).
            why, _ = self.dtype_why(dtype, None, model)
            return f"float16 asked, which the CPU engine runs slowly or not at all; {why}", seed
        if features is None:
            return (f"{dtype} follows the checkpoint's {model.arch.torch_dtype}: the node model names no CPU flags "
                    "to choose by"), seed
        if dtype == "bfloat16":
            why = (f"this CPU computes bfloat16 natively ({features.native_bf16}): twice float32's rate per vector "
                   "and half the bytes per weight read; vLLM's own default computes in it too")
            if model.arch.torch_dtype == "float32":
                why += " (the float32 checkpoint is cast once at load; --dtype float32 keeps it)"
            return why, seed
        return ("float32: this CPU has no native bfloat16 (neither avx512_bf16 nor amx_bf16 nor ARM's bf16), so "
                "bfloat16 would be converted around every operation and run slower than float32"), seed

    def block_size(self, asked: int | None, warnings: list[str]) -> int:
        block = asked or 128
        if block < CPU_BLOCK_MULTIPLE or block % CPU_BLOCK_MULTIPLE:
            raise BadInputError(f"--block-size {block} on the CPU engine",
                                "use a multiple of 32 (the CPU attention backend needs it)")
        return block

    def block_why(self, block: int, asked: int | None) -> tuple[str, str | None]:
        why = ("the CPU attention backend pages the KV cache in blocks that are a multiple of 32"
               + ("" if asked else "; 128 is vLLM's CPU default"))
        return why, None if block == 32 else (
            "the tested advice's 32 also works on CPU; 128 means fewer block-table entries")

    def graph_mode(self, release: str | None, eager: bool) -> str:
        # vLLM's CPU engine compiles the model with torch.compile (inductor) unless told --enforce-eager: fused
        # kernels and less Python per step, for start-up time (kept in VLLM_CACHE_ROOT for the next start).
        return "eager" if eager else "cpu_compiled"

    def eager_why(self, release: str | None) -> str:
        return self.family.eager_why

    def release(self, asked: str | None) -> str | None:
        if asked is not None:
            parse_release(asked)
        return None

    def max_model_len(self, need: int, positions: int) -> int:
        return min(positions, max(512, _pow2_at_least(need)))

    def kv_cache_bytes(self, weight_bytes: int, asked: int | None, c: MemoryConstants) -> int | None:
        """What the operator asked, else up to cpu_default_kv_bytes of what the NUMA node's RAM leaves beside the
        weights and the engine process, less a tenth for the OS and the page cache the weights load through:
        whenever the weights fit, so does a KV cache (a model that leaves no room is refused by the budget)."""
        if asked is not None:
            return asked
        device = self.target.memory_bytes_per_device
        room = device - device // CPU_HOST_RESERVE_DIVISOR - weight_bytes - c.cpu_process_bytes
        return max(0, min(c.cpu_default_kv_bytes, room)) // 2**20 * 2**20

    def expert_parallel(self, arch: ModelArch) -> bool:
        return False

    def parallel_candidates(self, arch: ModelArch, tp: int | None, pp: int | None) -> list[Layout]:
        nodes = self.target.nodes
        if (tp or 1) != 1:
            raise BadInputError("the CPU engine runs without tensor parallel", "drop --tp with --hardware cpu")
        if nodes == 1:
            if (pp or 1) != 1:
                raise BadInputError("the CPU plan runs one engine process", "drop --pp with --hardware cpu")
            return [Layout(1, 1)]
        # CPU hosts: one engine process per host, as pipeline stages (ray) or data-parallel ranks.
        stages = pp or nodes
        if stages > nodes or stages > arch.num_layers:
            raise BadInputError(f"--pp {stages} with {nodes} CPU hosts", f"use at most {min(nodes, arch.num_layers)}")
        return [Layout(1, 1), Layout(1, stages)] if stages > 1 else [Layout(1, 1)]

    def budget(self, s: Sizing, layout: Layout, c: MemoryConstants) -> MemoryBudget:
        arch = s.arch
        weights = weights_per_device(s.weight_bytes, arch, layout.tp, layout.pp, s.act_bytes)
        per_token = kv_bytes_per_token(arch, s.kv_dtype_bytes, layout.tp, layout.pp)
        device = self.target.memory_bytes_per_device
        kv_budget = s.cpu_kv_bytes or 0
        if weights + kv_budget + c.cpu_process_bytes > device:
            kv_budget = -1  # does not fit the NUMA node's RAM
        tokens = kv_cache_tokens(kv_budget, arch, s.block_size, s.kv_dtype_bytes, 1, 1)
        # What the engine uses of the node's RAM: its parts, so the memory line adds up.
        usable = weights + c.cpu_process_bytes + max(kv_budget, 0)
        return MemoryBudget(device, usable, weights, 0, 0, c.cpu_process_bytes, kv_budget, per_token, tokens)

    def replica_count(self, layout: Layout, objective: str) -> int:
        return 1

    def replicas(self, layout: Layout, count: int, *, cluster: bool) -> tuple[Replica, ...]:
        if count == 1 or cluster:
            # A cluster's data-parallel ranks are one engine per host: one replica, the cluster's.
            return (Replica(0, 0, ()),)
        # Several engines on one host (--dp N): each gets its own share of the cores, as each NPU replica gets its
        # own chips; without a share for each (fewer cores than engines) vLLM binds them all itself.
        cores = self.target.cpu_count or 0
        share = cores // count
        if share < 1:
            return tuple(Replica(i, 0, ()) for i in range(count))
        return tuple(Replica(i, 0, (), f"{i * share}-{(i + 1) * share - 1}") for i in range(count))

    def environment(self, release: str | None, *, collective: bool, moe_ep: bool,
                    devices: tuple[int, ...] | None) -> list[EnvSetting]:
        # OpenMP threads do the model's math on the CPU engine and vLLM binds them itself: nothing to set.
        return []

    def memory_options(self, utilization: float, kv_bytes: int | None) -> dict[str, Any]:
        return {"kv_cache_memory_bytes": kv_bytes}

    def quantization_option(self, model: ModelSpec) -> str | None:
        return None

    def check_quantization(self, model: ModelSpec, release: str | None) -> None:
        # The CPU engine plans a checkpoint by its bytes; vLLM's CPU loader says itself which methods it has.
        return None

    def pipeline_mode(self, mode: str, layout: Layout, eager_asked: bool, warnings: list[str]) -> str:
        if layout.pp == 1:
            return mode
        # vLLM's CPU engine creates the tensors a later pipeline stage receives only in its warm-up run, which
        # --enforce-eager skips: the first request then fails (AssertionError: intermediate_tensors is not None).
        if eager_asked:
            warnings.append("--enforce-eager with pipeline stages on the CPU engine: /health answers, but the "
                            "first request fails (the CPU model runner skips the warm-up that creates the stage "
                            "tensors)")
            return mode
        return "cpu_compiled"

    def fit_alternatives(self, model: ModelSpec, s: Sizing, candidates: list[Layout], required: int,
                         c: MemoryConstants) -> list[str]:
        """The KV budget that fits when the weights do (a fix that works when followed), else the RAM per NUMA
        node the weights, the engine process and one request's KV need."""
        budget = self.budget(s, Layout(1, 1), c)
        block = s.block_size * budget.kv_bytes_per_token
        least = -(-required * budget.kv_bytes_per_token // block) * block
        room = budget.device_bytes - budget.weights_bytes - c.cpu_process_bytes
        if room >= least:
            largest = room // 2**20 * 2**20
            return [f"--kv-cache-memory-bytes {largest} or less ({human_bytes(largest)}: what the node's "
                    f"{human_bytes(budget.device_bytes)} leave beside {human_bytes(budget.weights_bytes)} of weights "
                    f"and the engine process; one request needs {human_bytes(least)})"]
        needed = budget.weights_bytes + c.cpu_process_bytes + least
        return [f"a machine with at least {human_bytes(needed)} of RAM per NUMA node, or a smaller or quantized "
                "model"]


class AscendRules(TargetRules):
    """An Ascend chip family under vllm-ascend: its dtype, block 128, HBM by utilization, ACL graphs by release."""

    needs_cann = True

    @property
    def chip_name(self) -> str:
        return self.target.chip.name if self.target.chip else "device"

    def dtype(self, model: ModelSpec, asked: str | None, warnings: list[str]) -> str:
        chip = self.target.chip
        assert chip is not None
        if not chip.bf16:
            if asked == "bfloat16":
                # Operator-friendly: plan what works and say so, rather than refuse.
                warnings.append(f"{chip.name} has no bfloat16 kernels (EZ1001 ... DT_BFLOAT16 at start-up); "
                                "planned float16 instead")
            return "float32" if asked == "float32" else "float16"
        dtype = asked or "bfloat16"
        if dtype == "float32":
            warnings.append("float32 doubles weight and KV memory on the NPU and halves matmul throughput")
        return dtype

    def dtype_why(self, dtype: str, asked: str | None, model: ModelSpec) -> tuple[str, str | None]:
        chip = self.target.chip
        assert chip is not None
        if not chip.bf16:
            return f"{chip.name} ({chip.family}) runs float16 only: its bfloat16 kernels do not exist", None
        if asked:
            why = f"{dtype} as asked; {chip.family} supports bfloat16 and float16"
        else:
            why = (f"bfloat16 is the dtype vllm-ascend's {chip.family} kernels are built and tested for; "
                   "same 2 bytes as float16")
            if model.arch.torch_dtype == "float16":
                why += " (the checkpoint is float16; vLLM casts it once at load)"
        seed = None if dtype == "float16" else (
            "the tested advice uses float16, which works on A2/A3 but gains nothing over bfloat16 there and "
            "risks overflow")
        return why, seed

    def block_size(self, asked: int | None, warnings: list[str]) -> int:
        if asked is not None and asked != ASCEND_BLOCK_SIZE:
            warnings.append(f"--block-size {asked} is overridden: vllm-ascend forces 128 when prefix caching or "
                            "chunked prefill is on (the default)")
        return ASCEND_BLOCK_SIZE

    def block_why(self, block: int, asked: int | None) -> tuple[str, str | None]:
        why = "vllm-ascend forces block size 128 with prefix caching or chunked prefill (both on by default)"
        if asked is not None and asked != ASCEND_BLOCK_SIZE:
            why += f"; the {asked} asked for would be replaced at start-up anyway"
        return why, "the tested advice's block_size=32 is overridden to 128 by vllm-ascend on current stacks"

    def utilization_why(self, asked: float | None) -> str | None:
        if asked:
            return "as asked"
        return self.family.utilization_why or (
            "vLLM's default 0.9; start-up fails if free HBM is below total x utilization")

    def graph_mode(self, release: str | None, eager: bool) -> str:
        since = self.family.graph_since
        if (eager or not self.family.graph or release is None
                or (since and parse_release(release) < parse_release(since))):
            return "eager"
        if feature_available("full_decode_only", release):
            return "full_decode_only"
        if feature_available("piecewise_graph", release):
            return "piecewise"
        return "eager"

    def eager_why(self, release: str | None) -> str:
        return self.family.eager_why or f"vllm-ascend {release} has no ACL graph mode"

    def release(self, asked: str | None) -> str | None:
        release = asked or default_release()
        parse_release(release)
        return release

    def kv_cache_bytes(self, weight_bytes: int, asked: int | None, c: MemoryConstants) -> int | None:
        if asked is not None:
            raise BadInputError("--kv-cache-memory-bytes applies to the CPU target",
                                "use --gpu-memory-utilization on NPUs")
        return None

    def expert_parallel(self, arch: ModelArch) -> bool:
        return arch.is_moe

    def parallel_candidates(self, arch: ModelArch, tp: int | None, pp: int | None) -> list[Layout]:
        target = self.target
        per_node = target.devices_per_node
        tps = valid_tp_sizes(arch, per_node)
        if tp is not None:
            if tp not in tps:
                raise BadInputError(
                    f"--tp {tp} does not work for this model on {per_node} devices per node "
                    f"({arch.num_attention_heads} heads, {arch.num_kv_heads} KV heads)",
                    f"use one of {', '.join(str(t) for t in tps)}")
            tps = [tp]
        layouts = []
        for stages in [pp] if pp is not None else range(1, min(arch.num_layers, target.total_devices) + 1):
            if stages < 1 or stages > arch.num_layers:
                raise BadInputError(f"--pp {stages}", f"use 1 to {arch.num_layers} (the model's layer count)")
            for size in tps:
                chips = size * stages
                # Spanning nodes: whole nodes, and no TP group straddling a node boundary.
                if chips > target.total_devices or (chips > per_node and (chips % per_node or per_node % size)):
                    continue
                layouts.append(Layout(size, stages))
        # Tensor parallel within a node first (no pipeline bubbles, lowest per-token latency), then pipeline stages
        # within a node (for head counts TP alone cannot split far enough), then instances spanning nodes.
        group = layout_group(target)
        return sorted(layouts, key=lambda lay: (group(lay), lay.chips, -lay.tp))

    def budget(self, s: Sizing, layout: Layout, c: MemoryConstants) -> MemoryBudget:
        arch = s.arch
        weights = weights_per_device(s.weight_bytes, arch, layout.tp, layout.pp, s.act_bytes)
        # A draft runs with the target's TP (MTP layers sit on the last stage, beside its share of the model).
        weights += s.draft_weight_bytes // layout.tp
        buff = MOE_EP_HCCL_BUFFSIZE_MB if s.moe_ep else HCCL_DEFAULT_BUFFSIZE_MB
        return self.device_budget(s, layout.tp, layout.pp, weights, layout.tp * layout.pp, buff, c)

    def device_budget(self, s: Sizing, tp: int, pp: int, weights: int, collective_size: int, buffsize_mb: int,
                      c: MemoryConstants) -> MemoryBudget:
        """One device's budget with these weights on it; `collective_size` > 1 reserves HCCL's buffers."""
        arch = s.arch
        device = self.target.memory_bytes_per_device
        usable = int(device * c.visible_fraction.get(self.target.family, 1.0) * s.utilization)
        activation = activation_peak_bytes(arch, s.max_num_batched_tokens, s.seq_cap, tp, s.act_bytes, c)
        graph = graph_reserve_bytes(capture_sizes(s.seq_cap), c) if s.graph else 0
        runtime = runtime_overhead_bytes(collective_size, buffsize_mb, c)
        kv_budget = usable - weights - activation - graph - runtime
        per_token = kv_bytes_per_token(arch, s.kv_dtype_bytes, tp, pp)
        # The draft's KV layers take their share of every token from the same pool.
        draft = s.draft_kv_bytes_per_token // tp
        main_budget = int(kv_budget * per_token / (per_token + draft)) if kv_budget > 0 and draft else kv_budget
        tokens = kv_cache_tokens(main_budget, arch, s.block_size, s.kv_dtype_bytes, tp, pp)
        return MemoryBudget(device, usable, weights, activation, graph, runtime, kv_budget, per_token + draft,
                            tokens)

    def replica_count(self, layout: Layout, objective: str) -> int:
        if objective != "throughput":
            return 1
        per_node = self.target.devices_per_node
        if layout.chips > per_node:
            return max(1, self.target.total_devices // layout.chips)
        return (per_node // layout.chips) * self.target.nodes

    def replicas(self, layout: Layout, count: int, *, cluster: bool) -> tuple[Replica, ...]:
        ids = self.target.device_ids
        if cluster or layout.chips > self.target.devices_per_node:
            # One instance over the nodes: the same device ids on every node it uses.
            return (Replica(0, 0, ids),)
        per_node = self.target.devices_per_node // layout.chips
        slots = [(node, slot) for node in range(self.target.nodes) for slot in range(per_node)][:count]
        return tuple(Replica(i, node, ids[slot * layout.chips:(slot + 1) * layout.chips])
                     for i, (node, slot) in enumerate(slots))

    def environment(self, release: str | None, *, collective: bool, moe_ep: bool,
                    devices: tuple[int, ...] | None) -> list[EnvSetting]:
        assert release is not None
        return environment_for(release, collective=collective, moe_ep=moe_ep, devices=devices)

    def memory_options(self, utilization: float, kv_bytes: int | None) -> dict[str, Any]:
        return {"gpu_memory_utilization": utilization}

    def quantization_option(self, model: ModelSpec) -> str | None:
        # ModelSlim checkpoints (and weights a plan assumes quantized) load through vllm-ascend's own method; an
        # LLM-Compressor checkpoint names compressed-tensors in config.json, which vLLM picks up without a flag.
        if model.quantization is None or model.quantization_source == COMPRESSED_TENSORS:
            return None
        return "ascend"

    def check_quantization(self, model: ModelSpec, release: str | None) -> None:
        assert release is not None
        if model.quantization is not None:
            check_runs(model.quantization, self.target.family, release, model.arch.is_moe)
        if model.kv_cache_quantization is not None:
            check_kv_cache_runs(model.kv_cache_quantization, self.target.family, release)

    def fit_alternatives(self, model: ModelSpec, s: Sizing, candidates: list[Layout], required: int,
                         c: MemoryConstants) -> list[str]:
        alternatives = []
        more_nodes = self._more_nodes(s, required, c)
        if more_nodes:
            alternatives.append(more_nodes)
        if model.quantization is None:
            for quant in ("W8A8_DYNAMIC", "W4A8_DYNAMIC") if s.arch.is_moe else ("W8A8",):
                q_bytes = weight_bytes_from_arch(s.arch, "bfloat16" if s.act_bytes == 2 else "float32", quant)
                q_sizing = replace(s, weight_bytes=q_bytes)
                if any(self.budget(q_sizing, lay, c).kv_cache_tokens >= required for lay in candidates):
                    alternatives.append(f"--quantization {quant} ({human_bytes(q_bytes)} of weights, "
                                        "ModelSlim-quantized)")
                    break
        return alternatives

    def _more_nodes(self, s: Sizing, required: int, c: MemoryConstants) -> str | None:
        """The fewest more nodes of this kind whose TP x PP split holds one request."""
        per_node = self.target.devices_per_node
        tps = sorted(valid_tp_sizes(s.arch, per_node), reverse=True)
        for nodes in range(self.target.nodes + 1, self.target.nodes + 8):
            for tp in tps:
                pp_total = nodes * per_node // tp
                if per_node % tp or pp_total > s.arch.num_layers:
                    continue
                if self.budget(s, Layout(tp, pp_total), c).kv_cache_tokens >= required:
                    return f"{nodes} nodes of {self.chip_name}x{per_node} (--nodes {nodes}: TP{tp} x PP{pp_total})"
        return None


def rules_for(target: HardwareTarget) -> TargetRules:
    """The rules object of a target; a chip family vllm-ascend does not support is refused."""
    table = _family_table()
    if target.kind == "cpu" or target.chip is None:
        return CpuEngineRules(target, table["cpu"])
    chip = target.chip
    if chip.family not in table or not chip.vllm_ascend:
        raise BadInputError(chip.serving_refusal or f"npuops has no serving rules for {chip.name} ({chip.family})",
                            "plan for an A2 (910B), A3 or 310P node, or for --hardware cpu")
    return AscendRules(target, table[chip.family])
