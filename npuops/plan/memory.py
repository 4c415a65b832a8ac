"""Device memory arithmetic: weights, KV cache per token, activation and graph reserves, KV capacity.

The KV capacity follows vLLM's own computation (vllm/v1/core/kv_cache_utils.py): one page holds `block_size`
tokens of one layer, `num_blocks = budget // page_bytes // num_layers`, and the engine reports
`num_blocks * block_size` tokens. On the CPU engine the budget is exactly --kv-cache-memory-bytes, so the
number is exact there; on an NPU the budget is an estimate of what the profile run leaves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from npuops.plan.constants import MemoryConstants
from npuops.plan.model import ModelArch

GIB = 2**30
MIB = 2**20


def kv_heads_per_device(arch: ModelArch, tp: int) -> int:
    """KV heads one device stores: split over TP, replicated once TP exceeds the KV heads (vLLM's rule)."""
    return max(1, arch.num_kv_heads // tp)


def layers_per_stage(arch: ModelArch, pp: int) -> int:
    # vLLM gives the first stages the remainder; the largest stage bounds memory.
    return math.ceil(arch.num_layers / pp)


def kv_page_bytes_per_layer(arch: ModelArch, block_size: int, kv_dtype_bytes: float, tp: int) -> int:
    """Bytes of one KV block of one layer on one device (vLLM's KVCacheSpec.page_size_bytes).

    Standard attention stores K and V per KV head; MLA stores one latent vector (kv_lora_rank) plus the RoPE
    key (qk_rope_head_dim) per token, shared by all heads, so TP does not split it.
    """
    if arch.is_mla:
        return int(block_size * (arch.kv_lora_rank + arch.qk_rope_head_dim) * kv_dtype_bytes)
    return int(2 * block_size * kv_heads_per_device(arch, tp) * arch.head_dim * kv_dtype_bytes)


def kv_bytes_per_token(arch: ModelArch, kv_dtype_bytes: float, tp: int = 1, pp: int = 1) -> int:
    """KV bytes one token costs on one device (the KV-cache layers of its pipeline stage).

    Only layers with a per-token KV cache count: a hybrid model's linear-attention layers keep a fixed-size
    state per sequence instead (arch.kv_cache_layers). The stage bound assumes them spread evenly.
    """
    return kv_page_bytes_per_layer(arch, 1, kv_dtype_bytes, tp) * math.ceil(arch.kv_cache_layers / pp)


def kv_cache_tokens(
    budget_bytes: int, arch: ModelArch, block_size: int, kv_dtype_bytes: float, tp: int, pp: int
) -> int:
    """Tokens the KV cache holds, computed the way vLLM does: whole blocks of whole layers."""
    if budget_bytes <= 0:
        return 0
    page = kv_page_bytes_per_layer(arch, block_size, kv_dtype_bytes, tp)
    num_blocks = budget_bytes // page // math.ceil(arch.kv_cache_layers / pp)
    return int(num_blocks * block_size)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def max_concurrency(kv_tokens: int, request_len: int, block_size: int) -> float:
    """Requests of `request_len` tokens the KV cache holds at once (vLLM's 'Maximum concurrency')."""
    if request_len <= 0:
        return 0.0
    return kv_tokens / (blocks_for(request_len, block_size) * block_size)


def weights_per_device(total_weight_bytes: int, arch: ModelArch, tp: int, pp: int, weight_dtype_bytes: float) -> int:
    """Weight bytes on one device: split over TP x PP, plus the K/V projections TP has to replicate."""
    per_device = total_weight_bytes / (tp * pp)
    if not arch.is_mla and tp > arch.num_kv_heads:
        # Each device keeps one KV head's projections where an even split would give it a fraction of one.
        kv_proj = 2 * arch.hidden_size * arch.head_dim * weight_dtype_bytes * layers_per_stage(arch, pp)
        per_device += kv_proj * (1 - arch.num_kv_heads / tp)
    return int(per_device)


def weights_per_device_ep(
    total_weight_bytes: int, arch: ModelArch, tp: int, ep: int, weight_dtype_bytes: float, expert_fraction: float
) -> int:
    """Weight bytes on one device with expert parallel: the routed experts spread whole over `ep` devices, the
    rest (attention, dense layers, shared experts, embeddings) split over TP and replicated on every DP rank."""
    experts = total_weight_bytes * expert_fraction
    rest = int(total_weight_bytes - experts)
    return int(weights_per_device(rest, arch, tp, 1, weight_dtype_bytes) + experts / max(1, ep))


def activation_peak_bytes(
    arch: ModelArch, max_num_batched_tokens: int, max_num_seqs: int, tp: int, act_dtype_bytes: float, c: MemoryConstants
) -> int:
    """Peak activation memory of vLLM's profile run at max_num_batched_tokens (one forward plus the sampler)."""
    if arch.is_moe:
        ffn = max(arch.intermediate_size, arch.num_experts_per_tok * arch.moe_intermediate_size)
    else:
        ffn = arch.intermediate_size
    qkv = (arch.num_attention_heads + 2 * arch.num_kv_heads) * arch.head_dim
    per_token = act_dtype_bytes * (c.activation_hidden_factor * arch.hidden_size + (2 * ffn + qkv) / tp)
    # The sampler keeps fp32 logits plus a few same-sized temporaries for every running sequence.
    sampler = c.sampler_logit_copies * 4 * max_num_seqs * arch.vocab_size / tp
    return int(max_num_batched_tokens * per_token + sampler)


def graph_reserve_bytes(capture_sizes: tuple[int, ...], c: MemoryConstants) -> int:
    if not capture_sizes:
        return 0
    return int(c.graph_base_bytes + c.graph_per_size_bytes * len(capture_sizes))


def runtime_overhead_bytes(tp: int, hccl_buffsize_mb: int, c: MemoryConstants) -> int:
    """An NPU's memory outside PyTorch's allocator: the runtime itself, plus HCCL's send/receive buffers when the
    device takes part in collectives (TP > 1)."""
    hccl = 2 * hccl_buffsize_mb * MIB if tp > 1 else 0
    return int(c.npu_runtime_bytes + hccl)


@dataclass(frozen=True)
class MemoryBudget:
    """One device's memory, as the plan spends it."""

    device_bytes: int
    usable_bytes: int  # device_bytes x visible fraction x gpu_memory_utilization (or the CPU KV budget)
    weights_bytes: int
    activation_bytes: int
    graph_bytes: int
    runtime_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_token: int
    kv_cache_tokens: int

    @property
    def fits(self) -> bool:
        return self.kv_budget_bytes > 0 and self.kv_cache_tokens > 0
