"""make_plan: the scenario of docs/claims.md, models too big for a node, 310P rules, env gating, TP properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.errors import BadInputError
from npuops.plan.catalog import load_model
from npuops.plan.constants import memory_constants
from npuops.plan.environment import environment_for, parse_release
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.layout import tp_is_valid
from npuops.plan.model import ModelArch, ModelSpec, weight_bytes_from_arch
from npuops.plan.planner import PlanDoesNotFit, make_plan
from npuops.plan.target import cpu_target, parse_hardware_spec

SEED_WORKLOAD = Workload(512, 128, concurrency=64)


def test_seed_scenario_throughput() -> None:
    plan = make_plan(load_model("llama-2-13b-chat"), parse_hardware_spec("910B3x8"), SEED_WORKLOAD)
    cfg = plan.config
    assert (cfg["tensor_parallel_size"], cfg["data_parallel_size"]) == (1, 8)
    assert [r.visible_devices for r in plan.replicas] == [str(i) for i in range(8)]
    tp = plan.explanation("tensor_parallel_size")
    assert tp.seed is not None and "tensor_parallel_size=8" in tp.seed
    assert "24.2 GiB" in tp.seed and "64.0 GiB" in tp.seed  # memory in one unit, the chip's too
    assert cfg["block_size"] == 128 and cfg["dtype"] == "bfloat16"
    assert plan.explanation("dtype").seed is not None
    assert plan.prediction.output_tokens_per_s > 0 and plan.prediction.tpot_ms > 0


def test_seed_scenario_latency_uses_a_wider_split() -> None:
    plan = make_plan(
        load_model("llama-2-13b-chat"),
        parse_hardware_spec("910B3x8"),
        Workload(512, 128, concurrency=1, objective="latency"),
    )
    assert plan.config["tensor_parallel_size"] > 1 and plan.config["data_parallel_size"] == 1
    assert "tensor_parallel_size=8" in (plan.explanation("tensor_parallel_size").seed or "")
    throughput = make_plan(load_model("llama-2-13b-chat"), parse_hardware_spec("910B3x8"), Workload(512, 128))
    assert plan.prediction.tpot_ms < throughput.prediction.tpot_ms


def test_json_shape() -> None:
    plan = make_plan(load_model("llama-2-13b-chat"), parse_hardware_spec("910B3x8"), SEED_WORKLOAD)
    data = plan.to_json()
    assert set(data) >= {
        "model",
        "hardware",
        "workload",
        "config",
        "env",
        "memory",
        "prediction",
        "explanations",
        "warnings",
        "replicas",
        "vllm_args",
    }
    assert set(data["config"]) >= {
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "dtype",
        "block_size",
        "max_model_len",
        "max_num_batched_tokens",
        "max_num_seqs",
        "gpu_memory_utilization",
    }
    assert set(data["memory"]) >= {
        "weights_bytes_per_device",
        "kv_cache_bytes_per_token",
        "kv_cache_tokens",
        "max_concurrency",
    }
    assert set(data["prediction"]) == {"ttft_ms", "tpot_ms", "e2e_ms", "output_tokens_per_s", "requests_per_s",
                                       "running_per_replica", "queued_per_replica", "busy_replicas"}
    assert all(set(e) >= {"key", "value", "why"} for e in data["explanations"])
    assert all(set(r) >= {"devices", "visible_devices"} for r in data["replicas"])
    assert data["vllm_args"][:2] == ["--served-model-name", "llama-2-13b"]
    assert "--device" not in data["vllm_args"]
    import json

    json.dumps(data)  # serialisable as is


def test_qwen3_235b_needs_more_than_one_node() -> None:
    model = load_model("qwen3-235b-a22b")
    with pytest.raises(PlanDoesNotFit) as info:
        make_plan(model, parse_hardware_spec("910B3x8"), Workload(512, 128))
    text = info.value.one_line()
    assert "--nodes 2" in text and "W8A8" in text
    assert isinstance(info.value, BadInputError)
    two = make_plan(model, parse_hardware_spec("910B3x8", nodes=2), Workload(512, 128))
    # A MoE model over two nodes: data + expert parallel over all 16 devices, vLLM's native engine, no Ray.
    assert two.cluster is not None and two.cluster.strategy == "dp" and two.cluster.expert_parallel
    assert two.config["data_parallel_size"] * two.config["tensor_parallel_size"] == 16
    assert two.config["distributed_executor_backend"] is None and two.config["enable_expert_parallel"]
    ray = make_plan(model, parse_hardware_spec("910B3x8", nodes=2), Workload(512, 128), PlanOptions(multinode="ray"))
    assert ray.config["tensor_parallel_size"] * ray.config["pipeline_parallel_size"] == 16
    assert ray.config["distributed_executor_backend"] == "ray" and ray.cluster is not None
    quantized = make_plan(load_model("qwen3-235b-a22b", "W8A8"), parse_hardware_spec("910B3x8"), Workload(512, 128))
    assert quantized.config["tensor_parallel_size"] == 8 and quantized.config["quantization"] == "ascend"
    assert quantized.config["enable_expert_parallel"] and int(quantized.env["HCCL_BUFFSIZE"]) >= 200


def test_does_not_fit_suggests_a_shorter_max_model_len() -> None:
    with pytest.raises(PlanDoesNotFit, match="max-model-len"):
        make_plan(
            load_model("llama-3.1-8b"),
            parse_hardware_spec("910B4x1"),
            Workload(512, 128),
            PlanOptions(max_model_len=131072),
        )


def test_310p_float16_modest_length_and_utilization() -> None:
    plan = make_plan(
        load_model("qwen3-8b"), parse_hardware_spec("310P3x2"), Workload(1000, 200), PlanOptions(dtype="bfloat16")
    )
    cfg = plan.config
    assert cfg["dtype"] == "float16" and cfg["gpu_memory_utilization"] == 0.8
    assert cfg["max_model_len"] <= 4096 and "--max-model-len" in plan.vllm_args
    assert any("bfloat16" in w for w in plan.warnings)
    assert not cfg["enforce_eager"]  # ACL graphs on 310P from 0.20.2rc1 (tests/plan/test_310p_graphs.py)


def test_bf16_never_on_chips_without_it() -> None:
    for spec in ("310P3x1",):
        plan = make_plan(
            load_model("qwen3-8b"), parse_hardware_spec(spec), Workload(256, 64), PlanOptions(dtype="bf16")
        )
        assert plan.config["dtype"] == "float16"
    with pytest.raises(BadInputError, match="does not support"):
        make_plan(load_model("qwen3-8b"), parse_hardware_spec("910Ax8"), Workload(256, 64))


def test_a_family_vllm_ascend_cannot_serve_is_refused_with_its_reason() -> None:
    """The 310B (Atlas 200I A2 boards) is a chip npu-smi shows but vllm-ascend has not planned for."""
    with pytest.raises(BadInputError) as refused:
        make_plan(load_model("qwen3-8b"), parse_hardware_spec("310B1x1"), Workload(256, 64))
    assert refused.value.problem == ("vllm-ascend does not support Atlas 200I A2 boards (Ascend 310B): its FAQ lists "
                                     "them as unplanned")
    assert "--hardware cpu" in refused.value.fix


def test_block_size_32_is_overridden_with_a_note() -> None:
    plan = make_plan(
        load_model("qwen3-8b"), parse_hardware_spec("910B3x8"), Workload(512, 128), PlanOptions(block_size=32)
    )
    assert plan.config["block_size"] == 128
    assert any("--block-size 32" in w for w in plan.warnings)
    explanation = plan.explanation("block_size")
    assert "32" in explanation.why and explanation.seed and "32" in explanation.seed


def test_env_gating_drops_a_removed_key() -> None:
    old = environment_for("0.9.1", collective=False, moe_ep=False, devices=None)
    new = environment_for("0.11.0", collective=False, moe_ep=False, devices=None)
    assert "VLLM_USE_V1" in {e.name for e in old}
    assert "VLLM_USE_V1" not in {e.name for e in new}
    plan = make_plan(
        load_model("qwen3-8b"),
        parse_hardware_spec("910B3x8"),
        Workload(512, 128),
        PlanOptions(vllm_ascend_version="0.13.0"),
    )
    assert "VLLM_USE_V1" not in plan.env and plan.env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    early = make_plan(
        load_model("qwen3-8b"),
        parse_hardware_spec("910B3x8"),
        Workload(512, 128),
        PlanOptions(vllm_ascend_version="0.9.1", tp=2),
    )
    assert early.env["VLLM_USE_V1"] == "1" and early.env["HCCL_OP_EXPANSION_MODE"] == "AIV"
    assert early.config["compilation_config"] is None  # FULL_DECODE_ONLY needs 0.11+
    assert parse_release("0.22.1rc1") < parse_release("0.22.1") < parse_release("0.23.0")
    with pytest.raises(BadInputError, match="release number"):
        parse_release("latest")


def test_graph_mode_capture_sizes() -> None:
    plan = make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x8"), Workload(512, 128))
    comp = plan.config["compilation_config"]
    assert comp["cudagraph_mode"] == "FULL_DECODE_ONLY"
    assert max(comp["cudagraph_capture_sizes"]) <= min(plan.config["max_num_seqs"], 512)


def test_user_choices_are_validated() -> None:
    model, target = load_model("qwen2.5-7b"), parse_hardware_spec("910B3x8")
    with pytest.raises(BadInputError, match="--tp 7"):
        make_plan(model, target, Workload(512, 128), PlanOptions(tp=7))  # 28 heads but 4 KV heads
    with pytest.raises(BadInputError, match="positions"):
        make_plan(model, target, Workload(512, 128), PlanOptions(max_model_len=10**6))
    with pytest.raises(BadInputError, match="objective"):
        make_plan(model, target, Workload(512, 128, objective="cheap"))
    with pytest.raises(BadInputError):
        make_plan(model, target, Workload(0, 128))


def test_devices_subset_gives_masks() -> None:
    plan = make_plan(
        load_model("qwen3-8b"), parse_hardware_spec("910B3x8", devices="4-7"), Workload(512, 128), PlanOptions(tp=2)
    )
    assert [r.visible_devices for r in plan.replicas] == ["4,5", "6,7"]


def test_cpu_plan_dtype_and_threads() -> None:
    plan = make_plan(load_model("qwen3-8b"), cpu_target(256 * 2**30, 32, 2), Workload(256, 64))
    assert plan.config["dtype"] == "bfloat16" and plan.config["gpu_memory_utilization"] is None
    assert "OMP_NUM_THREADS" not in plan.env
    assert plan.explanation("env.OMP_NUM_THREADS").seed


# --- property: the chosen TP is valid and the memory it plans fits ------------------------------------------

_HEADS = st.sampled_from([8, 12, 16, 20, 24, 28, 32, 40, 48, 64])


@st.composite
def _archs(draw: Any) -> ModelArch:
    heads = draw(_HEADS)
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8, heads) if heads % d == 0]))
    head_dim = draw(st.sampled_from([64, 128]))
    return ModelArch(
        model_type="llama",
        architectures=("LlamaForCausalLM",),
        num_layers=draw(st.integers(2, 96)),
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        vocab_size=draw(st.sampled_from([32000, 128256, 151936])),
        intermediate_size=draw(st.sampled_from([4096, 11008, 13824, 14336, 28672])),
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=_archs(), chips=st.sampled_from([1, 2, 4, 8]), objective=st.sampled_from(["throughput", "latency"]))
def test_chosen_tp_divides_heads_and_fits(arch: ModelArch, chips: int, objective: str) -> None:
    model = ModelSpec(
        arch=arch,
        weight_bytes=weight_bytes_from_arch(arch, "bfloat16"),
        weights_present=False,
        quantization=None,
        path=None,
        served_name="random",
    )
    target = parse_hardware_spec(f"910B3x{chips}")
    try:
        plan = make_plan(model, target, Workload(512, 128, concurrency=8, objective=objective))
    except PlanDoesNotFit:
        return
    tp = plan.config["tensor_parallel_size"]
    assert arch.num_attention_heads % tp == 0 and tp <= chips and tp_is_valid(arch, tp)
    mem = plan.memory
    usable = target.memory_bytes_per_device * memory_constants().visible_fraction["A2"] * 0.9
    spent = mem.weights_bytes + mem.activation_bytes + mem.graph_bytes + mem.runtime_bytes
    assert spent + mem.kv_cache_tokens * mem.kv_bytes_per_token <= usable + 1
