"""A plan as the planner hands it over: the vLLM options of one replica, npuops' own decisions around them, the
memory budget, the prediction, and why each value is what it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from npuops.plan.additional_config import AdditionalSetting
from npuops.plan.calibration import UNCALIBRATED, CalibrationChoice
from npuops.plan.cluster import ClusterPlan, HcclBufferSize
from npuops.plan.environment import EnvSetting
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.layout import Layout
from npuops.plan.memory import MemoryBudget, max_concurrency
from npuops.plan.model import ModelSpec, count_parameters
from npuops.plan.performance import PerfInputs, Prediction, predict
from npuops.plan.router import RouterOptions
from npuops.plan.rules import Replica, TargetRules
from npuops.plan.server_options import ServerOptions
from npuops.plan.speculative import SpeculativePlan
from npuops.plan.target import HardwareTarget


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
class Plan:
    """A planned deployment: the vLLM options of one replica and npuops' own decisions around them."""

    model: ModelSpec
    target: HardwareTarget
    workload: Workload
    options: PlanOptions  # what the operator fixed
    rules: TargetRules
    server: ServerOptions  # one replica's `vllm serve` options (launch adds the model path, host and port)
    release: str | None  # the vllm-ascend release planned for (None on the CPU engine)
    graph_mode: str  # eager | piecewise | full_decode_only | cpu_compiled
    layout: Layout
    replica_count: int  # independent engines, or data-parallel ranks of a cluster
    replicas: tuple[Replica, ...]
    router: RouterOptions | None  # in front of several replicas on one node: their one endpoint
    cluster: ClusterPlan | None
    env_settings: tuple[EnvSetting, ...]
    hccl_buffer: HcclBufferSize | None  # expert parallel's all-to-all buffer, sized from the MC2 kernels' formula
    memory: MemoryBudget  # one device
    weight_bytes: int  # the whole model in device memory at the serving dtype
    seq_cap: int  # the most sequences a step may decode together
    prediction: Prediction  # calibrated when `calibration` applies
    warnings: tuple[str, ...]
    perf: PerfInputs  # what the prediction was made from: the launched instance keeps it for `npuops bench`
    calibration: CalibrationChoice = UNCALIBRATED
    explanations: tuple[Explanation, ...] = ()
    speculative: SpeculativePlan | None = None  # the draft method, K and acceptance the prediction assumed
    additional_config: tuple[AdditionalSetting, ...] = ()  # vllm-ascend keys the plan writes, each with why

    @property
    def uncalibrated_prediction(self) -> Prediction:
        return predict(self.perf)

    @property
    def env(self) -> dict[str, str]:
        return {s.name: s.value for s in self.env_settings}

    @property
    def vllm_args(self) -> tuple[str, ...]:
        """The `vllm serve MODEL ...` flags of one replica, in a stable order."""
        return tuple(self.server.flags())

    @property
    def max_concurrency(self) -> float:
        return max_concurrency(self.memory.kv_cache_tokens, self.workload.request_tokens, self.server_int("block_size"))

    def server_int(self, name: str) -> int:
        value = getattr(self.server, name)
        assert isinstance(value, int), name
        return value

    @property
    def config(self) -> dict[str, Any]:
        """The view `npuops plan --json` has always printed: the vLLM options (by field name) with npuops'
        decisions that go with them (replicas, graph mode, cluster, quantization scheme, release)."""
        s = self.server
        cluster = self.cluster
        return {
            "tensor_parallel_size": s.tensor_parallel_size,
            "pipeline_parallel_size": s.pipeline_parallel_size,
            "data_parallel_size": self.replica_count,
            "dtype": s.dtype,
            "block_size": s.block_size,
            "max_model_len": s.max_model_len,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "max_num_seqs": s.max_num_seqs,
            "stream_interval": s.stream_interval,
            "gpu_memory_utilization": s.gpu_memory_utilization,
            "kv_cache_memory_bytes": s.kv_cache_memory_bytes,
            "quantization": s.quantization,
            "quantization_scheme": self.model.quantization,
            "enable_expert_parallel": bool(s.enable_expert_parallel),
            "enforce_eager": bool(s.enforce_eager),
            "compilation_config": s.compilation_config,
            "graph_mode": self.graph_mode,
            "distributed_executor_backend": s.distributed_executor_backend,
            "data_parallel_size_local": cluster.dp_local if cluster else None,
            "multinode": cluster.strategy if cluster else None,
            "trust_remote_code": bool(s.trust_remote_code),
            "served_model_name": s.served_model_name,
            "vllm_ascend_version": self.release,
            "replica_mode": (f"one endpoint over {cluster.nodes} nodes" if cluster else
                             f"{self.replica_count} replica{'s' if self.replica_count > 1 else ''} behind one router"
                             if self.router is not None else "single instance"),
            "router_policy": self.router.policy if self.router is not None else None,
            "speculative_config": s.speculative_config,
            "additional_config": s.additional_config,
            "kv_cache_quantization": self.model.kv_cache_quantization,
        }

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
                if arch.is_moe else None,
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
                "fixed_lengths": self.workload.fixed_lengths,
            },
            "config": self.config,
            "env": self.env,
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
            "calibration": {"applied": self.calibration.applied.as_dict() if self.calibration.applied else None,
                            "why": self.calibration.why,
                            "uncalibrated_prediction": self.uncalibrated_prediction.as_dict()},
            "explanations": [e.as_dict() for e in self.explanations],
            "warnings": list(self.warnings),
            "replicas": [r.as_dict() for r in self.replicas],
            "vllm_args": list(self.vllm_args),
            "speculative": self.speculative.as_dict() if self.speculative else None,
            "cluster": self.cluster.as_dict() if self.cluster else None,
            "router": self.router.to_json() if self.router is not None else None,
        }
