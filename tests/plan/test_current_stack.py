"""Plans that speak today's vllm-ascend: quantization schemes, speculative decoding, additional_config, newer rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npuops.errors import BadInputError
from npuops.plan.additional_config import check_keys, config_keys
from npuops.plan.catalog import load_model
from npuops.plan.constants import perf_constants
from npuops.plan.environment import default_release, known_releases, parse_release
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.model import ModelSpec, arch_from_config, count_parameters, routed_weight_share
from npuops.plan.performance import prefill_s
from npuops.plan.planner import make_plan
from npuops.plan.quantization import (
    COMPRESSED_TENSORS,
    check_runs,
    kv_cache_schemes,
    normalise_quantization,
    read_modelslim_description,
    read_quantization_config,
    schemes,
)
from npuops.plan.speculative import (
    capture_sizes_for,
    eagle3_head_parameters,
    eagle_head_parameters,
    expected_acceptance,
    parse_speculative,
    require_draft_on_disk,
    spec_methods,
    usual_draft_head,
)
from npuops.plan.target import parse_hardware_spec
from tests.support.npuops_cli import npuops as run_cli

A2 = parse_hardware_spec("910B3x8")
LOAD = Workload(1024, 256, concurrency=16)
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": 256, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}


# --- quantization ---------------------------------------------------------------------------------------------------

def test_every_registered_scheme_has_bytes_chips_and_releases() -> None:
    names = set(schemes())
    assert {"W8A8", "W8A8_DYNAMIC", "W8A8_MIX", "W8A16", "W4A16", "W4A8_DYNAMIC", "W4A4_DYNAMIC", "W8A8SC",
            "W8A8_MXFP8", "W4A8_MXFP", "W4A4_MXFP4", "W4A16_MXFP4", "W8A8FP8_DYNAMIC"} <= names
    for scheme in schemes().values():
        assert 0.25 < scheme.weight_bytes <= 1.1 and scheme.families and scheme.why
        for release in scheme.families.values():
            parse_release(release)
    assert kv_cache_schemes()["C8"].bytes == 1.0
    assert normalise_quantization("w4a8") == "W4A8_DYNAMIC" and normalise_quantization("w8a8s") == "W8A8SC"


@pytest.mark.parametrize(("scheme", "family", "release", "moe", "message", "fix"), [
    ("W8A8SC", "A2", "0.23.0", False, "does not run on A2", "W8A8"),
    ("W8A8_MXFP8", "A3", "0.23.0", True, "Ascend 950", "W8A8_DYNAMIC"),
    ("W8A8", "310P", "0.13.0", False, "needs vllm-ascend 0.15.0rc1", "--vllm-ascend-version 0.15.0rc1"),
    ("W4A16", "A2", "0.23.0", False, "MoE experts", "W8A8"),
    ("W4A8_DYNAMIC", "A2", "0.27.1rc1", False, "removed its dense kernel", "W8A8"),
])
def test_a_scheme_the_target_cannot_run_is_refused_with_what_would(scheme: str, family: str, release: str,
                                                                   moe: bool, message: str, fix: str) -> None:
    with pytest.raises(BadInputError) as caught:
        check_runs(scheme, family, release, moe)
    assert message in caught.value.problem and fix in caught.value.fix


def test_schemes_that_run() -> None:
    check_runs("W8A8SC", "310P", "0.16.0rc1", False)
    check_runs("W4A8_DYNAMIC", "A2", "0.23.0", False)  # dense W4A8 until 0.27.1rc1
    check_runs("W4A8_DYNAMIC", "A3", "0.30.0rc2", True)


def test_the_cli_refuses_a_wrong_scheme_in_one_line() -> None:
    result = run_cli("plan", "qwen3-8b", "--hardware", "910B3x8", "--quantization", "W8A8SC")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "W8A8SC" in lines[0] and "310P" in lines[0]


def test_a_modelslim_checkpoint_with_an_int8_kv_cache(tmp_path: Path) -> None:
    # The description's keys as ModelSlim writes them (vllm_ascend/quantization/modelslim_config.py reads
    # model_quant_type, one type per tensor, and kv_cache_type "C8").
    directory = tmp_path / "slim"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    description = {"model_quant_type": "W8A8", "kv_cache_type": "C8", "model.embed_tokens.weight": "FLOAT",
                   "model.layers.0.self_attn.q_proj.weight": "W8A8",
                   "model.layers.0.self_attn.k_proj.kv_cache_scale": "W8A8"}
    (directory / "quant_model_description.json").write_text(json.dumps(description))
    model = load_model(str(directory))
    assert model.quantization == "W8A8" and model.quantization_source == "modelslim"
    assert model.kv_cache_quantization == "C8"
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    (plain_dir / "config.json").write_text(json.dumps(TINY_LLAMA))
    c8 = make_plan(model, A2, Workload(512, 128))
    bf16 = make_plan(load_model(str(plain_dir)), A2, Workload(512, 128))
    assert c8.server.quantization == "ascend"
    assert c8.memory.kv_bytes_per_token * 2 == bf16.memory.kv_bytes_per_token
    assert c8.explanation("kv_cache_quantization").value == "C8"


def test_the_c8_cache_is_refused_before_its_release(tmp_path: Path) -> None:
    directory = tmp_path / "slim"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    (directory / "quant_model_description.json").write_text(json.dumps({"model_quant_type": "W8A8",
                                                                         "kv_cache_type": "C8"}))
    with pytest.raises(BadInputError, match=r"0\.18\.0rc1"):
        make_plan(load_model(str(directory)), A2, Workload(512, 128), PlanOptions(vllm_ascend_version="0.13.0"))


def test_a_mixed_modelslim_description_names_its_schemes() -> None:
    found = read_modelslim_description({"model.layers.0.mlp.experts.0.gate_proj.weight": "W4A8_DYNAMIC",
                                        "model.layers.0.mlp.experts.1.gate_proj.weight": "W4A8_DYNAMIC",
                                        "model.layers.0.self_attn.q_proj.weight": "W8A8_DYNAMIC"})
    assert found.scheme == "W4A8_DYNAMIC" and dict(found.mix) == {"W4A8_DYNAMIC": 2, "W8A8_DYNAMIC": 1}
    with pytest.raises(BadInputError, match="does not register"):
        read_modelslim_description({"model_quant_type": "NF4"})


def test_an_llm_compressor_checkpoint_needs_no_flag(tmp_path: Path) -> None:
    # compressed-tensors' config as LLM-Compressor writes it (vllm_ascend/quantization/compressed_tensors_config.py
    # detects dynamic per-token int8 activations with int8 channel weights as W8A8_DYNAMIC).
    qc = {"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "dynamic": False, "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True,
                              "symmetric": True}}}}
    found = read_quantization_config({"quantization_config": qc})
    assert found.scheme == "W8A8_DYNAMIC" and found.source == COMPRESSED_TENSORS
    directory = tmp_path / "ct"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({**TINY_LLAMA, "quantization_config": qc}))
    plan = make_plan(load_model(str(directory)), A2, Workload(512, 128))
    assert plan.model.quantization == "W8A8_DYNAMIC" and plan.server.quantization is None
    assert "compressed-tensors" in plan.explanation("quantization").why


def test_gptq_is_noted_as_not_running_on_ascend() -> None:
    found = read_quantization_config({"quantization_config": {"quant_method": "gptq", "bits": 4}})
    assert found.scheme is None and found.unsupported_method == "gptq"


def test_an_expert_only_scheme_shrinks_only_the_routed_experts() -> None:
    """W4A16 has a kernel for the routed experts only (quantization.toml): attention, the dense layer and the shared
    expert stay bf16, so the model is larger than an all-linear 4-bit scheme would make it, and its experts a
    smaller share of its bytes than of its parameters."""
    arch = load_model("kimi-k2-instruct").arch
    counts = count_parameters(arch)
    routed = arch.num_moe_layers * arch.num_experts * 3 * arch.hidden_size * arch.moe_intermediate_size
    w4a16 = load_model("kimi-k2-instruct", "W4A16").weight_bytes
    assert w4a16 == int(routed * 0.5 + (counts.total - routed) * 2)
    assert w4a16 > load_model("kimi-k2-instruct", "W4A8_DYNAMIC").weight_bytes  # that one quantizes all linears
    assert routed_weight_share(arch, 2, "W4A16") < routed / counts.total == routed_weight_share(arch, 2, None)
    assert routed_weight_share(load_model("qwen3-8b").arch, 2, "W8A8") == 0.0


def test_int8_activations_compute_at_the_int8_rate() -> None:
    """W8A8 runs its linear matmuls on the int8 path (twice the fp16 rate); weight-only W8A16 computes in bf16."""
    work = Workload(8192, 64)
    w8a8 = make_plan(load_model("qwen3-32b", "W8A8"), A2, work, PlanOptions(tp=8))
    w8a16 = make_plan(load_model("qwen3-32b", "W8A16"), A2, work, PlanOptions(tp=8))
    assert w8a8.perf.linear_speedup == 2.0 and w8a16.perf.linear_speedup == 1.0
    assert w8a8.memory.weights_bytes == w8a16.memory.weights_bytes  # the same bytes: only the compute differs
    c = perf_constants()
    assert prefill_s(w8a8.perf, c) < 0.75 * prefill_s(w8a16.perf, c)


# --- speculative decoding -------------------------------------------------------------------------------------------

def test_the_plan_takes_the_mtp_layers_a_checkpoint_ships() -> None:
    model = load_model("deepseek-v3", "W8A8_DYNAMIC")
    plan = make_plan(model, parse_hardware_spec("Ascend910x16"), LOAD)
    spec = plan.speculative
    assert spec is not None and spec.method == "mtp" and spec.num_tokens == 1 and spec.chosen_by_plan
    assert plan.server.speculative_config == {"method": "mtp", "num_speculative_tokens": 1}
    sizes = plan.server.compilation_config["cudagraph_capture_sizes"]
    assert all(size % 2 == 0 for size in sizes) and max(sizes) == plan.server.max_num_seqs * 2
    off = make_plan(model, parse_hardware_spec("Ascend910x16"), LOAD, PlanOptions(speculative="none"))
    assert off.speculative is None and off.server.speculative_config is None
    # The MTP layer's weights and KV are in the memory plan; the tokens per step in the prediction.
    assert plan.memory.weights_bytes > off.memory.weights_bytes
    assert plan.memory.kv_bytes_per_token > off.memory.kv_bytes_per_token
    assert plan.prediction.tpot_ms < off.prediction.tpot_ms


def test_an_older_release_gets_the_older_mtp_name() -> None:
    model = load_model("deepseek-v3", "W8A8_DYNAMIC")
    plan = make_plan(model, parse_hardware_spec("910B3x16", nodes=1), LOAD,
                     PlanOptions(speculative="mtp", vllm_ascend_version="0.11.0"))
    assert plan.server.speculative_config == {"method": "deepseek_mtp", "num_speculative_tokens": 1}


@pytest.mark.parametrize(("model", "options", "message"), [
    ("qwen3-8b", {"speculative": "mtp"}, "ships no MTP layers"),
    ("qwen3-8b", {"speculative": "draft_model"}, "--draft-model"),  # a draft model has no usual shape
    ("qwen3-8b", {"speculative": "ngram:16"}, "K + 1 <= 16"),
    ("qwen3-8b", {"speculative": "suffix", "vllm_ascend_version": "0.11.0"}, "needs vllm-ascend 0.13.0"),
    ("qwen3-8b", {"speculative": "medusa:x"}, "whole number"),
    ("qwen3-8b", {"speculative": "lookahead"}, "unknown speculative method"),
])
def test_speculation_refusals_are_one_line_with_the_fix(model: str, options: dict[str, str], message: str) -> None:
    with pytest.raises(BadInputError) as caught:
        make_plan(load_model(model), A2, LOAD, PlanOptions(**options))
    assert message in str(caught.value) and caught.value.fix and "\n" not in str(caught.value)


def test_a_draft_model_is_counted_and_the_acceptance_can_be_given() -> None:
    target, draft = load_model("qwen3-32b"), load_model("qwen3-8b")
    plan = make_plan(target, A2, LOAD, PlanOptions(speculative="draft_model:3", draft=draft))
    spec = plan.speculative
    assert spec is not None and spec.draft_weight_bytes == draft.weight_bytes and spec.draft_layers == 36
    assert spec.acceptance == pytest.approx(expected_acceptance(spec_methods()["draft_model"].acceptance, 3))
    low = make_plan(target, A2, LOAD, PlanOptions(speculative="draft_model:3", draft=draft, spec_acceptance=0.1))
    assert low.speculative is not None and low.speculative.acceptance_source == "flag"
    assert low.prediction.tpot_ms > plan.prediction.tpot_ms
    assert "--spec-acceptance" in low.explanation("speculative_config").why


def test_speculation_on_the_cpu_engine_is_ngram_only(tiny_model_dir: Path) -> None:
    from npuops.plan.target import cpu_target

    target = cpu_target(8 << 30, 2, 1)
    plan = make_plan(load_model(str(tiny_model_dir)), target, Workload(64, 64), PlanOptions(speculative="ngram:3"))
    assert plan.server.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    with pytest.raises(BadInputError, match="CPU engine"):
        make_plan(load_model(str(tiny_model_dir)), target, Workload(64, 64), PlanOptions(speculative="mtp"))


def test_parse_speculative_and_capture_sizes() -> None:
    assert parse_speculative("eagle3:3") == ("eagle3", 3) and parse_speculative("deepseek_mtp") == ("mtp", None)
    assert expected_acceptance(0.5, 2) == pytest.approx((0.5 + 0.25) / 2)
    assert capture_sizes_for((1, 2, 4), None, 4) == (1, 2, 4)


# AngelSlim's training config of its Qwen3-8B EAGLE-3 head (Tencent/AngelSlim
# angelslim/compressor/speculative/train/configs/qwen3-8b-eagle3.json @ 1c786f25).
EAGLE3_QWEN3_8B = {"architectures": ["Eagle3LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
                   "head_dim": 128, "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
                   "num_hidden_layers": 1, "num_key_value_heads": 8, "vocab_size": 151936,
                   "max_position_embeddings": 40960, "draft_vocab_size": 32000}


def test_a_parallel_draft_runs_one_forward_for_all_its_tokens() -> None:
    """A draft whose config carries vLLM's parallel-drafting mask token (PARD's pard_token) proposes all k tokens in
    one forward: the plan says parallel_drafting and predicts one forward's cost, not k."""
    base = load_model("llama-3.2-1b")
    assert not base.arch.parallel_draft
    pard = ModelSpec(arch=arch_from_config({**dict(TINY_LLAMA), **_llama_1b_config(), "pard_token": 128020}),
                     weight_bytes=base.weight_bytes, weights_present=False, quantization=None, path=None,
                     served_name="PARD-Llama-3.2-1B")
    assert pard.arch.parallel_draft
    one_stream = Workload(100, 256)
    options = {"speculative": "draft_model:8", "vllm_ascend_version": "0.17.0rc1", "spec_acceptance": 0.3}
    parallel = make_plan(load_model("llama-3.1-8b"), A2, one_stream, PlanOptions(draft=pard, **options))
    sequential = make_plan(load_model("llama-3.1-8b"), A2, one_stream, PlanOptions(draft=base, **options))
    assert parallel.speculative is not None and parallel.speculative.parallel and parallel.perf.draft_parallel
    assert parallel.server.speculative_config is not None
    assert parallel.server.speculative_config["parallel_drafting"] is True
    assert "one forward drafts all K" in parallel.explanation("speculative_config").why
    assert sequential.server.speculative_config is not None
    assert "parallel_drafting" not in sequential.server.speculative_config
    # Eight sequential forwards of the 16-layer draft pay eight times the per-forward cost that one does.
    gap_ms = sequential.prediction.tpot_ms - parallel.prediction.tpot_ms
    assert gap_ms * (1 + 8 * 0.3) > 7 * perf_constants().spec_forward_us / 1e3
    # A block-diffusion method is parallel by itself, without the flag.
    assert spec_methods()["dflash"].parallel and not spec_methods()["eagle3"].parallel
    assert arch_from_config({**TINY_LLAMA, "dflash_config": {"mask_token_id": 7}}).parallel_draft


