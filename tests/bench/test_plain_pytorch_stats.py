"""The plain-PyTorch bench's pure parts (npuops/bench/plain_pytorch.py), without torch: the request's checks, the
statistics (numpy's, as `vllm bench serve` computes them) and the metrics from a batch's timestamps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from npuops.bench.plain_pytorch import (
    BadRequest,
    BatchTiming,
    batches_of,
    mean,
    parse_request,
    percentile,
    std,
    summarize,
    vllm_serve_argv,
    write_json_atomically,
)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def request_data(model_dir: Path, /, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"model": str(model_dir), "dtype": "auto", "input_len": 128, "output_len": 32,
                            "num_prompts": 40, "batch_size": 4, "seed": 0, "device": "auto"}
    data.update(overrides)
    return data


def test_statistics_match_numpy() -> None:
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0]
    # np.percentile(values, 99) (linear), np.median, np.mean, np.std (population) of these values.
    assert percentile(values, 99) == pytest.approx(8.76)
    assert percentile(values, 50) == 3.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert mean(values) == pytest.approx(25 / 7)
    assert std(values) == pytest.approx(2.6108096)
    assert (mean([]), percentile([], 99), std([])) == (0.0, 0.0, 0.0)


def test_summary_of_static_batches() -> None:
    # Two batches: 2 requests starting at 10.0, tokens at +0.5, +0.6, +0.8; 1 request at 20.0, tokens +1, +2, +3.
    batches = [
        BatchTiming(start=10.0, token_times=(10.5, 10.6, 10.8), input_lens=(8, 8)),
        BatchTiming(start=20.0, token_times=(21.0, 22.0, 23.0), input_lens=(9,)),
    ]
    result = summarize(batches, output_len=3)
    assert result["completed"] == 3
    assert (result["total_input_tokens"], result["total_output_tokens"]) == (25, 9)
    assert result["input_lens"] == [8, 8, 9]
    assert result["duration"] == result["duration_s"] == pytest.approx(0.8 + 3.0)
    assert result["request_throughput"] == pytest.approx(3 / 3.8)
    assert result["output_throughput"] == pytest.approx(9 / 3.8)
    assert result["total_token_throughput"] == pytest.approx(34 / 3.8)
    assert result["median_ttft_ms"] == pytest.approx(500.0)
    assert result["mean_ttft_ms"] == pytest.approx((500 + 500 + 1000) / 3)
    assert result["median_tpot_ms"] == pytest.approx(150.0)  # (0.8 - 0.5) / 2 for both requests of batch 1
    assert result["mean_e2el_ms"] == pytest.approx((800 + 800 + 3000) / 3)
    # ITLs: each request's gaps, so the first batch's counts twice: 100, 200, 100, 200, 1000, 1000.
    assert result["mean_itl_ms"] == pytest.approx(2600 / 6)
    assert result["median_itl_ms"] == pytest.approx(200.0)
    assert result["p99_itl_ms"] == pytest.approx(1000.0)
    assert set(result) >= {f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99")
                           for m in ("ttft", "tpot", "itl", "e2el")}


def test_single_token_requests_have_no_tpot() -> None:
    result = summarize([BatchTiming(start=0.0, token_times=(0.25,), input_lens=(4,))], output_len=1)
    assert result["median_ttft_ms"] == pytest.approx(250.0)
    assert (result["mean_tpot_ms"], result["mean_itl_ms"]) == (0.0, 0.0)


def test_summary_refuses_a_batch_short_of_tokens() -> None:
    with pytest.raises(ValueError, match="2 token timestamps, not 3"):
        summarize([BatchTiming(start=0.0, token_times=(1.0, 2.0), input_lens=(4,))], output_len=3)


def test_batches_keep_order_and_the_last_is_smaller() -> None:
    assert batches_of(list("abcdefghij"), 4) == [list("abcd"), list("efgh"), list("ij")]


def test_request_is_parsed(model_dir: Path) -> None:
    request = parse_request(request_data(model_dir))
    assert (request.model, request.input_len, request.batch_size, request.device) == (model_dir, 128, 4, "auto")
    assert vllm_serve_argv(request) == [
        "--model", str(model_dir), "--dataset-name", "random", "--random-input-len", "128",
        "--random-output-len", "32", "--num-prompts", "40", "--seed", "0", "--ignore-eos",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"num_prompts": True}, "num_prompts must be an integer >= 1"),
        ({"input_len": 1.5}, "input_len must be an integer >= 1"),
        ({"dtype": "fp8"}, "dtype must be one of"),
        ({"device": "cuda"}, "device must be one of"),
        ({"model": 3}, "model must be a directory path"),
        ({"model": "/nonexistent"}, "does not exist or has no config.json"),
    ],
)
def test_bad_requests_are_named(model_dir: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_request(request_data(model_dir, **overrides))


def test_missing_fields_are_listed(model_dir: Path) -> None:
    data = request_data(model_dir)
    del data["seed"], data["dtype"]
    with pytest.raises(BadRequest, match="lacks dtype, seed"):
        parse_request(data)


def test_result_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text("old")
    write_json_atomically(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
