"""The plan for the CPU target against the real vLLM CPU engine, started from the files npuops renders.

Proves two things at once: vLLM accepts the rendered `vllm serve --config` file and environment, and
the planner's KV-cache capacity in tokens equals what the engine reports at start-up.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from npuops.envfile import parse_env_file
from tests.support.engine import start_engine
from tests.support.http_server import free_port
from tests.support.paths import REPO

pytestmark = [pytest.mark.engine, pytest.mark.slow]

KV_BYTES = 256 * 2**20


def test_rendered_config_starts_the_engine_and_kv_tokens_match_the_plan(
    engine_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rendered"
    port = free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "npuops",
            "launch",
            str(tiny_model),
            "--hardware",
            "cpu",
            "--dtype",
            "float32",
            "--max-model-len",
            "512",
            "--input-len",
            "128",
            "--output-len",
            "32",
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            str(KV_BYTES),
            "--name",
            "tiny",
            "--port",
            str(port),
            "--vllm",
            str(Path(engine_python).parent / "vllm"),
            "--dry-run",
            "--output",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["plan"]
    planned = plan["memory"]["kv_cache_tokens"]

    env = parse_env_file((out / "env").read_text())
    engine = start_engine(
        engine_python, tiny_model, port, extra_args=["--config", str(out / "vllm.yaml")], env=env, serve_args=()
    )  # default work dir: short, for zmq socket paths
    try:
        engine.wait_healthy()
        reported = engine.kv_cache_tokens()
        assert reported is not None, engine.log_tail()
        assert planned == reported, f"plan says {planned} KV tokens, the engine {reported}"
        status, body = engine.post(
            "/v1/completions",
            {"model": plan["config"]["served_model_name"], "prompt": "hello", "max_tokens": 4, "temperature": 0},
        )
        assert status == 200 and json.loads(body)["choices"][0]["finish_reason"] in ("length", "stop")
    finally:
        engine.stop()
