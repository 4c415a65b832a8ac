"""`npuops profile` on the real vLLM CPU engine: the tiny model launched with --profiling (in the foreground, under
npuops' supervisor), profiled for a few seconds while a client keeps it busy; the summary names the CPU engine's own
operators from vLLM's torch-profiler traces, whose copies it leaves in --output."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from tests.support.http_server import free_port, http_request
from tests.support.npuops_cli import npuops_argv
from tests.support.systemd import TINY_FLAGS
from tests.support.workspace import foreground_launch, foreground_workspace

pytestmark = [pytest.mark.engine, pytest.mark.slow]

START_TIMEOUT_S = 600.0


def test_a_profile_under_load_names_the_engines_operators(engine_python: Path, tiny_model: Path,
                                                          engine_compile_cache: Path, tmp_path: Path) -> None:
    ws = foreground_workspace(tmp_path, engine_python, engine_compile_cache)
    try:
        port = free_port()
        argv = npuops_argv("launch", str(tiny_model), *TINY_FLAGS, "--name", "pf", "--port", str(port),
                           "--vllm", str(engine_python.parent / "vllm"), "--profiling", "--foreground")
        with foreground_launch(argv, ws.env, tmp_path, START_TIMEOUT_S):
            stop = threading.Event()
            answered: list[int] = []

            def load() -> None:
                body = {"model": "tiny-llama", "prompt": "Hello " * 40, "max_tokens": 32, "temperature": 0}
                while not stop.is_set():
                    answered.append(http_request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                                 timeout=120)[0])

            client = threading.Thread(target=load, daemon=True)
            client.start()
            try:
                out = tmp_path / "profile"
                done = subprocess.run(npuops_argv("profile", "pf", "--seconds", "4", "--steps", "40", "--output",
                                                  str(out), "--json"), env=ws.env, capture_output=True, text=True,
                                      timeout=600)
            finally:
                stop.set()
                client.join(timeout=180)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
        assert answered and all(code == 200 for code in answered), answered
        summary = json.loads(done.stdout)
        # The engine wrote its traces where launch pointed the profiler; profile copied them out.
        traces = [Path(p) for p in summary["traces"]]
        assert traces and all(p.is_file() and p.parent.is_relative_to(out) for p in traces)
        assert any(p.name.endswith(".pt.trace.json.gz") for p in traces)
        # --steps bounds the trace: the engine recorded at most 40 steps of its busy loop (vLLM's step annotations).
        assert summary["steps"] == 40
        names = [o["name"] for o in summary["top_operators"]]
        # The CPU engine's own operators, by name: its linear layers' matmuls are among the longest.
        assert any(n.startswith("aten::") for n in names), names
        assert summary["shares"]["matmul"] > 0.05 and summary["total_ms"] > 0, summary
        assert sum(summary["shares"].values()) == pytest.approx(1.0, abs=0.01)
        assert summary["top_operators"][0]["self_ms"] >= summary["top_operators"][-1]["self_ms"]
    finally:
        for tmp_dir in ws.tmp_dirs:
            shutil.rmtree(tmp_dir, ignore_errors=True)