def _llama_1b_config() -> dict[str, object]:
    arch = load_model("llama-3.2-1b").arch
    return {"hidden_size": arch.hidden_size, "intermediate_size": arch.intermediate_size,
            "num_attention_heads": arch.num_attention_heads, "num_key_value_heads": arch.num_kv_heads,
            "num_hidden_layers": arch.num_layers, "vocab_size": arch.vocab_size, "head_dim": arch.head_dim,
            "tie_word_embeddings": True}


def test_an_eagle3_head_counts_its_own_vocabulary_and_fused_input() -> None:
    """An EAGLE-3 head's LM head has its draft vocabulary (32000 rows, not 151936), its first layer reads
    [embedding; hidden] (2h wide), fc fuses three target layers, and the embedding is the target's."""
    arch = arch_from_config(EAGLE3_QWEN3_8B)
    assert arch.draft_vocab_size == 32000
    h = 4096
    layer = 2 * h * (4096 + 2 * 1024) + 4096 * h + 3 * h * 12288 + 3 * h
    assert eagle3_head_parameters(arch) == 3 * h * h + layer + 32000 * h + h
    head = ModelSpec(arch=arch, weight_bytes=None, weights_present=False, quantization=None, path=None,
                     served_name="AngelSlim/Qwen3-8B_eagle3")
    plan = make_plan(load_model("qwen3-8b"), A2, LOAD, PlanOptions(speculative="eagle3:3", draft=head))
    assert plan.speculative is not None and plan.speculative.draft_layers == 1
    assert plan.speculative.draft_weight_bytes == eagle3_head_parameters(arch) * 2
    assert plan.speculative.draft_weight_bytes < 0.4 * count_parameters(arch).total * 2  # not the full vocab twice


