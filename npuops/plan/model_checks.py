"""What a model directory holds that the engine would fail on minutes into its start, found when it is planned:
launch refuses it, plan warns (npuops.plan.model)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A tokenizer vLLM can load: the fast tokenizer's file, a SentencePiece or tiktoken model, or a BPE vocabulary.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "tokenizer.tiktoken",
                   "qwen.tiktoken")


def directory_problems(directory: Path, raw: Mapping[str, Any], architectures: tuple[str, ...]
                       ) -> list[tuple[str, str]]:
    """What the engine would fail on minutes into its start, found in config.json now (problem, fix): launch
    refuses these, plan warns."""
    problems = []
    if not architectures:
        problems.append((f"{directory}/config.json names no architectures, so vLLM cannot choose a model class",
                         'add the list the original config.json has, e.g. "architectures": ["LlamaForCausalLM"]'))
    if "quantization_config" in raw and not isinstance(raw["quantization_config"], Mapping):
        problems.append((f"{directory}/config.json: quantization_config is not a JSON object",
                         "restore the checkpoint's own config.json, or remove quantization_config if the weights "
                         "are not quantized"))
    return problems


def tokenizer_notes(directory: Path, weights_present: bool) -> list[str]:
    """A download that stopped after the weights: the engine would fail on its tokenizer minutes in. (A directory
    with config.json alone is for planning; its own note says the weights are not there.)"""
    if not weights_present or any((directory / name).is_file() for name in TOKENIZER_FILES):
        return []
    return [f"{directory} has weights but no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...); fix: copy "
            "them from the model's source next to config.json before launching"]
