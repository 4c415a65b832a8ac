"""KV cache arithmetic, including the CPU engine's exact token count."""

from __future__ import annotations

from pathlib import Path

from npuops.plan.catalog import load_model, model_catalog
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.memory import kv_bytes_per_token, kv_cache_tokens, max_concurrency, weights_per_device
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target


def test_standard_kv_bytes() -> None:
    arch = model_catalog()["llama-2-13b"].spec.arch
    # 2 x 40 layers x 40 KV heads x 128 x 2 bytes
    assert kv_bytes_per_token(arch, 2) == 2 * 40 * 40 * 128 * 2
    assert kv_bytes_per_token(arch, 2, tp=8) == 2 * 40 * 5 * 128 * 2


def test_kv_heads_replicate_beyond_tp() -> None:
    arch = model_catalog()["qwen3-235b-a22b"].spec.arch  # 4 KV heads
    assert kv_bytes_per_token(arch, 2, tp=8) == kv_bytes_per_token(arch, 2, tp=4) == 2 * 94 * 1 * 128 * 2


def test_mla_kv_is_the_latent_and_not_split_by_tp() -> None:
    arch = model_catalog()["deepseek-v3"].spec.arch
    assert kv_bytes_per_token(arch, 2) == (512 + 64) * 61 * 2
    assert kv_bytes_per_token(arch, 2, tp=8) == kv_bytes_per_token(arch, 2)


def test_pipeline_stage_holds_its_layers() -> None:
    arch = model_catalog()["llama-2-13b"].spec.arch
    assert kv_bytes_per_token(arch, 2, pp=2) == kv_bytes_per_token(arch, 2) // 2


def test_cpu_tiny_model_kv_tokens_match_vllm(tiny_model_dir: Path) -> None:
    """The number vLLM's CPU engine logs as 'KV cache size: N tokens' for the tiny test model.

    vllm/v1/worker/cpu_worker.py: with --kv-cache-memory-bytes the worker's available KV memory is exactly
    that value (256M parses as 256 x 2**20 in vLLM's human_readable_int: upper-case suffixes are binary).
    vllm/v1/core/kv_cache_utils.py: page_size = 2 x block_size x num_kv_heads x head_size x dtype bytes
    = 2 x 128 x 2 x 32 x 4 = 65536 bytes per layer; num_blocks = 268435456 // 65536 // 2 layers = 2048;
    the engine reports num_blocks // 1 group x block_size = 2048 x 128 = 262144 tokens.
    """
    model = load_model(str(tiny_model_dir))
    assert model.arch.head_dim == 32
    assert kv_cache_tokens(256 * 2**20, model.arch, 128, 4, 1, 1) == 262144
    plan = make_plan(
        model,
        cpu_target(8 * 2**30, 2, 1),
        Workload(128, 64),
        PlanOptions(dtype="float32", kv_cache_memory_bytes=256 * 2**20),
    )
    assert plan.memory.kv_cache_tokens == 262144
    assert plan.config["block_size"] == 128 and plan.config["tensor_parallel_size"] == 1
    # torch.compile unless a fast start is asked for (--enforce-eager).
    assert "--kv-cache-memory-bytes" in plan.vllm_args and "--enforce-eager" not in plan.vllm_args
    assert plan.config["kv_cache_memory_bytes"] == 256 * 2**20


def test_concurrency_and_weights() -> None:
    assert max_concurrency(1024, 200, 128) == 4.0
    arch = model_catalog()["llama-2-13b"].spec.arch
    total = 26_000_000_000
    assert weights_per_device(total, arch, 2, 1, 2) == total // 2
