"""What the planner knows about a model: its architecture, its weight bytes and its quantization.

A model comes either from a local Hugging Face directory (config.json, plus whatever weights are there) or
from the catalog shipped in npuops/data/models. Both go through `arch_from_config`, so a catalog entry and a
downloaded model of the same name give the same architecture.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError
from npuops.plan.model_checks import directory_problems, tokenizer_notes
from npuops.plan.quantization import (
    FLAG,
    CheckpointQuantization,
    normalise_quantization,
    quantizes_experts_only,
    read_modelslim_description,
    read_quantization_config,
    weight_bytes_per_element,
)
from npuops.wire import loads_json

# Bytes per element for the dtype names config.json and safetensors use.
DTYPE_BYTES: dict[str, float] = {
    **dict.fromkeys(("float32", "float", "fp32", "f32", "int32", "i32", "u32"), 4),
    **dict.fromkeys(("bfloat16", "bf16", "float16", "half", "fp16", "f16", "int16", "i16"), 2),
    **dict.fromkeys(("float8_e4m3fn", "float8_e5m2", "f8_e4m3", "f8_e5m2", "int8", "i8", "u8", "uint8", "bool"), 1),
    **dict.fromkeys(("int64", "i64", "f64", "float64"), 8),
}

# A safetensors header above this is not a real checkpoint; reading it would only waste memory.
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class ModelArch:
    """Architecture facts of a decoder-only LM, independent of where they were read from."""

    model_type: str
    architectures: tuple[str, ...]
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    torch_dtype: str
    qkv_bias: bool = False
    # MoE: routed experts (0 for a dense model), experts per token, per-expert FFN width, shared experts.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0
    # MLA (DeepSeek): the KV cache holds the compressed latent plus the RoPE key, not per-head K and V.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # DSA (DeepSeek-V3.2, GLM-5): each layer's lightning indexer (its own small query heads and one key head).
    index_n_heads: int = 0
    index_head_dim: int = 0
    # Hybrid attention (Qwen3-Next, Qwen3.5): Gated DeltaNet layers keep a fixed-size state per sequence instead
    # of a per-token KV cache; the other layers are full attention, whose output a sigmoid gate may scale
    # (attn_output_gate: q_proj produces the gate beside the query).
    num_linear_layers: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    attn_output_gate: bool = False
    # Multi-token-prediction layers shipped beside the main model (speculative decoding only; not counted in
    # count_parameters, see mtp_layer_parameters).
    mtp_layers: int = 0
    # config.json's auto_map: the checkpoint ships Python code (its config class, tokenizer or model) that
    # transformers and vLLM load only with trust_remote_code.
    ships_code: bool = False
    # Draft models: an EAGLE-3 head's own (reduced) vocabulary, the rows of its LM head (0: the vocab_size); and a
    # parallel-drafting mask token in config.json (PARD's pard_token, ptd_token_id, DFlash's
    # dflash_config.mask_token_id), with which vLLM proposes all k draft tokens in one forward of the draft.
    draft_vocab_size: int = 0
    parallel_draft: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_hybrid(self) -> bool:
        return self.num_linear_layers > 0

    @property
    def kv_cache_layers(self) -> int:
        """Layers that keep a per-token KV cache (all but the linear-attention layers)."""
        return self.num_layers - self.num_linear_layers

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0


@dataclass(frozen=True)
class ParameterCount:
    total: int
    active: int
    # Parameters in linear layers (what W8A8/W4A8 quantize); the rest are embeddings, LM head and norms.
    linear: int
    linear_active: int


def _full_attention_parameters(arch: ModelArch) -> tuple[int, int]:
    """(linear, other) parameters of one full-attention block: MLA or GQA, with a DSA indexer if it has one."""
    h = arch.hidden_size
    if arch.is_mla:
        heads = arch.num_attention_heads
        qk_dim = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        if arch.q_lora_rank:
            q_linear = h * arch.q_lora_rank + arch.q_lora_rank * heads * qk_dim
            q_norm = arch.q_lora_rank
        else:
            q_linear = h * heads * qk_dim
            q_norm = 0
        kv_linear = h * (arch.kv_lora_rank + arch.qk_rope_head_dim) + arch.kv_lora_rank * heads * (
            arch.qk_nope_head_dim + arch.v_head_dim
        )
        o_linear = heads * arch.v_head_dim * h
        linear, other = q_linear + kv_linear + o_linear, q_norm + arch.kv_lora_rank
    else:
        q_out = arch.num_attention_heads * arch.head_dim
        kv_out = arch.num_kv_heads * arch.head_dim
        gate = q_out if arch.attn_output_gate else 0
        linear = h * (q_out + gate) + 2 * h * kv_out + q_out * h
        other = (q_out + 2 * kv_out) if arch.qkv_bias else 0
    if arch.index_n_heads:
        # The indexer's wq_b reads the query latent, wk and weights_proj the hidden state; k_norm is a LayerNorm.
        index_q = arch.index_n_heads * arch.index_head_dim
        linear += (arch.q_lora_rank or h) * index_q + h * arch.index_head_dim + h * arch.index_n_heads
        other += 2 * arch.index_head_dim
    return linear, other


def _linear_attention_parameters(arch: ModelArch) -> tuple[int, int]:
    """(linear, other) parameters of one Gated DeltaNet block (vLLM's Qwen3NextGatedDeltaNet)."""
    if not arch.is_hybrid:
        return 0, 0
    h = arch.hidden_size
    key_dim = arch.linear_num_key_heads * arch.linear_key_head_dim
    value_dim = arch.linear_num_value_heads * arch.linear_value_head_dim
    # in_proj_qkvz (q, k, v and the output gate z), in_proj_ba (beta and alpha per value head), out_proj.
    linear = h * (2 * key_dim + 2 * value_dim) + h * 2 * arch.linear_num_value_heads + value_dim * h
    # The causal conv1d over q, k and v, A_log and dt_bias per value head, the gated RMSNorm.
    conv = (2 * key_dim + value_dim) * arch.linear_conv_kernel_dim
    return linear, conv + 2 * arch.linear_num_value_heads + arch.linear_value_head_dim


def _moe_block_parameters(arch: ModelArch) -> tuple[int, int]:
    """(all, active) linear parameters of one MoE block: routed experts, shared experts and the router."""
    h = arch.hidden_size
    expert = 3 * h * arch.moe_intermediate_size
    shared_width = arch.shared_expert_intermediate_size or arch.num_shared_experts * arch.moe_intermediate_size
    rest = 3 * h * shared_width + h * arch.num_experts
    return arch.num_experts * expert + rest, arch.num_experts_per_tok * expert + rest


def count_parameters(arch: ModelArch) -> ParameterCount:
    """Parameters of the architecture (the main model, without MTP layers), counted as vLLM instantiates them."""
    h = arch.hidden_size
    embed = arch.vocab_size * h
    lm_head = 0 if arch.tie_word_embeddings else arch.vocab_size * h
    final_norm = h
    full_linear, full_other = _full_attention_parameters(arch)
    gdn_linear, gdn_other = _linear_attention_parameters(arch)
    attn_linear = full_linear * arch.kv_cache_layers + gdn_linear * arch.num_linear_layers
    attn_other = full_other * arch.kv_cache_layers + gdn_other * arch.num_linear_layers

    layer_norms = 2 * h
    dense_mlp = 3 * h * arch.intermediate_size
    dense_layers = arch.num_layers - arch.num_moe_layers

    total_linear = active_linear = attn_linear + dense_mlp * dense_layers
    other = attn_other + layer_norms * arch.num_layers + embed + lm_head + final_norm
    if arch.is_moe:
        moe_all, moe_active = _moe_block_parameters(arch)
        total_linear += moe_all * arch.num_moe_layers
        active_linear += moe_active * arch.num_moe_layers
    return ParameterCount(
        total=total_linear + other,
        active=active_linear + other,
        linear=total_linear,
        linear_active=active_linear,
    )


def mtp_layer_parameters(arch: ModelArch) -> ParameterCount:
    """Parameters of one MTP layer, as a speculative-decoding draft adds them to device memory.

    One full-attention decoder layer of the model (MoE if the model is) plus the projection of [embedding;
    hidden state] back to the hidden size (eh_proj / fc, 2h x h) and its norms (the two input norms, the layer's
    two, the head's). vLLM shares the embedding and the LM head with the main model, so they are not counted.
    """
    h = arch.hidden_size
    attn_linear, attn_other = _full_attention_parameters(arch)
    dense_mlp = 3 * h * arch.intermediate_size
    mlp_all, mlp_active = _moe_block_parameters(arch) if arch.is_moe else (dense_mlp, dense_mlp)
    eh_proj = 2 * h * h
    other = attn_other + 5 * h
    return ParameterCount(
        total=attn_linear + mlp_all + eh_proj + other,
        active=attn_linear + mlp_active + eh_proj + other,
        linear=attn_linear + mlp_all + eh_proj,
        linear_active=attn_linear + mlp_active + eh_proj,
    )


def dtype_bytes(dtype: str) -> float:
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise BadInputError(f"unknown dtype {dtype!r}", "use one of bfloat16, float16, float32") from None


def weight_bytes_from_arch(arch: ModelArch, dtype: str, quantization: str | None = None) -> int:
    """Bytes the weights take in memory: quantized linear layers shrink, embeddings and norms do not."""
    return int(_served_bytes(arch, dtype_bytes(dtype), quantization)[0])


def routed_weight_share(arch: ModelArch, act_bytes: float, quantization: str | None) -> float:
    """Share of the served weight bytes that sit in routed experts (what a decode step reads only where routed)."""
    total, routed = _served_bytes(arch, act_bytes, quantization)
    return routed / total if total else 0.0


def _served_bytes(arch: ModelArch, full: float, quantization: str | None) -> tuple[float, float]:
    """(all, routed experts') weight bytes as served. A scheme vllm-ascend has a kernel for in the routed experts
    only (W4A16) leaves attention, dense MLPs and shared experts in the activation dtype: only the experts shrink."""
    params = count_parameters(arch)
    routed = arch.num_moe_layers * arch.num_experts * 3 * arch.hidden_size * arch.moe_intermediate_size
    if quantization is None:
        return params.total * full, routed * full
    per_linear = weight_bytes_per_element(quantization)
    quantized = routed if quantizes_experts_only(quantization) else params.linear
    return quantized * per_linear + (params.total - quantized) * full, routed * per_linear


@dataclass(frozen=True)
class ModelSpec:
    arch: ModelArch
    # Bytes of the weights as they will sit in device memory (None only when nothing allows an estimate).
    weight_bytes: int | None
    weights_present: bool
    quantization: str | None
    path: Path | None
    served_name: str
    # Where weight_bytes came from: "index", "safetensors", "bin", "architecture".
    weight_bytes_source: str = "architecture"
    # Where the quantization came from: "config", "modelslim", "compressed-tensors", "flag", or None
    # (npuops.plan.quantization); ModelSlim and flagged checkpoints are served with --quantization ascend.
    quantization_source: str | None = None
    # "C8" when the checkpoint stores its KV cache in int8 (ModelSlim's kv_cache_type).
    kv_cache_quantization: str | None = None
    # Notes worth a warning in a plan (e.g. an FP8 checkpoint on hardware without FP8).
    notes: tuple[str, ...] = ()
    catalog_name: str | None = None
    # What the engine would fail on minutes into its start, as (problem, fix): a plan warns, a launch refuses.
    launch_problems: tuple[tuple[str, str], ...] = ()

    @property
    def parameters(self) -> ParameterCount:
        return count_parameters(self.arch)


def _bad_config(where: str, problem: str) -> BadInputError:
    return BadInputError(
        f"{where}: {problem}",
        "pass a Hugging Face model directory whose config.json describes a decoder-only language model",
    )


def _int_field(cfg: Mapping[str, Any], keys: tuple[str, ...], where: str, *, required: bool = True) -> int:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            value = cfg[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _bad_config(where, f"{key} must be a non-negative integer, got {value!r}")
            return value
    if required:
        raise _bad_config(where, f"no {' / '.join(keys)} (is this a language model's config.json?)")
    return 0


def _attention_shape(cfg: Mapping[str, Any], where: str) -> tuple[int, int, int, int, int]:
    """(layers, hidden size, attention heads, KV heads, head dim), checked to group."""
    num_layers = _int_field(cfg, ("num_hidden_layers", "num_layers", "n_layer"), where)
    hidden = _int_field(cfg, ("hidden_size", "n_embd", "d_model"), where)
    heads = _int_field(cfg, ("num_attention_heads", "n_head"), where)
    if num_layers == 0 or hidden == 0 or heads == 0:
        raise _bad_config(where, "num_hidden_layers, hidden_size and num_attention_heads must be positive")
    if cfg.get("multi_query_attention") and "multi_query_group_num" in cfg:
        kv_heads = _int_field(cfg, ("multi_query_group_num",), where)
    else:
        kv_heads = _int_field(cfg, ("num_key_value_heads", "num_kv_heads"), where, required=False) or heads
    if kv_heads == 0 or heads % kv_heads != 0:
        raise _bad_config(where, f"{heads} attention heads cannot be grouped over {kv_heads} KV heads")
    head_dim = _int_field(cfg, ("head_dim", "kv_channels"), where, required=False) or hidden // heads
    return num_layers, hidden, heads, kv_heads, head_dim


def _moe_shape(cfg: Mapping[str, Any], where: str, num_layers: int, intermediate: int) -> tuple[int, int, int, int]:
    """(routed experts, experts per token, per-expert FFN width, dense layers); zeros for a dense model."""
    num_experts = _int_field(cfg, ("num_experts", "n_routed_experts", "num_local_experts"), where, required=False)
    experts_per_tok = _int_field(cfg, ("num_experts_per_tok", "moe_topk"), where, required=False)
    moe_inter = _int_field(cfg, ("moe_intermediate_size",), where, required=False) or (
        intermediate if num_experts else 0)
    if not num_experts:
        return 0, 0, moe_inter, 0
    if experts_per_tok == 0 or experts_per_tok > num_experts:
        raise _bad_config(where, f"num_experts_per_tok {experts_per_tok} does not fit {num_experts} experts")
    num_dense = _int_field(cfg, ("first_k_dense_replace",), where, required=False)
    mlp_only = cfg.get("mlp_only_layers") or []
    if isinstance(mlp_only, list):
        num_dense += len(mlp_only)
    step = _int_field(cfg, ("decoder_sparse_step", "moe_layer_freq"), where, required=False) or 1
    if step > 1:
        num_dense = num_layers - math.ceil((num_layers - num_dense) / step)
    return num_experts, experts_per_tok, moe_inter, min(num_dense, num_layers)


_LINEAR_ATTENTION_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                          "linear_value_head_dim", "linear_conv_kernel_dim")


def _linear_attention_layers(cfg: Mapping[str, Any], where: str, num_layers: int) -> int:
    """Gated DeltaNet layers of a hybrid model (0 otherwise): layer_types names them; a config without it has
    every full_attention_interval-th layer full attention (Qwen3-Next's rule)."""
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and "linear_attention" in layer_types:
        if len(layer_types) != num_layers:
            raise _bad_config(where, f"layer_types names {len(layer_types)} layers, num_hidden_layers {num_layers}")
        linear = layer_types.count("linear_attention")
    elif "linear_num_value_heads" in cfg and cfg.get("full_attention_interval") is not None:
        interval = _int_field(cfg, ("full_attention_interval",), where)
        if interval == 0:
            raise _bad_config(where, "full_attention_interval must be positive")
        linear = num_layers - num_layers // interval
    else:
        return 0
    if linear >= num_layers:
        raise _bad_config(where, "no full-attention layer among the linear-attention layers")
    for key in _LINEAR_ATTENTION_KEYS:
        if _int_field(cfg, (key,), where) == 0:
            raise _bad_config(where, f"{key} must be positive in a linear-attention model")
    return linear


def _mtp_layers(cfg: Mapping[str, Any], where: str) -> int:
    """MTP layers: num_nextn_predict_layers (DeepSeek, GLM, Kimi), mtp_num_hidden_layers (Qwen3-Next, Qwen3.5),
    or MiniMax-M2's num_mtp_modules of mtp_transformer_layers each (when use_mtp)."""
    layers = _int_field(cfg, ("num_nextn_predict_layers", "mtp_num_hidden_layers"), where, required=False)
    if layers or not cfg.get("use_mtp", True):
        return layers
    modules = _int_field(cfg, ("num_mtp_modules",), where, required=False)
    return modules * (_int_field(cfg, ("mtp_transformer_layers",), where, required=False) or 1)


def _checkpoint_dtype(cfg: Mapping[str, Any], where: str) -> str:
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if not isinstance(dtype, str) or dtype.lower() not in DTYPE_BYTES:
        raise _bad_config(where, f"unknown torch_dtype {dtype!r}")
    return dtype.lower()


def arch_from_config(raw: Mapping[str, Any], where: str = "config.json") -> ModelArch:
    """Parse a Hugging Face config.json (or a catalog [config] table) into ModelArch.

    Multimodal configs keep the language model under text_config; its keys win over the top level.
    ChatGLM-format configs use their own key names (num_layers, ffn_hidden_size, multi_query_group_num, ...).
    """
    if not isinstance(raw, Mapping):
        raise _bad_config(where, "the top level is not a JSON object")
    cfg: dict[str, Any] = dict(raw)
    text_config = raw.get("text_config")
    if isinstance(text_config, Mapping):
        cfg.update(text_config)
    num_layers, hidden, heads, kv_heads, head_dim = _attention_shape(cfg, where)
    vocab = _int_field(cfg, ("vocab_size", "padded_vocab_size"), where)
    if "padded_vocab_size" in cfg:
        vocab = _int_field(cfg, ("padded_vocab_size",), where)
    intermediate = _int_field(cfg, ("intermediate_size", "ffn_hidden_size", "n_inner"), where,
                              required=False) or 4 * hidden
    max_pos = _int_field(
        cfg, ("max_position_embeddings", "seq_length", "max_sequence_length", "n_positions"), where, required=False)
    model_type = str(cfg.get("model_type", "unknown"))
    architectures = cfg.get("architectures") or ()
    if not isinstance(architectures, (list, tuple)):
        raise _bad_config(where, "architectures must be a list")
    num_experts, experts_per_tok, moe_inter, num_dense = _moe_shape(cfg, where, num_layers, intermediate)
    num_linear = _linear_attention_layers(cfg, where, num_layers)

    def optional(*keys: str) -> int:
        return _int_field(cfg, keys, where, required=False)

    return ModelArch(
        model_type=model_type, architectures=tuple(str(a) for a in architectures), num_layers=num_layers,
        hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
        intermediate_size=intermediate, max_position_embeddings=max_pos or 2048,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)), torch_dtype=_checkpoint_dtype(cfg, where),
        # Qwen2 hard-codes a QKV bias without a config key; ChatGLM says add_qkv_bias.
        qkv_bias=bool(cfg.get("attention_bias") or cfg.get("add_qkv_bias") or model_type in ("qwen2", "qwen2_moe")),
        num_experts=num_experts, num_experts_per_tok=experts_per_tok, moe_intermediate_size=moe_inter,
        num_shared_experts=optional("n_shared_experts"),
        shared_expert_intermediate_size=optional("shared_expert_intermediate_size"), num_dense_layers=num_dense,
        kv_lora_rank=optional("kv_lora_rank"), q_lora_rank=optional("q_lora_rank"),
        qk_rope_head_dim=optional("qk_rope_head_dim"), qk_nope_head_dim=optional("qk_nope_head_dim"),
        v_head_dim=optional("v_head_dim"),
        index_n_heads=optional("index_n_heads"), index_head_dim=optional("index_head_dim"),
        num_linear_layers=num_linear,
        linear_num_key_heads=optional("linear_num_key_heads") if num_linear else 0,
        linear_num_value_heads=optional("linear_num_value_heads") if num_linear else 0,
        linear_key_head_dim=optional("linear_key_head_dim") if num_linear else 0,
        linear_value_head_dim=optional("linear_value_head_dim") if num_linear else 0,
        linear_conv_kernel_dim=optional("linear_conv_kernel_dim") if num_linear else 0,
        # vLLM's Qwen3-Next attention gates its output unless the config says attn_output_gate false.
        attn_output_gate=bool(cfg.get("attn_output_gate", num_linear > 0)),
        ships_code=isinstance(raw.get("auto_map"), Mapping) and bool(raw.get("auto_map")),
        mtp_layers=_mtp_layers(cfg, where),
        draft_vocab_size=optional("draft_vocab_size"), parallel_draft=_parallel_draft(cfg),
    )


