"""The plain-PyTorch bench process (npuops/bench/plain_pytorch.py) in the engine venv, and the small demo model.

- On the tiny model it yields every figure of `vllm bench serve --save-result`, exactly num_prompts * output_len
  output tokens, in batches of the size asked (the last one smaller);
- its prompts are the ones `vllm bench serve` itself sends for the same arguments: the real `vllm bench serve` runs
  against a stub OpenAI server here that records every completion request;
- bad requests and a missing environment exit 3 and 4 with one line on stderr;
- the small model (`--size small`) is made, within its size bounds, and vLLM's and transformers' config parsers take
  it.

The process runs as `ENGINE_PYTHON -m npuops.bench.plain_pytorch` from this checkout (PYTHONPATH, like
tests/support/engine.py's make_model): the engine venv's editable npuops may point at another checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_server import start_server, stop_server
from tests.support.paths import REPO

pytestmark = [pytest.mark.engine]

INPUT_LEN = 32
OUTPUT_LEN = 5
NUM_PROMPTS = 10
BATCH_SIZE = 4  # 3 batches: 4, 4, 2
SEED = 11
TIMEOUT_S = 300

# The small model's bounds (npuops/demo_model.py SHAPES["small"]: ~105 M float32 parameters).
SMALL_MODEL_MIN_BYTES = 300_000_000
SMALL_MODEL_MAX_BYTES = 500_000_000

METRIC_KEYS = [
    f"{stat}_{metric}_ms"
    for metric in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p99")
]


def bench_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})
    return env


def bench_request(model_dir: Path, /, **overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": str(model_dir), "dtype": "auto", "input_len": INPUT_LEN, "output_len": OUTPUT_LEN,
        "num_prompts": NUM_PROMPTS, "batch_size": BATCH_SIZE, "seed": SEED, "device": "cpu",
    }  # fmt: skip
    request.update(overrides)
    return request


def run_bench(
    python: Path | str, work: Path, request: object, *flags: str, raw: str | None = None
) -> subprocess.CompletedProcess[str]:
    work.mkdir(parents=True, exist_ok=True)
    request_path = work / "request.json"
    request_path.write_text(raw if raw is not None else json.dumps(request), encoding="utf-8")
    argv = [str(python), "-m", "npuops.bench.plain_pytorch", *flags, str(request_path), str(work / "result.json")]
    return subprocess.run(argv, cwd=REPO, env=bench_env(), capture_output=True, text=True, timeout=TIMEOUT_S)


def our_lines(stderr: str) -> list[str]:
    """The process's own stderr lines (torch and vLLM log lines of their own as they import)."""
    return [line for line in stderr.splitlines() if line.startswith(("plain_pytorch:", "batch ", "warm-up"))]


@pytest.fixture(scope="module")
def tiny_bench(engine_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("plain-pytorch")
    proc = run_bench(engine_python, work, bench_request(tiny_model))
    assert proc.returncode == 0, proc.stderr
    prompts = run_bench(engine_python, work / "prompts", bench_request(tiny_model), "--prompts-only")
    assert prompts.returncode == 0, prompts.stderr
    return {
        "result": json.loads((work / "result.json").read_text()),
        "stderr": proc.stderr,
        "prompts": json.loads((work / "prompts" / "result.json").read_text()),
    }


@pytest.mark.slow
def test_bench_gives_every_figure(tiny_bench: dict[str, Any]) -> None:
    result = tiny_bench["result"]
    assert result["backend"] == "transformers"
    assert (result["device"], result["dtype"]) == ("cpu", "float32")  # "auto": the tiny model's config
    assert isinstance(result["torch_threads"], int) and result["torch_threads"] >= 1
    assert set(result["versions"]) == {"torch", "transformers"}
    assert (result["num_prompts"], result["batch_size"], result["input_len"], result["output_len"]) == (
        NUM_PROMPTS, BATCH_SIZE, INPUT_LEN, OUTPUT_LEN,
    )  # fmt: skip
    assert result["completed"] == NUM_PROMPTS
    assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    assert result["duration"] == result["duration_s"] > 0
    assert result["request_throughput"] == pytest.approx(NUM_PROMPTS / result["duration"])
    assert result["output_throughput"] == pytest.approx(NUM_PROMPTS * OUTPUT_LEN / result["duration"])
    for key in METRIC_KEYS:
        assert isinstance(result[key], float) and result[key] >= 0, key
    assert 0 < result["median_ttft_ms"] < result["median_e2el_ms"]
    assert result["p99_tpot_ms"] >= result["median_tpot_ms"] > 0


@pytest.mark.slow
def test_bench_runs_static_batches_of_the_size_asked(tiny_bench: dict[str, Any]) -> None:
    assert our_lines(tiny_bench["stderr"]) == ["warm-up batch done", "batch 1/3 done", "batch 2/3 done",
                                               "batch 3/3 done"]
    assert "Traceback" not in tiny_bench["stderr"]
    assert len(tiny_bench["result"]["input_lens"]) == NUM_PROMPTS


@pytest.mark.slow
def test_prompts_are_vllm_random_datasets(tiny_bench: dict[str, Any]) -> None:
    prompts, prompt_lens = tiny_bench["prompts"]["prompts"], tiny_bench["prompts"]["prompt_lens"]
    # vLLM's own prompts: random token runs, some decoding to the same replacement characters (so not all unique).
    assert len(prompts) == NUM_PROMPTS and len(set(prompts)) > 1
    # vLLM's prompt_len leaves out the special tokens (one BOS here) the server adds: INPUT_LEN - 1, except where
    # its decode/re-encode round trip of random tokens came out longer (vLLM warns; `vllm bench serve` sends those
    # too).
    assert sum(n == INPUT_LEN - 1 for n in prompt_lens) >= NUM_PROMPTS // 2
    # transformers tokenized the same prompts to the same lengths, BOS included, as the server counts them.
    assert tiny_bench["result"]["input_lens"] == [n + 1 for n in prompt_lens]
    assert tiny_bench["result"]["total_input_tokens"] == sum(prompt_lens) + NUM_PROMPTS


_SSE_COMPLETION = (
    b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n'
    + b'data: {"choices": [{"index": 0, "text": "y"}]}\n\n'
    + b'data: {"choices": [], "usage": {"prompt_tokens": 32, "completion_tokens": 2}}\n\n'
    + b"data: [DONE]\n\n"
)


@pytest.mark.slow
def test_prompts_are_those_vllm_bench_serve_sends(
    engine_python: Path, tiny_model: Path, tiny_bench: dict[str, Any], tmp_path: Path
) -> None:
    server, base_url, seen = start_server({"/v1/completions": (200, _SSE_COMPLETION)})
    try:
        argv = [
            str(engine_python.parent / "vllm"), "bench", "serve", "--base-url", base_url,
            "--model", str(tiny_model), "--dataset-name", "random", "--random-input-len", str(INPUT_LEN),
            "--random-output-len", str(OUTPUT_LEN), "--num-prompts", str(NUM_PROMPTS), "--seed", str(SEED),
            "--ignore-eos", "--max-concurrency", str(BATCH_SIZE), "--ready-check-timeout-sec", "0",
        ]  # fmt: skip
        env = {**bench_env(), "VLLM_PLUGINS": ""}
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    finally:
        stop_server(server)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    bodies = [json.loads(s.body) for s in seen if s.method == "POST" and s.path == "/v1/completions"]
    ours = tiny_bench["prompts"]["prompts"]
    # Every prompt once (--ready-check-timeout-sec 0, the default: no initial test request), in any order.
    assert Counter(b["prompt"] for b in bodies) == Counter(ours)
    assert {(b["max_tokens"], b["ignore_eos"]) for b in bodies} == {(OUTPUT_LEN, True)}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "cannot read the request"),
        ('["a list"]', "must be a JSON object"),
        ('{"model": "/nonexistent"}', "the request lacks"),
    ],
)
def test_unreadable_requests_exit_3_with_one_line(
    engine_python: Path, tmp_path: Path, raw: str, message: str
) -> None:
    proc = run_bench(engine_python, tmp_path, None, raw=raw)
    assert proc.returncode == 3
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": "/nonexistent/model"}, "does not exist"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"output_len": "5"}, "output_len must be an integer"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"device": "gpu"}, "device must be one of"),
    ],
)
def test_bad_requests_exit_3_with_one_line(
    engine_python: Path, tiny_model: Path, tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    proc = run_bench(engine_python, tmp_path, bench_request(tiny_model, **overrides))
    assert proc.returncode == 3
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "result.json").exists()


