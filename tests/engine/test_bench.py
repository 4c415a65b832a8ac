"""`npuops bench` against an instance launched by npuops with the real vLLM CPU engine (the tiny model).

One foreground launch (with an API key) for the module. It proves: vLLM's own `vllm bench serve` runs with the
key from the instance's env file and gives every figure beside the plan's prediction and the hardware's limit;
the report is kept and `npuops status` shows it; the bench calibrates the node, so the next `npuops plan` of the
same workload predicts within 10% of what was measured, and `--no-calibration` gives the shared constants back;
the plain-PyTorch baseline runs the same prompts and gives vLLM/plain ratios; a URL gives the figures alone.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.http_server import free_port
from tests.support.npuops_cli import npuops_argv
from tests.support.workspace import PLAN_FLAGS, Workspace, foreground_launch, foreground_workspace

pytestmark = [pytest.mark.engine, pytest.mark.slow]

START_TIMEOUT_S = 240.0
LOAD = ("--input-len", "128", "--output-len", "16", "--concurrency", "4")
# The plan's flags with the bench's load, so `npuops plan` predicts the same workload.
PLANNED = (*PLAN_FLAGS[: PLAN_FLAGS.index("--input-len")], *PLAN_FLAGS[PLAN_FLAGS.index("--output-len") + 2:], *LOAD)
# The bench's own load as a plan states it: every request exactly those lengths (a closed loop in waves).
PLANNED_AS_BENCHED = (*PLANNED, "--fixed-lengths")


@dataclass
class BenchedInstance:
    ws: Workspace
    model: Path
    port: int
    engine_python: Path


@pytest.fixture(scope="module")
def instance(engine_python: Path, tiny_model: Path, engine_compile_cache: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchedInstance]:
    root = tmp_path_factory.mktemp("bench")
    ws = foreground_workspace(root, engine_python, engine_compile_cache)
    key_file = root / "api-key"
    key_file.write_text("sk-bench-key\n")
    key_file.chmod(0o600)
    port = free_port()
    argv = npuops_argv("launch", str(tiny_model), *PLANNED, "--name", "b", "--port", str(port),
                       "--vllm", str(engine_python.parent / "vllm"), "--api-key-file", str(key_file), "--foreground")
    try:
        with foreground_launch(argv, ws.env, root, START_TIMEOUT_S):
            yield BenchedInstance(ws, tiny_model, port, engine_python)
    finally:
        for tmp_dir in ws.tmp_dirs:
            shutil.rmtree(tmp_dir, ignore_errors=True)


def bench(inst: BenchedInstance, *args: str, timeout: float = 600) -> dict[str, object]:
    done = inst.ws.run("bench", *args, "--json", timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert isinstance(report, dict)
    return report


def test_bench_gives_every_figure_beside_the_prediction_and_calibrates_the_plan(instance: BenchedInstance) -> None:
    done = instance.ws.run("bench", "b", "--num-prompts", "24", "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "vllm bench serve" in done.stderr  # the progress line
    report = json.loads(done.stdout)
    measured = report["measured"]
    # The plan's load by default, every request answered with exactly its output length (--ignore-eos), which
    # also proves the key from the env file reached the tool: without it every request is a 401.
    seed = report["load"].pop("seed")
    assert isinstance(seed, int) and seed >= 0  # a fresh one: prompts new to the instance's prefix cache
    assert report["load"] == {"input_len": 128, "output_len": 16, "concurrency": 4, "request_rate": None,
                              "num_prompts": 24}
    # The engine's own prefix-cache counters around the bench. A fresh seed's prompts are new to the instance, but
    # vLLM's random prompts are runs of consecutive token ids from a random start (datasets.py
    # generate_token_sequence), so on the tiny model's 1024-token vocabulary two of one bench's 24 prompts start
    # alike by chance (a CI run saw 4 such block hits besides the warm-ups'): most prompt tokens still miss.
    cache = report["prefix_cache"]
    assert cache["queried_tokens"] >= 24 * 128 and cache["hit_rate"] < 0.5, cache
    assert measured["completed"] == 24 and measured["failed"] == 0
    assert measured["total_output_tokens"] == 24 * 16
    for metric in ("ttft", "tpot", "itl", "e2el"):
        figures = measured["latency"][metric]
        assert 0 < figures["median_ms"] <= figures["p99_ms"]
    assert measured["output_throughput"] > 0 and measured["request_throughput"] > 0
    ratios, predicted = report["ratios"], report["predicted"]
    for key in ("ttft", "tpot", "itl", "e2el", "output_throughput", "request_throughput"):
        assert ratios[key] is not None and ratios[key] > 0
    assert ratios["tpot"] == pytest.approx(measured["latency"]["tpot"]["median_ms"] / predicted["tpot_ms"], rel=1e-2)
    limit = report["hardware_limit"]
    assert 0 < limit["decode_fraction"] < 1 and 0 < limit["prefill_fraction"] < 1
    assert report["stream_note"] is None and report["calibration"]["samples"] == 1  # a step-by-step stream
    assert report["stack"]["vllm"] and report["hardware"].startswith("cpu (")
    assert "sk-bench-key" not in done.stdout + done.stderr
    assert "sk-bench-key" not in json.dumps(report["vllm_bench_argv"])

    # Kept with the instance, and status shows it.
    kept = Path(report["file"])
    assert kept.parent == instance.ws.state / "b" / "bench" and json.loads(kept.read_text())["at"] == report["at"]
    status = instance.ws.status("b")
    assert status["last_bench"]["output_throughput"] == pytest.approx(measured["output_throughput"], rel=1e-3)
    text = instance.ws.run("status", "b").stdout
    assert "bench     " in text and "x predicted" in text

    # The next plan of the same workload on this node predicts what was measured, within 10%.
    planned = instance.ws.run("plan", str(instance.model), *PLANNED_AS_BENCHED, "--json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["calibration"]["applied"] is not None, plan["calibration"]["why"]
    assert plan["calibration"]["applied"]["samples"] == 1
    p = plan["prediction"]
    assert p["ttft_ms"] == pytest.approx(measured["latency"]["ttft"]["median_ms"], rel=0.10)
    assert p["tpot_ms"] == pytest.approx(measured["latency"]["tpot"]["median_ms"], rel=0.10)
    assert p["output_tokens_per_s"] == pytest.approx(measured["output_throughput"], rel=0.10)
    uncalibrated = instance.ws.run("plan", str(instance.model), *PLANNED_AS_BENCHED, "--json", "--no-calibration")
    assert json.loads(uncalibrated.stdout)["prediction"] == plan["calibration"]["uncalibrated_prediction"]
    human = instance.ws.run("plan", str(instance.model), *PLANNED).stdout
    assert "calibration" in human and "from 1 bench on cpu" in human

    # The same seed again sends the same prompts: the engine finds them in its prefix cache, and the report says so.
    # (256-token prompts: the CPU engine caches whole 128-token blocks and always computes a prompt's last token,
    # so a 128-token prompt can never be a hit.)
    longer = ("--input-len", "256", "--num-prompts", "24", "--no-calibrate", "--json")
    first = json.loads(instance.ws.run("bench", "b", *longer, timeout=600).stdout)
    assert first["prefix_cache"]["repeated_prompts"] is False, first["prefix_cache"]
    again = instance.ws.run("bench", "b", *longer[:-1], "--seed", str(first["load"]["seed"]), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "TTFT measures partly cached prompts: give another --seed" in again.stdout, again.stdout


def test_a_url_gives_the_figures_alone(instance: BenchedInstance, tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-bench-key\n")
    report = bench(instance, f"http://127.0.0.1:{instance.port}", "--model", str(instance.model),
                   "--api-key-file", str(key), "--vllm", str(instance.engine_python.parent / "vllm"),
                   "--num-prompts", "8", "--output-len", "4", "--input-len", "32", "--concurrency", "2")
    assert report["measured"]["completed"] == 8 and report["predicted"] is None and report["instance"] is None
    assert "no plan" in report["prediction_note"]


def test_the_baseline_runs_the_same_prompts_through_plain_pytorch(instance: BenchedInstance) -> None:
    done = instance.ws.run("bench", "b", "--baseline", "transformers", "--num-prompts", "8", "--no-calibrate",
                           "--json", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "transformers generate" in done.stderr and "batch 2/2 done" in done.stderr  # its progress, relayed
    report = json.loads(done.stdout)
    baseline = report["baseline"]
    plain = baseline["measured"]
    # The same load: 8 prompts of 128 tokens, 16 out each, in static batches of the concurrency (4), float32.
    assert plain["backend"] == "transformers" and plain["completed"] == 8
    assert plain["total_output_tokens"] == report["measured"]["total_output_tokens"] == 8 * 16
    assert baseline["device"] == "cpu" and baseline["dtype"] == "float32"
    ratios = baseline["ratios"]
    assert ratios["output_throughput_ratio"] == pytest.approx(
        report["measured"]["output_throughput"] / plain["output_throughput"], rel=1e-3)
    assert ratios["e2el_reduction"] == pytest.approx(
        1 - report["measured"]["latency"]["e2el"]["median_ms"] / plain["latency"]["e2el"]["median_ms"], abs=1e-3)
    assert baseline["founding_claim"] == {"throughput_ratio": 1.7, "latency_reduction": 0.4}
    human = instance.ws.run("bench", "b", "--num-prompts", "4", "--no-calibrate", "--baseline", "transformers",
                            timeout=900).stdout
    assert "vLLM / plain: throughput x" in human and "(founding document: x1.7)" in human