# --- additional_config ----------------------------------------------------------------------------------------------

def test_cpu_binding_replaces_cpu_affinity_conf_on_a2() -> None:
    plan = make_plan(load_model("qwen3-8b"), A2, LOAD)
    assert plan.server.additional_config == {"enable_cpu_binding": True}
    assert "CPU_AFFINITY_CONF" not in plan.env
    old = make_plan(load_model("qwen3-8b"), A2, LOAD, PlanOptions(vllm_ascend_version="0.7.3"))
    assert old.server.additional_config is None  # 0.7.3 has no additional_config key for it
    # 310P cards sit in x86 or ARM hosts: vllm-ascend's ARM binding is not assumed, torch_npu's stays.
    duo = make_plan(load_model("qwen3-8b"), parse_hardware_spec("310P3x2"), LOAD)
    # A 300I DUO host is x86: no CPU binding key, CPU_AFFINITY_CONF instead (its one key turns off npugraph_ex).
    assert "enable_cpu_binding" not in (duo.server.additional_config or {})
    assert duo.env.get("CPU_AFFINITY_CONF") == "1"


def test_moe_with_shared_experts_overlaps_them() -> None:
    plan = make_plan(load_model("deepseek-v3", "W8A8_DYNAMIC"), parse_hardware_spec("Ascend910x16"), LOAD)
    assert plan.server.additional_config["multistream_overlap_shared_expert"] is True
    assert "additional_config.multistream_overlap_shared_expert" in {e.key for e in plan.explanations}