def test_without_torch_exits_4_with_one_line(tiny_model: Path, tmp_path: Path) -> None:
    # The test runner's own venv has neither torch nor transformers: the environment, not the request, is wrong.
    proc = run_bench(sys.executable, tmp_path, bench_request(tiny_model))
    assert proc.returncode == 4
    assert len(proc.stderr.splitlines()) == 1 and "serving venv" in proc.stderr, proc.stderr


def test_npu_without_torch_npu_exits_4(engine_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    proc = run_bench(engine_python, tmp_path, bench_request(tiny_model, device="npu"))
    assert proc.returncode == 4
    (line,) = our_lines(proc.stderr)  # torch may log a warning of its own as it imports
    assert line.startswith("plain_pytorch: error: device npu asked for but torch_npu does not import")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_prompts_vllm_cannot_make_exit_3(engine_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    # One token is all BOS: vLLM's random dataset has nothing left to sample.
    proc = run_bench(engine_python, tmp_path, bench_request(tiny_model, input_len=1), "--prompts-only")
    assert proc.returncode == 3
    (line,) = our_lines(proc.stderr)
    assert "random dataset cannot make these prompts" in line and "Traceback" not in proc.stderr


_SMALL_MODEL_CHECK = r"""
import json, sys
from vllm.transformers_utils.config import get_config
import transformers
path = sys.argv[1]
config = get_config(path, trust_remote_code=False)
with __import__("torch").device("meta"):
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path))
print(json.dumps({
    "model_type": config.model_type, "head_dim": config.head_dim, "layers": config.num_hidden_layers,
    "hidden": config.hidden_size, "dtype": str(config.dtype), "vocab": config.vocab_size,
    "parameters": sum(p.numel() for p in model.parameters()),
}))
"""


@pytest.mark.slow
def test_small_model_is_made_within_bounds(engine_python: Path, small_model: Path, tiny_model: Path) -> None:
    weights = (small_model / "model.safetensors").stat().st_size
    assert SMALL_MODEL_MIN_BYTES <= weights <= SMALL_MODEL_MAX_BYTES
    # The tokenizer is the tiny model's, whatever the size.
    assert (small_model / "tokenizer.json").read_bytes() == (tiny_model / "tokenizer.json").read_bytes()
    proc = subprocess.run(
        [str(engine_python), "-c", _SMALL_MODEL_CHECK, str(small_model)],
        cwd=REPO, env={**bench_env(), "VLLM_PLUGINS": ""}, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout.splitlines()[-1])
    assert facts["model_type"] == "llama"
    assert facts["head_dim"] == 64  # one the CPU attention backend serves
    assert (facts["layers"], facts["hidden"], facts["vocab"]) == (8, 1024, 1024)
    assert facts["dtype"] == "torch.float32"
    assert facts["parameters"] * 4 == pytest.approx(weights, rel=0.01)
