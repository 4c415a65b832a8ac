"""The shipped model catalog: every file parses, cites a source and counts its parameters right."""

from __future__ import annotations

import pytest

from npuops.plan.catalog import catalog_entry, catalog_names, close_names, model_catalog
from npuops.plan.model import count_parameters

REQUIRED = [
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-32b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "deepseek-v2-lite",
    "deepseek-v3",
    "mistral-7b",
    "glm-4-9b",
    "llama-2-13b-chat",
    "qwen3.5-27b",
    "qwen3.5-35b-a3b",
    "qwen3.5-122b-a10b",
    "qwen3.5-397b-a17b",
    "glm-5",
    "glm-5.1",
    "kimi-k2-instruct",
    "kimi-k2.5",
    "minimax-m2.5",
    "deepseek-v3.2",
]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_models_resolve(name: str) -> None:
    assert catalog_entry(name) is not None


@pytest.mark.parametrize("name", sorted(model_catalog()))
def test_parameter_count_matches_published_size(name: str) -> None:
    entry = model_catalog()[name]
    counts = count_parameters(entry.spec.arch)
    # The file records what the planner's own function computes, and that is the published size within 3%.
    assert counts.total == entry.parameters
    assert counts.active == entry.active_parameters
    assert counts.total == pytest.approx(entry.published_parameters, rel=0.03)
    if entry.published_active_parameters is not None:
        # Published active counts are rounder (and some exclude embeddings); 15% keeps them honest.
        assert counts.active == pytest.approx(entry.published_active_parameters, rel=0.15)


@pytest.mark.parametrize("name", sorted(model_catalog()))
def test_every_entry_cites_its_source(name: str) -> None:
    entry = model_catalog()[name]
    assert entry.source.strip()
    assert "/" in entry.hf_id


def test_lookup_is_case_insensitive_and_takes_hf_ids() -> None:
    entry = catalog_entry("Qwen/Qwen3-8B")
    assert entry is not None and entry.name == "qwen3-8b"
    assert catalog_entry("LLAMA-2-13B-CHAT") is catalog_entry("meta-llama/Llama-2-13b-chat-hf")


def test_published_numbers_of_the_brief() -> None:
    q8 = model_catalog()["qwen3-8b"]
    assert count_parameters(q8.spec.arch).total / 1e9 == pytest.approx(8.19, rel=0.01)
    l13 = model_catalog()["llama-2-13b"]
    assert count_parameters(l13.spec.arch).total / 1e9 == pytest.approx(13.0, rel=0.01)


def test_architecture_specials() -> None:
    v3 = model_catalog()["deepseek-v3"].spec.arch
    assert v3.is_mla and v3.is_moe and v3.num_dense_layers == 3 and v3.q_lora_rank == 1536
    lite = model_catalog()["deepseek-v2-lite"].spec.arch
    assert lite.is_mla and lite.q_lora_rank == 0 and lite.num_dense_layers == 1
    glm = model_catalog()["glm-4-9b-chat"].spec.arch
    assert (glm.num_layers, glm.num_kv_heads, glm.head_dim, glm.vocab_size) == (40, 2, 128, 151552)
    assert glm.qkv_bias


def test_close_names_suggest_a_family() -> None:
    assert "qwen3-8b" in close_names("qwen3-7b")
    assert catalog_names() == sorted(catalog_names())