@pytest.mark.parametrize(("settings", "release", "message"), [
    ({"torchair_graph_config": {"enabled": True}}, "0.23.0", "removed in vllm-ascend 0.12.0rc1"),
    ({"enable_flashcomm1": True}, "0.13.0", "arrived in vllm-ascend 0.20.2rc1"),
    ({"enable_cpu_bindings": True}, "0.23.0", "did you mean enable_cpu_binding"),
    ({"enable_cpu_binding": "yes"}, "0.23.0", "takes a bool"),
])
def test_keys_a_release_does_not_read_are_refused(settings: dict[str, object], release: str, message: str) -> None:
    with pytest.raises(BadInputError) as caught:
        check_keys(settings, release)
    assert message in str(caught.value)


def test_a_removed_key_is_fine_for_the_releases_that_had_it() -> None:
    check_keys({"torchair_graph_config": {"enabled": True}}, "0.11.0")
    assert config_keys()["torchair_graph_config"].instead


def test_the_operators_keys_are_rendered_and_explained() -> None:
    plan = make_plan(load_model("qwen3-8b"), A2, LOAD, PlanOptions(additional={"enable_kv_nz": False}))
    assert plan.server.additional_config == {"enable_cpu_binding": True, "enable_kv_nz": False}
    assert plan.explanation("additional_config.enable_kv_nz").why.startswith("as asked")
    result = run_cli("plan", "qwen3-8b", "--hardware", "910B3x8", "--additional-config",
                     '{"ascend_scheduler_config": {}}')
    assert result.returncode != 0 and "0.12.0rc1" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("plan", "qwen3-8b", "--hardware", "910B3x8", "--additional-config", "{not json")
    assert result.returncode != 0 and "not JSON" in result.stderr


