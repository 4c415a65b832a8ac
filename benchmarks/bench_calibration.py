"""The experiment of claim 1 in docs/claims.md and the calibration, measured on this machine with the vLLM CPU engine.

Run: `python benchmarks/bench_calibration.py [--models tiny,small]` (root not needed; NPUOPS_ENGINE_PYTHON or the
engine venv of scripts/engine-venv.sh). For each locally made model (the tiny demo model, and a larger one of a
few hundred MB: `python -m npuops.demo_model DEST --size small`) it launches an instance with
`npuops launch --foreground` and then, one after another in the same run:

1. `npuops bench NAME --baseline transformers` at workload A: vLLM's figures, plain PyTorch's (transformers
   generate, static batches of the same size) on the same prompts, and vLLM/plain beside the claim's 1.7x / -40%;
   this bench also calibrates the node;
2. `npuops bench NAME --no-calibrate` at workload A again, and 3. at workload B (other lengths and concurrency):
   each report holds the uncalibrated prediction ("before") and the calibrated one ("after", from step 1's bench)
   beside a fresh measurement.

It prints |measured/predicted - 1| of TTFT, TPOT and output throughput before and after, for A and B. The machine
is noisy: the figures move between runs; the ratios of one run are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from foreground import foreground_instance  # benchmarks/, beside this script

REPO = Path(__file__).resolve().parents[1]
WORKLOAD_A = {"input_len": 128, "output_len": 32, "concurrency": 4}
WORKLOAD_B = {"input_len": 256, "output_len": 64, "concurrency": 2}
# Enough requests that one blip of a 2-core machine (a health probe, a GC pause) does not move a whole bench: the
# tiny model's 40 requests took one second, and two benches of one load differed by 20-35%; the small model's 8
# (two waves) gave medians that hung on the first wave.
NUM_PROMPTS = {"tiny": 200, "small": 40}
FIGURES = (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("output_throughput", "output_tokens_per_s"))


def engine_python() -> Path:
    if os.environ.get("NPUOPS_ENGINE_PYTHON"):
        return Path(os.environ["NPUOPS_ENGINE_PYTHON"])
    out = subprocess.run([str(REPO / "scripts" / "engine-venv.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flags(workload: dict[str, int]) -> list[str]:
    return ["--input-len", str(workload["input_len"]), "--output-len", str(workload["output_len"]),
            "--concurrency", str(workload["concurrency"])]


def measured_of(report: dict[str, Any], metric: str) -> float:
    """A figure as the bench used it: TTFT and TPOT from the figures that timed the engine (the client's medians,
    or the engine's own means when the stream came in bursts), throughput from the client."""
    if metric == "output_throughput":
        return float(report["measured"][metric])
    return float(report["timing"][f"{metric}_ms"])


def errors(report: dict[str, Any], which: str) -> dict[str, float]:
    predicted = report["uncalibrated_predicted" if which == "before" else "predicted"]
    return {metric: abs(measured_of(report, metric) / float(predicted[key]) - 1) for metric, key in FIGURES}


def run_model(python: Path, size: str, work: Path) -> dict[str, Any]:
    npuops = [str(python), "-m", "npuops"]
    model = work / f"{size}-llama"
    subprocess.run([str(python), "-m", "npuops.demo_model", str(model), "--size", size], check=True,
                   capture_output=True, cwd=REPO)
    env = {**os.environ, "NPUOPS_STATE_DIR": str(work / f"state-{size}"), "NPUOPS_STACK_PYTHON": str(python),
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
           "TMPDIR": tempfile.mkdtemp(prefix="nb-", dir="/tmp")}
    port = free_port()
    plan_flags = ["--hardware", "cpu", "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
                  "--kv-cache-memory-bytes", str(512 * 2**20), *flags(WORKLOAD_A)]
    with foreground_instance(python, [str(model), *plan_flags, "--port", str(port)], size, env):
        def bench(*args: str) -> dict[str, Any]:
            done = subprocess.run([*npuops, "bench", size, *args, "--json"], env=env, cwd=REPO, capture_output=True,
                                  text=True)
            if done.returncode != 0:
                raise SystemExit(f"{size}: npuops bench {' '.join(args)} failed: {done.stderr[-1500:]}")
            report = json.loads(done.stdout)
            assert isinstance(report, dict)
            return report

        prompts = ["--num-prompts", str(NUM_PROMPTS.get(size, 40))]
        first = bench(*flags(WORKLOAD_A), *prompts, "--baseline", "transformers")
        again = bench(*flags(WORKLOAD_A), *prompts, "--no-calibrate")
        other = bench(*flags(WORKLOAD_B), *prompts, "--no-calibrate")
        return {"model": size, "size_bytes": sum(f.stat().st_size for f in model.iterdir()),
                "baseline": first["baseline"], "first": first, "again": again, "other": other}


def print_model(result: dict[str, Any]) -> None:
    baseline = result["baseline"]
    ratios, vllm, plain = baseline["ratios"], result["first"]["measured"], baseline["measured"]
    print(f"\n{result['model']} model ({result['size_bytes'] / 2**20:.0f} MiB), workload A "
          f"{WORKLOAD_A['input_len']}/{WORKLOAD_A['output_len']} tokens, concurrency {WORKLOAD_A['concurrency']}:")
    static = f"(transformers generate, static batches of {WORKLOAD_A['concurrency']})"
    for label, figures, how in (("vLLM ", vllm, "(vllm bench serve)"), ("plain", plain, static)):
        print(f"  {label} {figures['output_throughput']:8.1f} output tok/s, end-to-end "
              f"{figures['latency']['e2el']['median_ms']:.1f} ms median {how}")
    reduction = ratios["e2el_reduction"]
    print(f"  vLLM/plain: throughput x{ratios['output_throughput_ratio']:.2f}, end-to-end latency "
          f"{-100 * reduction:+.0f}%; the claim tested (docs/claims.md): x1.7, -40%")
    # Two benches of the same load on the same instance: how far the machine moves a measurement by itself, the
    # floor under any prediction's error.
    noise = ", ".join(f"{m} {abs(measured_of(result['again'], m) / measured_of(result['first'], m) - 1) * 100:.0f}%"
                      for m, _ in FIGURES)
    print(f"  noise, A again against the first bench of A: {noise}")
    sources = ", ".join(f"{label} {result[key]['timing']['source']}"
                        for label, key in (("A", "first"), ("A again", "again"), ("B", "other")))
    print(f"  TTFT and TPOT from (client: the stream's medians; engine: its histograms' means): {sources}")
    calibration = result["first"]["calibration"] or {}
    print(f"  calibration stored by the first bench: {calibration.get('describe') or calibration}")
    for label, report in (("A again", result["again"]), ("B (other load)", result["other"])):
        before, after = errors(report, "before"), errors(report, "after")
        cells = ", ".join(f"{m} {before[m] * 100:.0f}% -> {after[m] * 100:.0f}%" for m, _ in FIGURES)
        print(f"  prediction error, {label}: {cells}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small", help="Comma-separated model sizes (tiny, small).")
    parser.add_argument("--json", action="store_true", help="Also print every report as JSON.")
    args = parser.parse_args()
    python = engine_python()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="npuops-bench-cal-") as tmp:
        results = [run_model(python, size, Path(tmp)) for size in args.models.split(",")]
    for result in results:
        print_model(result)
    if args.json:
        print(json.dumps(results, indent=1))
    print(f"\n({time.monotonic() - started:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