def _parallel_draft(cfg: Mapping[str, Any]) -> bool:
    """Whether a draft model's config carries the mask token vLLM's parallel drafting reads (its proposer checks
    dflash_config.mask_token_id, pard_token and ptd_token_id, in that order)."""
    dflash = cfg.get("dflash_config")
    if isinstance(dflash, Mapping) and "mask_token_id" in dflash:
        return True
    return cfg.get("pard_token") is not None or cfg.get("ptd_token_id") is not None


def safetensors_tensor_bytes(path: Path) -> int:
    """Sum of tensor sizes in one .safetensors file, read from its header only (8-byte length + JSON)."""
    try:
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) != 8:
                raise _bad_config(str(path), "shorter than a safetensors header")
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_SAFETENSORS_HEADER:
                raise _bad_config(str(path), f"safetensors header claims {length} bytes")
            header_bytes = f.read(length)
    except OSError as exc:
        raise BadInputError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from None
    if len(header_bytes) != length:
        raise _bad_config(str(path), "safetensors header is truncated")
    try:
        header = loads_json(header_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _bad_config(str(path), "safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise _bad_config(str(path), "safetensors header is not a JSON object")
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or offsets[1] < offsets[0]
        ):
            raise _bad_config(str(path), f"tensor {name!r} has no valid data_offsets")
        total += offsets[1] - offsets[0]
    return total


def _read_json(path: Path, what: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInputError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from None
    except UnicodeDecodeError:
        raise _bad_config(str(path), f"{what} is not UTF-8 text") from None
    try:
        return loads_json(text)
    except json.JSONDecodeError as exc:
        raise BadInputError(
            f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})",
            f"restore {what} from the model's published files",
        ) from None


