"""`vllm bench serve`'s saved result read back, its command line, the report's ratios and the status headline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from npuops.bench.report import (
    baseline_ratios,
    hardware_fractions,
    prediction_ratios,
    render_report_text,
)
from npuops.bench.run import BenchRequest, bench_load
from npuops.bench.serve_bench import BenchLoad, bench_serve_argv, parse_serve_result
from npuops.bench.timing import choose_timing
from npuops.instance.bench_results import bench_headline, render_bench_headline
from npuops.parsing import ParseError
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.performance import predict, roofline
from npuops.plan.planner import make_plan
from npuops.plan.target import parse_hardware_spec
from tests.support.paths import REPO

FIXTURE = REPO / "tests" / "fixtures" / "bench" / "vllm_bench_serve_result.json"


def test_the_recorded_result_gives_every_figure() -> None:
    figures = parse_serve_result(FIXTURE.read_text())
    raw = json.loads(FIXTURE.read_text())
    assert figures.completed == 40 and figures.failed == 0
    assert figures.total_output_tokens == 40 * 32
    assert figures.output_throughput == raw["output_throughput"]
    assert figures.latency["ttft"].median_ms == raw["median_ttft_ms"]
    assert figures.latency["e2el"].p99_ms == raw["p99_e2el_ms"]
    assert set(figures.latency) == {"ttft", "tpot", "itl", "e2el"}
    assert type(figures).from_dict(json.loads(json.dumps(figures.as_dict()))).as_dict() == figures.as_dict()


@pytest.mark.parametrize(("text", "problem"), [
    ("garbage", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({k: v for k, v in json.loads(FIXTURE.read_text()).items() if k != "p99_tpot_ms"}), "'p99_tpot_ms'"),
    (FIXTURE.read_text().replace('"output_throughput": 270.4969189305111', '"output_throughput": "fast"'),
     "output_throughput"),
])
def test_a_result_that_is_not_one_is_a_parse_error(text: str, problem: str) -> None:
    with pytest.raises(ParseError, match=problem):
        parse_serve_result(text)


def test_the_command_line_saves_its_result_and_carries_no_secret(tmp_path: Path) -> None:
    load = BenchLoad(input_len=128, output_len=32, concurrency=4, request_rate=None, num_prompts=40)
    argv = bench_serve_argv("/venv/bin/vllm", base_url="http://127.0.0.1:8000", model_path="/m/tiny",
                            served_model_name="tiny", load=load, result_dir=tmp_path)
    assert argv[:3] == ["/venv/bin/vllm", "bench", "serve"]
    for flag, value in (("--max-concurrency", "4"), ("--num-warmups", "4"), ("--served-model-name", "tiny"),
                        ("--result-dir", str(tmp_path)), ("--random-input-len", "128"),
                        ("--percentile-metrics", "ttft,tpot,itl,e2el")):
        assert argv[argv.index(flag) + 1] == value
    assert "--ignore-eos" in argv and "--save-result" in argv and "--request-rate" not in argv
    assert not any("key" in a.lower() for a in argv)
    rated = bench_serve_argv("vllm", base_url="u", model_path="m", served_model_name="s", result_dir=tmp_path,
                             load=BenchLoad(128, 32, 4, 2.5, 40))
    assert rated[rated.index("--request-rate") + 1] == "2.5"


def _plan():  # type: ignore[no-untyped-def]
    return make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x1"),
                     Workload(input_len=128, output_len=32, concurrency=4), PlanOptions())


def test_the_load_defaults_to_the_plans() -> None:
    perf = _plan().perf
    load = bench_load(BenchRequest("x"), perf)
    assert (load.input_len, load.output_len, load.concurrency, load.num_prompts) == (128, 32, 4, 40)
    assert bench_load(BenchRequest("x", concurrency=8, output_len=7), perf).num_prompts == 80
    assert bench_load(BenchRequest("x"), None).input_len == 512


def test_each_bench_draws_new_prompts_unless_given_a_seed() -> None:
    """vLLM's random prompts of one seed repeat, and would meet the instance's prefix cache the second time."""
    seeds = {bench_load(BenchRequest("x"), None).seed for _ in range(8)}
    assert len(seeds) > 1 and all(0 <= s < 2**31 for s in seeds)
    assert bench_load(BenchRequest("x", seed=7), None).seed == 7
    assert bench_load(BenchRequest("x", seed=0), None).seed == 0


def test_ratios_and_hardware_fractions() -> None:
    perf = _plan().perf
    measured = parse_serve_result(FIXTURE.read_text())
    predicted = predict(perf)
    ratios = prediction_ratios(measured, predicted)
    assert ratios["ttft"] == pytest.approx(measured.latency["ttft"].median_ms / predicted.ttft_ms, rel=1e-3)
    assert ratios["output_throughput"] == pytest.approx(measured.output_throughput / predicted.output_tokens_per_s,
                                                        rel=1e-3)
    limits = roofline(perf)
    fractions = hardware_fractions(choose_timing(measured, None, limits), perf, limits, "the chip's")
    # The fastest step streams ~16 GB over 1.6 TB/s: ~10 ms; the recorded TPOT (11 ms) is near it.
    assert 0.5 < fractions["decode_fraction"] < 1.5
    assert fractions["memory"] == "HBM" and fractions["bandwidth_bytes_per_s"] == 1.6e12
    assert limits.prefill_flops_per_s == perf.flops_per_s
    assert 0 < fractions["prefill_fraction"] < 1
    plain = parse_serve_result(FIXTURE.read_text().replace('"output_throughput": 270.4969189305111',
                                                           '"output_throughput": 135.24845946525555'))
    b = baseline_ratios(measured, plain)
    assert b["output_throughput_ratio"] == pytest.approx(2.0, rel=1e-3) and b["e2el_reduction"] == 0.0


def test_the_report_text_and_the_status_headline() -> None:
    measured = parse_serve_result(FIXTURE.read_text())
    predicted = predict(_plan().perf)
    report = {"target": "demo", "load": BenchLoad(128, 32, 4, None, 40).as_dict(),
              "load_description": BenchLoad(128, 32, 4, None, 40).describe(), "measured": measured.as_dict(),
              "predicted": predicted.as_dict(), "ratios": prediction_ratios(measured, predicted), "at": 0.0,
              "file": "/s/demo/bench/x.json"}
    text = render_report_text(report)
    assert "TTFT ms" in text and "measured/predicted" in text
    assert "kept in /s/demo/bench/x.json" in text
    assert "prefix cache" not in text  # an endpoint without the counters
    fresh = {"queried_tokens": 5644.0, "hit_tokens": 128.0, "hit_rate": 0.0227, "repeated_prompts": False}
    assert "prefix cache: 2.3% of 5644 prompt tokens found cached\n" in render_report_text(
        {**report, "prefix_cache": fresh})
    repeated = {**fresh, "hit_tokens": 1024.0, "hit_rate": 0.1814, "repeated_prompts": True}
    assert "18.1% of 5644 prompt tokens found cached (TTFT measures partly cached prompts: give another --seed" in (
        render_report_text({**report, "prefix_cache": repeated}))
    assert "speculative decoding" not in text
    spec = {"drafts": 8.0, "draft_tokens": 23.0, "accepted_tokens": 13.0, "acceptance_rate": 0.5652}
    assert "speculative decoding: 56.5% of 23 draft tokens accepted (the prediction uses this rate)" in (
        render_report_text({**report, "speculative": spec}))
    headline = bench_headline(report)
    assert headline is not None
    assert headline["median_tpot_ms"] == pytest.approx(measured.latency["tpot"].median_ms, abs=1e-3)
    line = render_bench_headline(headline)
    assert "40 x 128/32 tokens, 4 in flight" in line and "x predicted" in line
    assert bench_headline({"measured": {}}) is None


def _npuops(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "NPUOPS_STATE_DIR": str(state), "HOME": str(state)},
                          timeout=60)


@pytest.mark.parametrize(("args", "code", "message"), [
    (("bench", "nosuch"), 3, "no instance named 'nosuch'"),
    (("bench", "http://127.0.0.1:9"), 2, "a URL needs --model DIR"),
    (("bench", "demo", "--baseline", "numpy"), 2, "'numpy' is not 'transformers'"),
    (("bench", "demo", "--concurrency", "0"), 2, "--concurrency"),
])
def test_bad_bench_input_is_one_line(tmp_path: Path, args: tuple[str, ...], code: int, message: str) -> None:
    done = _npuops(*args, state=tmp_path)
    assert done.returncode == code, done.stderr
    assert message in done.stderr and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_the_status_carries_the_last_bench_across_hosts() -> None:
    from npuops.instance.status import InstanceStatus, render_status_text

    headline = {"at": 0.0, "file": "/s/b.json", "load": BenchLoad(128, 32, 4, None, 40).as_dict(),
                "output_throughput": 270.5, "median_ttft_ms": 68.5, "median_tpot_ms": 11.1,
                "ratio_output_throughput": 0.95, "ratio_ttft": 1.1, "ratio_tpot": 0.9}
    status = InstanceStatus(name="demo", state="healthy", healthy=True, last_bench=headline)
    data = json.loads(json.dumps(status.to_json()))
    assert InstanceStatus.from_json(data) == status
    assert "bench     " in render_status_text(status) and "270.5 output tok/s (0.95x predicted)" in \
        render_status_text(status)
    assert "last_bench" not in InstanceStatus(name="demo", state="stopped", healthy=False).to_json()


def test_a_repeated_prompt_set_is_told_from_chance_hits() -> None:
    """24 prompts of 256 tokens at concurrency 4 on the CPU engine (128-token blocks; a prompt's last token is
    always computed, so a prompt hits at most its first block): figures of real runs."""
    from npuops.bench.run import repeated_prompt_set

    load = BenchLoad(256, 16, 4, None, 24)
    assert repeated_prompt_set(24 * 128 + 5 * 128, load)  # the same seed again: every prompt's block
    assert not repeated_prompt_set(1408, load)  # a fresh seed: the warm-ups and 6 blocks by chance (a CI run)
    assert not repeated_prompt_set(5 * 128, load)  # the warm-ups alone