def test_the_graph_mode_default_of_the_release_is_explained() -> None:
    plan = make_plan(load_model("qwen3-8b"), A2, LOAD)
    assert "own default is FULL_AND_PIECEWISE" in plan.explanation("compilation_config").why
    old = make_plan(load_model("qwen3-8b"), A2, LOAD, PlanOptions(vllm_ascend_version="0.13.0"))
    assert "own default is PIECEWISE" in old.explanation("compilation_config").why


# --- newer rows -----------------------------------------------------------------------------------------------------

def test_the_newer_releases_are_known_and_the_default_is_the_newest_final() -> None:
    releases = known_releases()
    assert releases[-1] == "0.30.0rc2" and "0.26.0rc1" in releases
    assert [parse_release(r) for r in releases] == sorted(parse_release(r) for r in releases)
    assert default_release() == "0.23.0"
    plan = make_plan(load_model("qwen3-8b"), A2, LOAD, PlanOptions(vllm_ascend_version="0.30.0rc2"))
    assert plan.release == "0.30.0rc2"


def test_provision_takes_the_newest_final_row_of_a_cann() -> None:
    from npuops.provision.run import choose_row

    row = choose_row(None, "9.1.0")
    assert row is not None and row["name"] == "0.23.0"
    rc = choose_row(None, "9.2.0")
    assert rc is not None and rc["name"] == "0.30.0rc2"  # no final release pins CANN 9.2.0 yet