def _weights_on_disk(directory: Path) -> tuple[int | None, str, bool]:
    """(bytes, source, all weight files present) from the index, the safetensors headers or .bin sizes."""
    index_path = directory / "model.safetensors.index.json"
    if index_path.is_file():
        index = _read_json(index_path, "model.safetensors.index.json")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        shards = set(weight_map.values()) if isinstance(weight_map, dict) else set()
        present = bool(shards) and all((directory / str(s)).is_file() for s in shards)
        metadata = index.get("metadata") if isinstance(index, dict) else None
        total = metadata.get("total_size") if isinstance(metadata, dict) else None
        if isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0:
            return int(total), "index", present
        if present:
            return sum(safetensors_tensor_bytes(directory / str(s)) for s in sorted(shards)), "safetensors", True
    files = sorted(directory.glob("*.safetensors"))
    if files:
        return sum(safetensors_tensor_bytes(f) for f in files), "safetensors", True
    bins = sorted(directory.glob("pytorch_model*.bin"))
    if bins:
        return sum(f.stat().st_size for f in bins), "bin", True
    return None, "architecture", False


def _checkpoint_quantization(directory: Path, raw: Mapping[str, Any]) -> CheckpointQuantization:
    """config.json's quantization_config first (LLM-Compressor, or a method in config.json), else ModelSlim's
    quant_model_description.json beside the weights."""
    found = read_quantization_config(raw)
    description = directory / "quant_model_description.json"
    if found.scheme is None and description.is_file():
        slim = read_modelslim_description(_read_json(description, "quant_model_description.json"), str(description))
        if slim.scheme is not None or slim.kv_cache is not None:
            return slim
    return found


