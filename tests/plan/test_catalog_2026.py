"""The model families 2026's Ascend configurations serve: Qwen3.5 (hybrid attention), GLM-5 and DeepSeek-V3.2 (DSA),
Kimi-K2 (384 experts), MiniMax-M2.5; each catalog entry against its published config.json (tests/fixtures/models)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from npuops.errors import BadInputError
from npuops.plan.catalog import catalog_entry, load_model, model_catalog
from npuops.plan.inputs import Workload
from npuops.plan.memory import kv_bytes_per_token, kv_cache_tokens, kv_page_bytes_per_layer
from npuops.plan.model import ModelArch, arch_from_config, count_parameters, mtp_layer_parameters
from npuops.plan.planner import make_plan
from npuops.plan.target import parse_hardware_spec
from tests.support.npuops_cli import npuops
from tests.support.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "models"

# name: (MoE, MLA, layers, layers with a per-token KV cache, MTP layers, routed experts, DSA indexer heads)
EXPECTED = {
    "qwen3.5-27b": (False, False, 64, 16, 1, 0, 0),
    "qwen3.5-35b-a3b": (True, False, 40, 10, 1, 256, 0),
    "qwen3.5-122b-a10b": (True, False, 48, 12, 1, 256, 0),
    "qwen3.5-397b-a17b": (True, False, 60, 15, 1, 512, 0),
    "glm-5": (True, True, 78, 78, 1, 256, 32),
    "glm-5.1": (True, True, 78, 78, 1, 256, 32),
    "kimi-k2-instruct": (True, True, 61, 61, 0, 384, 0),
    "kimi-k2.5": (True, True, 61, 61, 0, 384, 0),
    "minimax-m2.5": (True, False, 62, 62, 3, 256, 0),
    "deepseek-v3.2": (True, True, 61, 61, 1, 256, 64),
}


def _fixture_arch(name: str) -> ModelArch:
    path = FIXTURES / name / "config.json"
    return arch_from_config(json.loads(path.read_text(encoding="utf-8")), str(path))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_entry_reads_as_its_published_config(name: str) -> None:
    entry = model_catalog()[name]
    # The [config] table copies the published values: both read to the same architecture.
    assert entry.spec.arch == _fixture_arch(name)
    assert name in entry.source and "@" in entry.source
    arch = entry.spec.arch
    facts = (arch.is_moe, arch.is_mla, arch.num_layers, arch.kv_cache_layers, arch.mtp_layers, arch.num_experts,
             arch.index_n_heads)
    assert facts == EXPECTED[name]
    assert arch.is_hybrid == (arch.kv_cache_layers < arch.num_layers)


def test_lookup_by_hugging_face_id() -> None:
    for hf_id in ("Qwen/Qwen3.5-397B-A17B", "zai-org/GLM-5.1", "moonshotai/Kimi-K2.5", "MiniMaxAI/MiniMax-M2.5",
                  "deepseek-ai/DeepSeek-V3.2"):
        entry = catalog_entry(hf_id)
        assert entry is not None and entry.hf_id == hf_id


def test_the_hybrid_layers_and_their_shapes() -> None:
    arch = model_catalog()["qwen3.5-397b-a17b"].spec.arch
    assert arch.num_linear_layers == 45 and arch.attn_output_gate
    shape = (arch.linear_num_key_heads, arch.linear_num_value_heads, arch.linear_key_head_dim,
             arch.linear_value_head_dim, arch.linear_conv_kernel_dim)
    assert shape == (16, 64, 128, 128, 4)
    assert (arch.num_kv_heads, arch.head_dim, arch.shared_expert_intermediate_size) == (2, 256, 1024)


@pytest.mark.parametrize("name", ["qwen3.5-27b", "qwen3.5-122b-a10b", "qwen3.5-397b-a17b"])
def test_hybrid_kv_cache_counts_only_full_attention_layers(name: str) -> None:
    arch = model_catalog()[name].spec.arch
    page = kv_page_bytes_per_layer(arch, 1, 2, 1)
    assert page == 2 * arch.num_kv_heads * arch.head_dim * 2
    assert kv_bytes_per_token(arch, 2) == page * arch.kv_cache_layers
    # Every 4th layer is full attention: a quarter of what the same model all in full attention would need.
    all_full = replace(arch, num_linear_layers=0)
    assert kv_bytes_per_token(all_full, 2) == 4 * kv_bytes_per_token(arch, 2)
    budget = 8 * 2**30
    assert kv_cache_tokens(budget, arch, 128, 2, 1, 1) == budget // (page * 128) // arch.kv_cache_layers * 128
    assert kv_cache_tokens(budget, arch, 128, 2, 1, 1) >= 4 * kv_cache_tokens(budget, all_full, 128, 2, 1, 1)


def test_hybrid_kv_over_pipeline_stages() -> None:
    arch = model_catalog()["qwen3.5-397b-a17b"].spec.arch  # 15 full-attention layers
    page = kv_page_bytes_per_layer(arch, 1, 2, 1)
    assert kv_bytes_per_token(arch, 2, pp=2) == page * 8
    assert kv_bytes_per_token(arch, 2, pp=4) == page * 4


def test_dsa_models_keep_mla_kv() -> None:
    for name in ("glm-5", "deepseek-v3.2"):
        arch = model_catalog()[name].spec.arch
        assert kv_page_bytes_per_layer(arch, 1, 2, 8) == (512 + 64) * 2
        assert kv_bytes_per_token(arch, 2, tp=8) == (512 + 64) * 2 * arch.num_layers


def test_the_dsa_indexer_is_counted() -> None:
    arch = model_catalog()["deepseek-v3.2"].spec.arch
    without = count_parameters(replace(arch, index_n_heads=0, index_head_dim=0))
    indexer = (1536 * 64 * 128 + 7168 * 128 + 7168 * 64 + 2 * 128) * 61
    assert count_parameters(arch).total - without.total == indexer
    # Without the indexer V3.2 is DeepSeek-V3 exactly.
    assert without.total == model_catalog()["deepseek-v3"].parameters


def test_mtp_layers_stay_out_of_the_main_count() -> None:
    arch = model_catalog()["glm-5"].spec.arch
    assert count_parameters(replace(arch, mtp_layers=0)) == count_parameters(arch)


def test_one_mtp_layer_is_about_deepseeks_published_module() -> None:
    # DeepSeek-V3's card: 14B of MTP module weights, which include their own copy of the embedding and LM head.
    arch = model_catalog()["deepseek-v3"].spec.arch
    mtp = mtp_layer_parameters(arch)
    assert mtp.total + 2 * arch.vocab_size * arch.hidden_size == pytest.approx(14e9, rel=0.05)
    assert mtp.active < mtp.total and mtp.linear < mtp.total


def test_a_dense_mtp_layer_is_one_decoder_layer_plus_the_projection() -> None:
    arch = model_catalog()["qwen3.5-27b"].spec.arch
    h = arch.hidden_size
    q = arch.num_attention_heads * arch.head_dim
    attention = h * 2 * q + 2 * h * arch.num_kv_heads * arch.head_dim + q * h  # the gated q_proj doubles
    mtp = mtp_layer_parameters(arch)
    assert mtp.linear == attention + 3 * h * arch.intermediate_size + 2 * h * h
    assert mtp.total == mtp.active == mtp.linear + 5 * h


def test_qwen3_next_style_interval_without_layer_types() -> None:
    raw = json.loads((FIXTURES / "qwen3.5-122b-a10b" / "config.json").read_text(encoding="utf-8"))
    text = dict(raw["text_config"])
    del text["layer_types"]
    assert arch_from_config({**raw, "text_config": text}) == _fixture_arch("qwen3.5-122b-a10b")


@pytest.mark.parametrize("change", [
    {"layer_types": ["linear_attention"] * 3 + ["full_attention"]},  # 4 types for 48 layers
    {"layer_types": ["linear_attention"] * 48},  # no full-attention layer
    {"linear_num_value_heads": 0},
])
def test_broken_hybrid_configs_are_refused(change: dict[str, object]) -> None:
    raw = json.loads((FIXTURES / "qwen3.5-122b-a10b" / "config.json").read_text(encoding="utf-8"))
    with pytest.raises(BadInputError):
        arch_from_config({**raw, "text_config": {**raw["text_config"], **change}})


@pytest.mark.parametrize(("name", "nodes"), [
    ("qwen3.5-122b-a10b", 1),
    ("qwen3.5-397b-a17b", 2),
    ("glm-5", 4),
    ("kimi-k2.5", 5),
    ("minimax-m2.5", 2),
    ("deepseek-v3.2", 4),
])
def test_a_plan_fits(name: str, nodes: int) -> None:
    plan = make_plan(load_model(name), parse_hardware_spec("910B3x8", nodes=nodes), Workload(512, 128))
    arch = plan.model.arch
    assert plan.memory.kv_cache_tokens >= 640
    tp, pp = plan.config["tensor_parallel_size"], plan.config["pipeline_parallel_size"]
    # At least the main model's KV (a speculative draft may add its own layers' KV on top).
    assert plan.memory.kv_bytes_per_token >= kv_bytes_per_token(arch, 2, tp, pp)
    if arch.is_hybrid:
        assert plan.memory.kv_bytes_per_token < kv_bytes_per_token(replace(arch, num_linear_layers=0), 2, tp, pp) / 2


def test_plan_json_through_the_cli() -> None:
    proc = npuops("plan", "qwen3.5-27b", "--hardware", "910B3x8", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["model"]["catalog_name"] == "qwen3.5-27b" and data["model"]["num_layers"] == 64
    page = 2 * max(1, 4 // data["config"]["tensor_parallel_size"]) * 256 * 2  # K and V of the KV heads, bf16
    # The 16 full-attention layers (plus at most one MTP draft layer), never the 48 Gated DeltaNet layers.
    assert 16 * page <= data["memory"]["kv_cache_bytes_per_token"] <= 17 * page
