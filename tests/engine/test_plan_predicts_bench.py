"""The plan's own figures for the small model on this host, before any calibration, against a bench of that plan.

`npuops plan` for a benchmark's load (every request exactly its lengths) predicts from the node model alone: the
CPU's flags (bfloat16 where it computes it natively), and the matmul rate and memory bandwidth it measures once. The
same request is launched as planned (its dtype, compiled unless a fast start is asked for) under npuops' supervisor,
and `npuops bench` measures it with vLLM's `vllm bench serve`. Each figure the plan gives — output tokens/s, median
TTFT and median TPOT (the bench's choice of client or engine timing) — is within 2x of what was measured.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.http_server import free_port
from tests.support.npuops_cli import npuops_argv
from tests.support.workspace import foreground_launch, foreground_workspace

pytestmark = [pytest.mark.engine, pytest.mark.slow]

START_TIMEOUT_S = 900.0  # a first torch.compile of the small model on a busy 2-core machine
REQUEST = ("--hardware", "cpu", "--input-len", "256", "--output-len", "64", "--concurrency", "8", "--fixed-lengths",
           "--kv-cache-memory-bytes", str(1024 * 2**20))
PROMPTS = 16  # two waves of eight


def test_the_small_models_plan_predicts_its_bench_within_2x(engine_python: Path, small_model: Path,
                                                            engine_compile_cache: Path, tmp_path: Path) -> None:
    ws = foreground_workspace(tmp_path, engine_python, engine_compile_cache)
    try:
        planned = subprocess.run(npuops_argv("plan", str(small_model), *REQUEST, "--json"), env=ws.env,
                                 capture_output=True, text=True, timeout=120)
        assert planned.returncode == 0, planned.stderr
        plan = json.loads(planned.stdout)
        # What this host makes fast, chosen without a flag: compiled, in the dtype its flags allow.
        assert plan["config"]["enforce_eager"] is False
        rates = next(e for e in plan["explanations"] if e["key"] == "performance.cpu_rates")
        # The prefill's roofline is the matmul rate timed in the engine venv's torch, the decode's the bandwidth
        # measured here: two hosts with the same flags differ ~3x (npuops/hardware/matmul_rate.py).
        assert "a matmul's rate measured on this host (torch " in rates["why"]
        assert "measured once on this host" in rates["why"]
        predicted = plan["prediction"]
        port = free_port()
        argv = npuops_argv("launch", str(small_model), *REQUEST, "--name", "pb", "--port", str(port),
                           "--vllm", str(engine_python.parent / "vllm"), "--foreground")
        with foreground_launch(argv, ws.env, tmp_path, START_TIMEOUT_S):
            benched = subprocess.run(npuops_argv("bench", "pb", "--num-prompts", str(PROMPTS), "--no-calibrate",
                                                 "--json"), env=ws.env, capture_output=True, text=True, timeout=900)
        assert benched.returncode == 0, benched.stderr
        report = json.loads(benched.stdout)
        measured = {"output_tokens_per_s": float(report["measured"]["output_throughput"]),
                    "ttft_ms": float(report["timing"]["ttft_ms"]), "tpot_ms": float(report["timing"]["tpot_ms"])}
        ratios = {k: predicted[k] / measured[k] for k in measured}
        assert all(0.5 <= r <= 2.0 for r in ratios.values()), (ratios, predicted, measured, report["timing"],
                                                               report.get("prefix_cache"))
    finally:
        for tmp_dir in ws.tmp_dirs:
            shutil.rmtree(tmp_dir, ignore_errors=True)
