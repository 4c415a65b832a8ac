"""load_model: real published configs, tiny model directories with real safetensors files, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npuops.errors import BadInputError
from npuops.plan.catalog import load_model
from npuops.plan.model import count_parameters, safetensors_tensor_bytes, weight_bytes_from_arch
from tests.support.model_dirs import TINY_LLAMA, tiny_tensors, write_safetensors
from tests.support.paths import MODEL_FIXTURES


@pytest.mark.parametrize("name", ["qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b"])
def test_published_configs_load_like_the_catalog(name: str) -> None:
    spec = load_model(str(MODEL_FIXTURES / name))
    assert not spec.weights_present
    assert spec.weight_bytes_source == "architecture"
    catalog = load_model(name)
    assert spec.arch == catalog.arch
    assert spec.weight_bytes == catalog.weight_bytes


def test_qwen3_30b_is_moe_with_every_layer_sparse() -> None:
    arch = load_model(str(MODEL_FIXTURES / "qwen3-30b-a3b")).arch
    assert (arch.num_experts, arch.num_experts_per_tok, arch.num_moe_layers) == (128, 8, 48)


def test_safetensors_header_is_summed(tiny_model_dir: Path) -> None:
    expected = 4 * count_parameters(load_model(str(tiny_model_dir)).arch).total
    assert safetensors_tensor_bytes(tiny_model_dir / "model.safetensors") == expected
    spec = load_model(str(tiny_model_dir))
    assert spec.weights_present and spec.weight_bytes == expected and spec.weight_bytes_source == "safetensors"
    assert spec.served_name == "tiny-llama"


def test_index_total_size_wins(tmp_path: Path) -> None:
    directory = tmp_path / "sharded"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    tensors = tiny_tensors(TINY_LLAMA, "BF16")
    names = sorted(tensors)
    half = len(names) // 2
    shard_a = write_safetensors(directory / "model-00001-of-00002.safetensors", {n: tensors[n] for n in names[:half]})
    shard_b = write_safetensors(directory / "model-00002-of-00002.safetensors", {n: tensors[n] for n in names[half:]})
    weight_map = {n: "model-00001-of-00002.safetensors" for n in names[:half]}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in names[half:]})
    index = {"metadata": {"total_size": shard_a + shard_b}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    spec = load_model(str(directory))
    assert spec.weight_bytes == shard_a + shard_b and spec.weight_bytes_source == "index" and spec.weights_present
    # The index alone (shards not downloaded) still gives the size, but says the weights are missing.
    (directory / "model-00002-of-00002.safetensors").unlink()
    spec = load_model(str(directory))
    assert spec.weight_bytes == shard_a + shard_b and not spec.weights_present


def test_text_config_nesting(tmp_path: Path) -> None:
    directory = tmp_path / "vl"
    directory.mkdir()
    cfg = {
        "architectures": ["SomeVLForConditionalGeneration"],
        "model_type": "vl",
        "text_config": dict(TINY_LLAMA),
        "vision_config": {"hidden_size": 32},
    }
    (directory / "config.json").write_text(json.dumps(cfg))
    assert load_model(str(directory)).arch.hidden_size == 64


def test_quantization_from_config_and_flag(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({**TINY_LLAMA, "quantization_config": {"quant_method": "w8a8"}}))
    spec = load_model(str(directory))
    assert spec.quantization == "W8A8" and spec.quantization_source == "config"
    flagged = load_model("qwen3-8b", "w4a8")
    plain = load_model("qwen3-8b")
    assert flagged.quantization == "W4A8_DYNAMIC"  # the alias operators write
    assert flagged.weight_bytes is not None and plain.weight_bytes is not None
    # Linear weights drop to half a byte; embeddings and LM head stay bf16.
    assert flagged.weight_bytes < 0.4 * plain.weight_bytes
    arch = plain.arch
    assert weight_bytes_from_arch(arch, "bfloat16", "W8A8") < weight_bytes_from_arch(arch, "bfloat16")


def test_modelslim_description_is_read(tmp_path: Path) -> None:
    directory = tmp_path / "slim"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    (directory / "quant_model_description.json").write_text(json.dumps({"model_quant_type": "W8A8"}))
    assert load_model(str(directory)).quantization == "W8A8"


def test_quantization_flag_on_unquantized_weights_is_noted(tiny_model_dir: Path) -> None:
    spec = load_model(str(tiny_model_dir), "W8A8")
    assert spec.quantization == "W8A8" and spec.weight_bytes_source == "architecture"
    assert any("ModelSlim" in n for n in spec.notes)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "does not exist"),
        ("empty", "no config.json"),
        ("malformed", "not valid JSON"),
        ("not_lm", "num_hidden_layers"),
        ("bad_value", "non-negative integer"),
        ("bad_safetensors", "safetensors"),
    ],
)
def test_bad_directories(tmp_path: Path, setup: str, message: str) -> None:
    directory = tmp_path / "m"
    if setup != "missing":
        directory.mkdir()
    if setup == "malformed":
        (directory / "config.json").write_text("{not json")
    elif setup == "not_lm":
        (directory / "config.json").write_text(json.dumps({"model_type": "bert-ish"}))
    elif setup == "bad_value":
        (directory / "config.json").write_text(json.dumps({**TINY_LLAMA, "hidden_size": "big"}))
    elif setup == "bad_safetensors":
        (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
        (directory / "model.safetensors").write_bytes(b"\x05\x00")
    ref = str(directory) if setup != "missing" else str(tmp_path / "nope" / "model")
    with pytest.raises(BadInputError) as info:
        load_model(ref)
    assert message in info.value.one_line()
    assert info.value.fix


def test_unknown_catalog_name_lists_close_names() -> None:
    with pytest.raises(BadInputError) as info:
        load_model("qwen3-9b")
    assert "qwen3-8b" in info.value.one_line()


def test_unknown_quantization_flag() -> None:
    with pytest.raises(BadInputError, match="unknown quantization"):
        load_model("qwen3-8b", "int3")


def test_file_is_not_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{}")
    with pytest.raises(BadInputError, match="is a file"):
        load_model(str(path))
