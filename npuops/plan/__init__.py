"""Planning a vLLM deployment for a model on Ascend (or CPU) hardware: pure functions, no I/O.

The only file access is reading a model directory that the caller passes to `load_model`.
"""

from npuops.plan.catalog import CatalogEntry, catalog_entry, catalog_names, model_catalog
from npuops.plan.memory import MemoryBudget, kv_bytes_per_token, kv_cache_tokens
from npuops.plan.model import ModelArch, ModelSpec, ParameterCount, count_parameters, load_model
from npuops.plan.performance import PerfInputs, Prediction, predict
from npuops.plan.planner import (
    Explanation,
    Plan,
    PlanDoesNotFit,
    PlanOptions,
    Replica,
    Workload,
    make_plan,
    tp_is_valid,
    valid_tp_sizes,
)
from npuops.plan.target import (
    HardwareTarget,
    cpu_target,
    parse_hardware_spec,
    restrict_devices,
    target_from_node,
)
from npuops.ranges import parse_device_list

__all__ = [
    "CatalogEntry",
    "Explanation",
    "HardwareTarget",
    "MemoryBudget",
    "ModelArch",
    "ModelSpec",
    "ParameterCount",
    "PerfInputs",
    "Plan",
    "PlanDoesNotFit",
    "PlanOptions",
    "Prediction",
    "Replica",
    "Workload",
    "catalog_entry",
    "catalog_names",
    "count_parameters",
    "cpu_target",
    "kv_bytes_per_token",
    "kv_cache_tokens",
    "load_model",
    "make_plan",
    "model_catalog",
    "parse_device_list",
    "parse_hardware_spec",
    "predict",
    "restrict_devices",
    "target_from_node",
    "tp_is_valid",
    "valid_tp_sizes",
]