def model_from_directory(directory: Path, quantization: str | None) -> ModelSpec:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise BadInputError(
            f"{directory} has no config.json, so it is not a Hugging Face model directory",
            "pass the directory that holds config.json (download at least config.json), or a catalog name",
        )
    raw = _read_json(config_path, "config.json")
    if not isinstance(raw, dict):
        raise _bad_config(str(config_path), "the top level is not a JSON object")
    arch = arch_from_config(raw, str(config_path))

    notes: list[str] = []
    found = _checkpoint_quantization(directory, raw)
    quant, quant_source = found.scheme, found.source
    if found.unsupported_method:
        notes.append(
            f"the checkpoint is quantized with {found.unsupported_method!r}, which vllm-ascend does not run on "
            "A2/A3/310P; convert it to bfloat16 or quantize it with ModelSlim (W8A8/W8A8_DYNAMIC/W4A8_DYNAMIC)"
        )

    bytes_on_disk, source, present = _weights_on_disk(directory)
    problems = directory_problems(directory, raw, arch.architectures)
    notes += [f"{problem}; fix: {fix}" for problem, fix in problems] + tokenizer_notes(directory, present)
    if quantization is not None:
        wanted = normalise_quantization(quantization)
        if quant is not None and wanted != quant:
            notes.append(f"--quantization {wanted} overrides the checkpoint's {quant}")
        if quant is None or wanted != quant:
            # The files on disk are not in this format: plan from the architecture and say what to do.
            if present:
                notes.append(
                    f"the weights in {directory} are not {wanted}; quantize them with ModelSlim before serving"
                )
            quant, quant_source = wanted, FLAG
            bytes_on_disk, source = None, "architecture"

    weight_bytes = bytes_on_disk
    if weight_bytes is None:
        weight_bytes = weight_bytes_from_arch(arch, arch.torch_dtype, quant)
        source = "architecture"
    return ModelSpec(
        arch=arch,
        weight_bytes=weight_bytes,
        weights_present=present,
        quantization=quant,
        path=directory,
        served_name=directory.name,
        weight_bytes_source=source,
        quantization_source=quant_source,
        kv_cache_quantization=found.kv_cache,
        notes=tuple(notes),
        launch_problems=tuple(problems),
    )
