"""`npuops tune` with the real vLLM CPU engine: three real trials (each a foreground launch under npuops'
supervisor, a bench, a stop through the supervisor) write a tuned file that `npuops launch --tuned` accepts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.engine import engine_env, short_tmp_dir
from tests.support.http_server import free_port
from tests.support.workspace import Workspace

pytestmark = [pytest.mark.engine, pytest.mark.slow]

FLAGS = ("--hardware", "cpu", "--dtype", "float32", "--max-model-len", "256", "--enforce-eager",
         "--kv-cache-memory-bytes", str(128 * 2**20), "--input-len", "64", "--output-len", "8", "--concurrency", "8")


def test_tune_with_a_budget_of_three_writes_a_file_launch_accepts(engine_python: Path, tiny_model: Path,
                                                                  engine_compile_cache: Path, tmp_path: Path) -> None:
    tmp_dir = short_tmp_dir()
    env = engine_env(tmp_path / "work", tmp_dir, engine_compile_cache)
    env.update({"NPUOPS_STATE_DIR": str(tmp_path / "state"), "NPUOPS_STACK_PYTHON": str(engine_python)})
    ws = Workspace(env, tmp_path / "state", [tmp_dir])
    tuned = tmp_path / "tuned.json"
    try:
        done = ws.run("tune", str(tiny_model), *FLAGS, "--budget", "3", "--num-prompts", "16", "--port",
                      str(free_port()), "--vllm", str(engine_python.parent / "vllm"), "--output", str(tuned),
                      "--json", timeout=1200)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)
        trials = result["trials"]
        assert len(trials) == 3 and result["candidates"] > 3
        # The first trial is the plan's own batching; the others differ from it and from each other.
        assert len({json.dumps(t["options"], sort_keys=True) for t in trials}) == 3
        for trial in trials:
            assert trial["measured"] is not None, trial["error"]
            assert trial["measured"]["output_tokens_per_s"] > 0 and trial["predicted"]["output_tokens_per_s"] > 0
        best = max(trials, key=lambda t: t["measured"]["output_tokens_per_s"])
        assert result["best"]["options"] == best["options"]
        assert done.stderr.count("[############] stopped") == 3  # a progress bar per trial, each one stopped
        # Stopped by its own supervisor: the last trial's state says so and nothing serves on the trial port.
        status = ws.status("tune")
        assert status["state"] == "stopped"
        # Every bench calibrated the node: a stream in bursts (a busy host) or in chunks (--stream-interval) is timed
        # by the engine's own histograms instead, which the trial names.
        assert all(t["timed"] for t in trials), [t["stream_note"] for t in trials]
        assert all(t["stream_note"] is None or "bursts" in t["stream_note"] or "tokens a chunk" in t["stream_note"]
                   for t in trials)
        samples = json.loads((tmp_path / "state" / "calibration.json").read_text())["samples"]
        assert len(samples) == len(trials), (samples, [t["stream_note"] for t in trials])

        out = tmp_path / "dry"
        launched = ws.run("launch", "--tuned", str(tuned), "--dry-run", "--output", str(out), "--json")
        assert launched.returncode == 0, launched.stderr
        config = next(out.rglob("vllm.yaml")).read_text()
        for key, value in best["options"].items():
            assert f"{key.replace('_', '-')}: {value}" in config
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
