"""The planner as a pipeline: one rules object per target, explanations produced once from the finished plan, and
the target a request resolves to, whichever way the node reaches it."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from npuops.errors import BadInputError, EnvironmentMissingError
from npuops.hardware.chips import chip_by_name
from npuops.hardware.node import Node
from npuops.plan.catalog import load_model
from npuops.plan.explain import explain
from npuops.plan.inputs import PlanOptions, PlanRequest, Workload
from npuops.plan.planner import make_plan
from npuops.plan.request import node_target, resolve_target
from npuops.plan.result import Plan
from npuops.plan.rules import AscendRules, CpuEngineRules, rules_for
from npuops.plan.target import cpu_target, parse_hardware_spec
from npuops.settings import Settings

GRID = [
    ("qwen3-8b", "910B3x8", Workload(512, 128, concurrency=16), PlanOptions()),
    ("qwen3-32b", "910B4x4", Workload(2048, 256, objective="latency"), PlanOptions()),
    ("qwen3-8b", "310P3x2", Workload(512, 128), PlanOptions(dtype="bfloat16")),
    ("qwen3-30b-a3b", "910B3x8", Workload(512, 128), PlanOptions(tp=4)),
    ("llama-2-13b-chat", "910B3x8", Workload(512, 128, concurrency=64), PlanOptions(vllm_ascend_version="0.9.1")),
    ("llama-3.1-8b", "Ascend910x16", Workload(1024, 256, request_rate=4.0), PlanOptions(max_num_seqs=32)),
]


@pytest.fixture(scope="module")
def plans() -> list[Plan]:
    out = [make_plan(load_model(m), parse_hardware_spec(h), w, o) for m, h, w, o in GRID]
    out.append(make_plan(load_model("qwen3-235b-a22b", "W8A8"), parse_hardware_spec("910B3x8"), Workload(512, 128)))
    out.append(make_plan(load_model("qwen3-235b-a22b"), parse_hardware_spec("910B3x8", nodes=2), Workload(512, 128)))
    out.append(make_plan(load_model("llama-3.1-70b"), parse_hardware_spec("910B3x2", nodes=2), Workload(512, 128)))
    return out


def test_each_target_has_its_rules_object() -> None:
    assert isinstance(rules_for(parse_hardware_spec("910B3x8")), AscendRules)
    assert isinstance(rules_for(cpu_target(16 * 2**30, 4)), CpuEngineRules)
    assert rules_for(parse_hardware_spec("310P3x2")).family.dtype == "float16"
    with pytest.raises(BadInputError, match="does not support"):
        rules_for(parse_hardware_spec("910Ax8"))


def test_explanations_are_each_key_once_and_agree_with_the_plan(plans: list[Plan]) -> None:
    for plan in plans:
        keys = [e.key for e in plan.explanations]
        assert len(keys) == len(set(keys))
        config = plan.config
        for key in ("dtype", "block_size", "max_model_len", "max_num_batched_tokens", "max_num_seqs",
                    "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            assert plan.explanation(key).value == config[key], (plan.model.served_name, key)
        for name, value in plan.env.items():
            explained = plan.explanation(f"env.{name}").value
            assert str(explained) == value, name
        if plan.cluster is not None:
            assert plan.explanation("multinode").value == plan.cluster.strategy


def test_explanations_come_from_the_finished_plan_alone(plans: list[Plan]) -> None:
    """Produced again from the plan (and nothing else), the explanations are the same, in the same order."""
    for plan in plans:
        assert explain(dataclasses.replace(plan, explanations=())) == plan.explanations


def test_the_vllm_options_and_npuops_decisions_are_apart(plans: list[Plan]) -> None:
    """The ServerOptions hold only `vllm serve` options; graph mode, replicas and cluster are the plan's fields."""
    for plan in plans:
        assert plan.server.model is None and plan.server.host is None  # launch adds these per replica
        assert plan.vllm_args == tuple(plan.server.flags())
        assert plan.config["graph_mode"] == plan.graph_mode
        assert plan.config["data_parallel_size"] == plan.replica_count


def _node(chip: str, count: int, hbm_mb: int | None, memory_mb: int | None) -> Node:
    """A node model as `npuops node --json` sends it, read back with Node.from_json."""
    chips = [{"npu_id": i, "chip_id": 0, "logical_id": None, "name": chip, "health": "OK", "bus_id": f"0000:0{i}:00.0",
              "power_w": 90.0, "temperature_c": 40, "aicore_percent": 0, "memory_used_mb": 0,
              "memory_total_mb": memory_mb, "hbm_used_mb": 0, "hbm_total_mb": hbm_mb}
             for i in range(count)]
    return Node.from_json({"npu_smi": {"version": "23.0.rc2", "driver_version": "23.0.rc2", "error": None},
                           "npu": {"found": True, "reasons": []}, "chips": chips, "processes": [], "host": {}})


def test_a_node_target_reads_the_chips_memory_and_a_chip_reporting_none_gets_its_catalog_size() -> None:
    spec = chip_by_name("910B3")
    assert spec is not None
    measured = node_target(_node("910B3", 8, 65536, 15567))
    assert measured.memory_bytes_per_device == 65536 * 2**20 and measured.devices_per_node == 8
    # 0 MB (a chip npu-smi could not read) is not a size: the catalog's, never the 310P-style memory column.
    unknown = node_target(_node("910B3", 8, 0, 15567))
    assert unknown.memory_bytes_per_device == spec.memory_bytes
    assert node_target(_node("310P3", 2, None, 44278)).memory_bytes_per_device == 44278 * 2**20


def test_a_node_without_npus_says_what_to_pass_instead() -> None:
    with pytest.raises(EnvironmentMissingError, match="--hardware"):
        node_target(_node("910B3", 0, None, None))


@pytest.mark.parametrize(("hardware", "nodes"), list(itertools.product(["910B3x8", "auto"], [1, 2])))
def test_the_request_resolves_the_same_target_from_a_spec_or_the_node(hardware: str, nodes: int) -> None:
    request = PlanRequest(model="qwen3-8b", hardware=hardware, nodes=nodes)
    target = resolve_target(Settings(root=Path("/nonexistent")), request, node=_node("910B3", 8, 65536, 15567))
    assert (target.chip.name if target.chip else None, target.devices_per_node, target.nodes) == ("910B3", 8, nodes)
