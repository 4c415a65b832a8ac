"""Calibration constants of the memory and performance models, read from npuops/data/perf_model.toml."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from npuops.datafiles import load_data_toml


@dataclass(frozen=True)
class MemoryConstants:
    visible_fraction: dict[str, float]
    npu_runtime_bytes: int
    activation_hidden_factor: float
    sampler_logit_copies: float
    graph_base_bytes: int
    graph_per_size_bytes: int
    cpu_process_bytes: int
    cpu_default_kv_bytes: int


@dataclass(frozen=True)
class PerfConstants:
    prefill_mfu: float
    decode_mfu: float
    bandwidth_efficiency: float
    request_overhead_ms: float
    eager_us_per_layer: float
    piecewise_us_per_layer: float
    full_graph_us_per_layer: float
    moe_layer_overhead_factor: float
    moe_layer_us: float
    allreduce_us: float
    allreduce_us_per_doubling: float
    pp_send_us: float
    host_us_per_seq: float
    cpu_flops_per_core: float
    cpu_flops_per_cycle_float32: dict[str, float]
    cpu_flops_per_cycle_bfloat16: dict[str, float]
    cpu_emulated_bfloat16_factor: float
    cpu_default_ghz: float
    cpu_compiled_us_per_layer: float
    cpu_eager_bfloat16_us_per_layer: float
    cpu_request_overhead_ms: float
    cpu_memory_bandwidth_bytes_per_s: float
    cpu_us_per_layer: float
    cpu_host_us_per_seq: float
    spec_step_us: float = 0.0
    spec_host_us_per_seq: float = 0.0
    spec_forward_us: float = 0.0
    moe_prefill_token_us: float = 0.0
    linear_attention_prefill_token_us: float = 0.0
    kv_bandwidth_efficiency: float = 0.7
    moe_prefill_layer_us: float = 0.0
    cpu_spec_step_us: float = 0.0
    cpu_spec_host_us_per_seq: float = 0.0
    pd_transfer_bytes_per_s: float = 15e9
    pd_transfer_ms: float = 5.0
    cpu_pd_transfer_bytes_per_s: float = 1e9
    cpu_pd_transfer_ms: float = 15.0


def _memory(raw: dict[str, Any]) -> MemoryConstants:
    return MemoryConstants(
        visible_fraction={str(k): float(v) for k, v in raw["visible_fraction"].items()},
        npu_runtime_bytes=int(raw["npu_runtime_bytes"]),
        activation_hidden_factor=float(raw["activation_hidden_factor"]),
        sampler_logit_copies=float(raw["sampler_logit_copies"]),
        graph_base_bytes=int(raw["graph_base_bytes"]),
        graph_per_size_bytes=int(raw["graph_per_size_bytes"]),
        cpu_process_bytes=int(raw["cpu_process_bytes"]),
        cpu_default_kv_bytes=int(raw["cpu_default_kv_bytes"]),
    )


def _performance(raw: dict[str, Any]) -> PerfConstants:
    cpu = raw["cpu"]
    return PerfConstants(
        prefill_mfu=float(raw["prefill_mfu"]),
        decode_mfu=float(raw["decode_mfu"]),
        bandwidth_efficiency=float(raw["bandwidth_efficiency"]),
        request_overhead_ms=float(raw["request_overhead_ms"]),
        eager_us_per_layer=float(raw["eager_us_per_layer"]),
        piecewise_us_per_layer=float(raw["piecewise_us_per_layer"]),
        full_graph_us_per_layer=float(raw["full_graph_us_per_layer"]),
        moe_layer_overhead_factor=float(raw["moe_layer_overhead_factor"]),
        moe_layer_us=float(raw["moe_layer_us"]),
        allreduce_us=float(raw["allreduce_us"]),
        allreduce_us_per_doubling=float(raw["allreduce_us_per_doubling"]),
        pp_send_us=float(raw["pp_send_us"]),
        host_us_per_seq=float(raw["host_us_per_seq"]),
        cpu_flops_per_core=float(cpu["flops_per_core"]),
        cpu_flops_per_cycle_float32={str(k): float(v) for k, v in cpu["flops_per_cycle_float32"].items()},
        cpu_flops_per_cycle_bfloat16={str(k): float(v) for k, v in cpu["flops_per_cycle_bfloat16"].items()},
        cpu_emulated_bfloat16_factor=float(cpu["emulated_bfloat16_factor"]),
        cpu_default_ghz=float(cpu["default_ghz"]),
        cpu_compiled_us_per_layer=float(cpu["compiled_us_per_layer"]),
        cpu_eager_bfloat16_us_per_layer=float(cpu["eager_bfloat16_us_per_layer"]),
        cpu_request_overhead_ms=float(cpu["request_overhead_ms"]),
        cpu_memory_bandwidth_bytes_per_s=float(cpu["memory_bandwidth_bytes_per_s"]),
        cpu_us_per_layer=float(cpu["us_per_layer"]),
        cpu_host_us_per_seq=float(cpu["host_us_per_seq"]),
        spec_step_us=float(raw["spec_step_us"]),
        spec_host_us_per_seq=float(raw["spec_host_us_per_seq"]),
        spec_forward_us=float(raw["spec_forward_us"]),
        moe_prefill_token_us=float(raw["moe_prefill_token_us"]),
        linear_attention_prefill_token_us=float(raw["linear_attention_prefill_token_us"]),
        kv_bandwidth_efficiency=float(raw["kv_bandwidth_efficiency"]),
        moe_prefill_layer_us=float(raw["moe_prefill_layer_us"]),
        cpu_spec_step_us=float(cpu["spec_step_us"]),
        cpu_spec_host_us_per_seq=float(cpu["spec_host_us_per_seq"]),
        pd_transfer_bytes_per_s=float(raw["pd_transfer_bytes_per_s"]),
        pd_transfer_ms=float(raw["pd_transfer_ms"]),
        cpu_pd_transfer_bytes_per_s=float(cpu["pd_transfer_bytes_per_s"]),
        cpu_pd_transfer_ms=float(cpu["pd_transfer_ms"]),
    )


@lru_cache(maxsize=1)
def memory_constants() -> MemoryConstants:
    return _memory(load_data_toml("perf_model.toml")["memory"])


@lru_cache(maxsize=1)
def perf_constants() -> PerfConstants:
    return _performance(load_data_toml("perf_model.toml")["performance"])