def test_the_draft_model_flag_through_the_cli() -> None:
    result = run_cli("plan", "qwen3-32b", "--hardware", "910B3x8", "--speculative", "draft_model:3",
                     "--draft-model", "qwen3-8b", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["config"]["speculative_config"] == {"method": "draft_model", "num_speculative_tokens": 3,
                                                    "model": "Qwen/Qwen3-8B"}
    assert any("catalog model" in w for w in plan["warnings"])


def test_eagle3_without_a_draft_on_disk_plans_with_the_usual_head() -> None:
    """A capacity plan made before the draft is downloaded: EAGLE-3's usual head (one decoder layer of the target's
    width, its own LM head over the target's vocabulary), said in the explanation, the warnings and --json. The real
    head given later (AngelSlim's for Qwen3-8B, above) has the same layer; its 32000-row draft vocabulary is all
    the difference."""
    target = load_model("qwen3-8b")
    plan = make_plan(target, A2, LOAD, PlanOptions(speculative="eagle3:3"))
    spec = plan.speculative
    assert spec is not None and spec.draft_model is None and spec.draft_layers == 1
    assert spec.draft_assumed.startswith("no draft on disk: assumed the usual EAGLE-3 head")
    assumed, _ = usual_draft_head("eagle3_head", target.arch)
    assert spec.draft_weight_bytes == eagle3_head_parameters(assumed) * 2  # bfloat16
    real = make_plan(target, A2, LOAD, PlanOptions(speculative="eagle3:3", draft=ModelSpec(
        arch=arch_from_config(EAGLE3_QWEN3_8B), weight_bytes=None, weights_present=False, quantization=None,
        path=None, served_name="AngelSlim/Qwen3-8B_eagle3")))
    assert real.speculative is not None and not real.speculative.draft_assumed
    assert spec.draft_weight_bytes - real.speculative.draft_weight_bytes == (151936 - 32000) * 4096 * 2
    assert spec.draft_kv_bytes_per_token == real.speculative.draft_kv_bytes_per_token
    assert "no draft on disk" in plan.explanation("speculative_config").why
    assert any("a launch needs the draft itself" in w for w in plan.warnings)
    draft = plan.to_json()["speculative"]["draft"]
    assert draft["assumed"] is True and draft["what"] == spec.draft_assumed and draft["model"] is None
    assert real.to_json()["speculative"]["draft"]["assumed"] is False
    with pytest.raises(BadInputError, match="--draft-model DIR"):
        require_draft_on_disk(spec)
    require_draft_on_disk(real.speculative)


@pytest.mark.parametrize("name", ["qwen3-8b", "qwen3-30b-a3b", "llama-3.1-70b"])
def test_the_usual_eagle_heads_grow_with_the_target_and_keep_its_width(name: str) -> None:
    """EAGLE-1's head shares the target's LM head, EAGLE-3's has its own: for one target EAGLE-3's is the larger by
    the vocabulary rows and the fused input; both are one layer of the target's width."""
    arch = load_model(name).arch
    eagle3, _ = usual_draft_head("eagle3_head", arch)
    eagle, what = usual_draft_head("eagle_head", arch)
    assert eagle3.hidden_size == eagle.hidden_size == arch.hidden_size and eagle3.num_layers == 1
    assert eagle3.intermediate_size > 0 and "sharing its LM head" in what
    assert eagle3_head_parameters(eagle3) > eagle_head_parameters(eagle) + arch.vocab_size * arch.hidden_size
