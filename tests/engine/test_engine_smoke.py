"""Smoke tests of the engine test infrastructure: the tiny model is deterministic, and a real `vllm serve` (CPU)
of it answers health, models, a greedy completion with logprobs and metrics, and reports its KV capacity."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.engine import KV_CACHE_BYTES, MAX_MODEL_LEN, EngineProcess, parse_kv_cache_tokens, prometheus_samples
from tests.support.paths import REPO

pytestmark = [pytest.mark.engine, pytest.mark.slow]

NOISE = 0.01

# Run in the engine python (torch, transformers, safetensors live there): make four models and report.
_DETERMINISM_SCRIPT = r"""
import hashlib, json, sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from npuops.demo_model import make_tiny_model

root, noise = Path(sys.argv[1]), float(sys.argv[2])
specs = {"seed0": (0, 0.0), "seed0-again": (0, 0.0), "seed1": (1, 0.0), "seed0-noisy": (0, noise)}
dirs = {name: make_tiny_model(root / name, seed=seed, noise=n) for name, (seed, n) in specs.items()}
digests = {
    name: {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}
    for name, d in dirs.items()
}
base = load_file(dirs["seed0"] / "model.safetensors")
noisy = load_file(dirs["seed0-noisy"] / "model.safetensors")
rel = {k: float((noisy[k].double() - v.double()).norm() / v.double().norm()) for k, v in base.items()}
all_base = torch.cat([v.double().flatten() for v in base.values()])
all_noisy = torch.cat([noisy[k].double().flatten() for k in base])
json.dump({
    "digests": digests,
    "relative_change": rel,
    "overall_relative_change": float((all_noisy - all_base).norm() / all_base.norm()),
    "dtypes": sorted({str(v.dtype) for v in base.values()}),
    "numel": sum(v.numel() for v in base.values()),
    "config": json.loads((dirs["seed0"] / "config.json").read_text()),
    "tokenizer_len": len(AutoTokenizer.from_pretrained(dirs["seed0"])),
    "file_modes": sorted({oct(p.stat().st_mode & 0o777) for p in dirs["seed0"].iterdir()}),
}, sys.stdout)
"""


def test_tiny_model_is_deterministic(engine_python: Path, tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    proc = subprocess.run(
        [str(engine_python), "-c", _DETERMINISM_SCRIPT, str(tmp_path), repr(NOISE)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    digests = report["digests"]

    # Same seed: every file byte-identical. Another seed or noise: other weights, same tokenizer and config.
    assert digests["seed0"] == digests["seed0-again"]
    for other in ("seed1", "seed0-noisy"):
        assert digests[other]["model.safetensors"] != digests["seed0"]["model.safetensors"]
        for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
            assert digests[other][name] == digests["seed0"][name], name

    # Noise of the requested size relative to every tensor (||Δ|| / ||W||), seeded, so exact bounds are stable.
    for tensor, change in report["relative_change"].items():
        assert 0.7 * NOISE < change < 1.3 * NOISE, (tensor, change)
    assert report["overall_relative_change"] == pytest.approx(NOISE, rel=0.05)

    config = report["config"]
    assert config["model_type"] == "llama"
    assert config["hidden_size"] // config["num_attention_heads"] == config["head_dim"] == 32
    assert config["num_hidden_layers"] == 2 and config["num_key_value_heads"] == 2
    assert config["vocab_size"] == report["tokenizer_len"] == 1024
    assert report["dtypes"] == ["torch.float32"]
    assert report["numel"] < 300_000  # tiny: ~0.9 MB of float32
    assert "0o600" not in report["file_modes"]  # readable by a service user, not only by its maker


def test_kv_cache_line_parser() -> None:
    line = (
        "(EngineCore pid=21408) INFO 11-29 11:08:38 [kv_cache_utils.py:2327] CPU KV cache size: 262,144 tokens, "
        "Maximum concurrency for 512 tokens per request: 512.00x"
    )
    assert parse_kv_cache_tokens(line) == 262_144
    assert parse_kv_cache_tokens("GPU KV cache size: 1,234,567 tokens") == 1_234_567
    assert parse_kv_cache_tokens("no such line") is None


def test_health(running_engine: EngineProcess) -> None:
    status, _ = running_engine.get("/health")
    assert status == 200
    assert running_engine.process.poll() is None
    print(  # shown with -s or -rP: the numbers the README quotes
        f"engine healthy after {running_engine.healthy_after_s:.1f} s, first logprobs request "
        f"{running_engine.first_request_s:.1f} s, KV cache {running_engine.kv_cache_tokens()} tokens"
    )


def test_models_lists_the_tiny_model(running_engine: EngineProcess) -> None:
    status, body = running_engine.get("/v1/models")
    assert status == 200
    models = json.loads(body)["data"]
    assert [m["id"] for m in models] == [running_engine.served_model_name]
    assert models[0]["max_model_len"] == MAX_MODEL_LEN


def _complete(engine: EngineProcess, prompt: str) -> dict[str, Any]:
    status, body = engine.post(
        "/v1/completions",
        {"model": engine.served_model_name, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1},
    )
    assert status == 200, body[:2000]
    result: dict[str, Any] = json.loads(body)
    return result


def test_greedy_completion_with_logprobs(running_engine: EngineProcess) -> None:
    first = _complete(running_engine, "Hello world, the engine is")
    choice = first["choices"][0]
    assert choice["finish_reason"] == "length"
    assert first["usage"]["completion_tokens"] == 8
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 8
    assert all(isinstance(lp, float) and lp <= 0.0 for lp in logprobs["token_logprobs"])
    # Greedy: the chosen token is the top-1 alternative, with the same logprob.
    for token, lp, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True):
        assert top[token] == pytest.approx(lp, abs=1e-6)
    # Deterministic: the same request again gives the same tokens and logprobs.
    again = _complete(running_engine, "Hello world, the engine is")["choices"][0]["logprobs"]
    assert again["tokens"] == logprobs["tokens"]
    assert again["token_logprobs"] == pytest.approx(logprobs["token_logprobs"], abs=1e-5)


def _metrics(engine: EngineProcess) -> str:
    status, body = engine.get("/metrics")
    assert status == 200
    return body.decode()


def test_metrics(running_engine: EngineProcess) -> None:
    text = _metrics(running_engine)
    usage = prometheus_samples(text, "vllm:kv_cache_usage_perc")
    assert usage and all(0.0 <= value <= 1.0 for _, value in usage)
    info = prometheus_samples(text, "vllm:cache_config_info")
    assert len(info) == 1 and info[0][1] == 1.0
    assert info[0][0]["block_size"].isdigit()


def test_kv_cache_tokens_logged_equal_metrics_and_arithmetic(running_engine: EngineProcess, tiny_model: Path) -> None:
    logged = running_engine.kv_cache_tokens()
    assert logged is not None, f"no 'KV cache size: N tokens' line in the log:\n{running_engine.log_tail()}"

    labels = prometheus_samples(_metrics(running_engine), "vllm:cache_config_info")[0][0]
    # vLLM 0.32 exports it; older releases did not (then only the log has it).
    assert "kv_cache_size_tokens" in labels, sorted(labels)
    assert int(labels["kv_cache_size_tokens"]) == logged

    # num_blocks = bytes // (block_size x bytes per token over all layers); capacity = num_blocks x block_size
    # (the block size divides max_model_len here, so vLLM's concurrency x max_model_len is exactly that).
    config = json.loads((tiny_model / "config.json").read_text())
    block_size = int(labels["block_size"])
    kv_bytes = 256 * 2**20
    assert KV_CACHE_BYTES == "256M" and int(labels["kv_cache_memory_bytes"]) == kv_bytes
    bytes_per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 4
    num_blocks = kv_bytes // (block_size * bytes_per_token)
    assert MAX_MODEL_LEN % block_size == 0
    assert int(labels["num_gpu_blocks"]) == num_blocks
    assert logged == num_blocks * block_size
    assert running_engine.max_concurrency() == pytest.approx(logged / MAX_MODEL_LEN, abs=0.01)
