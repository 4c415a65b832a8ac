"""`npuops tune` against a full grid of the same space, on this machine's vLLM CPU engine (the tiny model).

Run: `python benchmarks/tune_vs_grid.py` (NPUOPS_ENGINE_PYTHON or the engine venv). One `npuops tune` with a budget
as large as the space runs every candidate, in the order the guide picks them. The guide's choice of the k-th trial
depends only on the trials before it, so the first k trials of this run are exactly what `--budget k` runs: the
run is the full grid and every smaller budget at once, measured side by side. It prints the grid's best, and the
first trial at which the guided order reached it (within the run's noise, 5%), against a third of the grid.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLAGS = ["--hardware", "cpu", "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
         "--kv-cache-memory-bytes", str(256 * 2**20), "--input-len", "128", "--output-len", "32", "--concurrency", "16"]
NOISE = 0.05


def main() -> int:
    python = Path(os.environ.get("NPUOPS_ENGINE_PYTHON") or subprocess.run(
        [str(REPO / "scripts" / "engine-venv.sh")], check=True, capture_output=True, text=True).stdout.split()[-1])
    with tempfile.TemporaryDirectory(prefix="npuops-tune-grid-") as tmp:
        work = Path(tmp)
        model = work / "tiny-llama"
        subprocess.run([str(python), "-m", "npuops.demo_model", str(model)], check=True, capture_output=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "NPUOPS_STATE_DIR": str(work / "state"), "NPUOPS_STACK_PYTHON": str(python),
               "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "TMPDIR": tempfile.mkdtemp(dir="/tmp")}
        done = subprocess.run([str(python), "-m", "npuops", "tune", str(model), *FLAGS, "--budget", "100",
                               "--num-prompts", "48", "--port", str(port), "--vllm", str(python.parent / "vllm"),
                               "--output", str(work / "tuned.json"), "--json"], env=env, cwd=REPO,
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        result = json.loads(done.stdout)
    trials = [t for t in result["trials"] if t["measured"]]
    best = max(t["measured"]["output_tokens_per_s"] for t in trials)
    reached = next(i for i, t in enumerate(result["trials"], 1)
                   if t["measured"] and t["measured"]["output_tokens_per_s"] >= best * (1 - NOISE))
    grid = len(result["trials"])
    print(f"grid: {grid} trials, best {best:.1f} output tok/s")
    for i, t in enumerate(result["trials"], 1):
        m = t["measured"]
        options = " ".join(f"{k}={v}" for k, v in t["options"].items())
        print(f"  {i:2}. {options}: " + (f"{m['output_tokens_per_s']:.1f} tok/s (predicted "
                                          f"{t['predicted']['output_tokens_per_s']:.1f})" if m else t["error"]))
    print(f"the guided order reached it (within {NOISE:.0%}) at trial {reached} of {grid}: "
          f"{reached / grid:.2f} of the grid (a third is {grid / 3:.1f} trials)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
