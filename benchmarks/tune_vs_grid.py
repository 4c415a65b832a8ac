"""`npuops tune` against a full grid of the same space, on this machine's vLLM CPU engine (the tiny model).

Run: `python benchmarks/tune_vs_grid.py` (NPUOPS_ENGINE_PYTHON or the engine venv). One `npuops tune` with a budget
as large as the space runs every candidate, in the order the guide picks them. The guide's choice of the k-th trial
depends only on the trials before it, so the first k trials of this run are exactly what `--budget k` runs: the
run is the full grid and every smaller budget at once, measured side by side. It prints the grid's best, and the
first trial at which the guided order reached it (within 5%), against a third of the grid.

One bench per candidate is noisy on a 2-core machine (the grid's best is also the luckiest of its benches), so it
then measures the two that matter again, side by side in alternating rounds: the grid's best and the best of the
trials a budget of a third of the grid runs. Their ratio, per round and as the median, says whether that budget
found a configuration as good as the grid's best, or only one that measured worse once.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from foreground import foreground_instance  # benchmarks/, beside this script

REPO = Path(__file__).resolve().parents[1]
FLAGS = ["--hardware", "cpu", "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
         "--kv-cache-memory-bytes", str(256 * 2**20), "--input-len", "128", "--output-len", "32", "--concurrency", "16"]
NOISE = 0.05
ROUNDS = 3
NUM_PROMPTS = 48


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def remeasure(python: Path, model: Path, env: dict[str, str], options: dict[str, Any]) -> float:
    """Launch one configuration under npuops' supervisor, bench it, stop it: its output tokens/s. (A port of its
    own: the tune's stopped trials keep their records, and launch refuses a port another instance is given.)"""
    port = free_port()
    option_flags = [x for k, v in options.items() for x in ("--" + k.replace("_", "-"), str(v))]
    with foreground_instance(python, [str(model), *FLAGS, *option_flags, "--port", str(port)], "again", env):
        done = subprocess.run([str(python), "-m", "npuops", "bench", "again", "--num-prompts", str(NUM_PROMPTS),
                               "--no-calibrate", "--json"], env=env, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{options}: npuops bench failed: {done.stderr[-1500:]}")
        return float(json.loads(done.stdout)["measured"]["output_throughput"])


def compare(python: Path, model: Path, env: dict[str, str], grid_best: dict[str, Any],
            budget_best: dict[str, Any], third: int) -> None:
    """The grid's best and the budget's best measured again, alternating, ROUNDS times."""
    def describe(options: dict[str, Any]) -> str:
        return " ".join(f"{k}={v}" for k, v in options.items())

    print(f"measured again, {ROUNDS} alternating rounds: the grid's best ({describe(grid_best)}) and the "
          f"best of the first {third} trials ({describe(budget_best)})")
    ratios = []
    for round_ in range(1, ROUNDS + 1):
        grid_figure = remeasure(python, model, env, grid_best)
        budget_figure = remeasure(python, model, env, budget_best)
        ratios.append(budget_figure / grid_figure)
        print(f"  round {round_}: grid's best {grid_figure:.1f} tok/s, budget's best {budget_figure:.1f} tok/s, "
              f"ratio {ratios[-1]:.2f}", flush=True)
    median = statistics.median(ratios)
    verdict = "as good as" if median >= 1 - NOISE else "worse than"
    print(f"budget of a third / grid's best: median {median:.2f} over {ROUNDS} rounds: the budget found a "
          f"configuration {verdict} the grid's best (within {NOISE:.0%})")


def parse_options(text: str) -> dict[str, Any]:
    """"max_num_seqs=32,max_num_batched_tokens=1024" as a trial's options."""
    return {k: int(v) if v.isdigit() else float(v) for k, v in (item.split("=", 1) for item in text.split(","))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", nargs=2, metavar=("GRID_BEST", "BUDGET_BEST"),
                        help="Skip the grid: only measure these two configurations again (k=v,k=v each), as the "
                             "grid's run printed them.")
    parser.add_argument("--third", type=int, default=6, help="With --compare: the budget the second one came from.")
    args = parser.parse_args()
    python = Path(os.environ.get("NPUOPS_ENGINE_PYTHON") or subprocess.run(
        [str(REPO / "scripts" / "engine-venv.sh")], check=True, capture_output=True, text=True).stdout.split()[-1])
    with tempfile.TemporaryDirectory(prefix="npuops-tune-grid-") as tmp:
        work = Path(tmp)
        model = work / "tiny-llama"
        subprocess.run([str(python), "-m", "npuops.demo_model", str(model)], check=True, capture_output=True)
        port = free_port()
        env = {**os.environ, "NPUOPS_STATE_DIR": str(work / "state"), "NPUOPS_STACK_PYTHON": str(python),
               "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "TMPDIR": tempfile.mkdtemp(dir="/tmp")}
        if args.compare:
            compare(python, model, env, parse_options(args.compare[0]), parse_options(args.compare[1]), args.third)
            return 0
        done = subprocess.run([str(python), "-m", "npuops", "tune", str(model), *FLAGS, "--budget", "100",
                               "--num-prompts", str(NUM_PROMPTS), "--port", str(port),
                               "--vllm", str(python.parent / "vllm"),
                               "--output", str(work / "tuned.json"), "--json"], env=env, cwd=REPO,
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        result = json.loads(done.stdout)
        trials = [t for t in result["trials"] if t["measured"]]
        best_trial = max(trials, key=lambda t: t["measured"]["output_tokens_per_s"])
        best = best_trial["measured"]["output_tokens_per_s"]
        reached = next(i for i, t in enumerate(result["trials"], 1)
                       if t["measured"] and t["measured"]["output_tokens_per_s"] >= best * (1 - NOISE))
        grid = len(result["trials"])
        third = grid // 3
        early = [t for t in result["trials"][:third] if t["measured"]]
        early_best = max(early, key=lambda t: t["measured"]["output_tokens_per_s"])
        print(f"grid: {grid} trials, best {best:.1f} output tok/s")
        for i, t in enumerate(result["trials"], 1):
            m = t["measured"]
            options = " ".join(f"{k}={v}" for k, v in t["options"].items())
            print(f"  {i:2}. {options}: " + (f"{m['output_tokens_per_s']:.1f} tok/s (predicted "
                                              f"{t['predicted']['output_tokens_per_s']:.1f})" if m else t["error"]))
        print(f"the guided order reached it (within {NOISE:.0%}) at trial {reached} of {grid}: "
              f"{reached / grid:.2f} of the grid (a third is {grid / 3:.1f} trials)", flush=True)
        if early_best is best_trial:
            print(f"a budget of {third} ran the grid's best itself")
            return 0
        compare(python, model, env, best_trial["options"], early_best["options"], third)
    return 0


if __name__ == "__main__":
    sys.exit(main())
