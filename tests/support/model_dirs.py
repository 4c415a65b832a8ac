"""Helpers that write small Hugging Face model directories for tests."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

# The tiny model of tests/engine/README.md (LlamaConfig hidden 64, 2 layers, 2 heads, 2 KV heads, head_dim 32).
TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "vocab_size": 1024,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """A real safetensors file: 8-byte header length, JSON header, then zero bytes for every tensor."""
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "I8": 1}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * sizes[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)
    return offset


def tiny_tensors(cfg: dict[str, Any], dtype: str = "F32") -> dict[str, tuple[str, list[int]]]:
    h, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    tensors: dict[str, tuple[str, list[int]]] = {
        "model.embed_tokens.weight": (dtype, [v, h]),
        "lm_head.weight": (dtype, [v, h]),
        "model.norm.weight": (dtype, [h]),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"{p}.self_attn.{proj}.weight"] = (dtype, [h, h])
        tensors[f"{p}.mlp.gate_proj.weight"] = (dtype, [inter, h])
        tensors[f"{p}.mlp.up_proj.weight"] = (dtype, [inter, h])
        tensors[f"{p}.mlp.down_proj.weight"] = (dtype, [h, inter])
        tensors[f"{p}.input_layernorm.weight"] = (dtype, [h])
        tensors[f"{p}.post_attention_layernorm.weight"] = (dtype, [h])
    return tensors


def write_tiny_model(directory: Path) -> Path:
    """config.json plus one real model.safetensors of TINY_LLAMA in a new `directory`."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    write_safetensors(directory / "model.safetensors", tiny_tensors(TINY_LLAMA))
    return directory
