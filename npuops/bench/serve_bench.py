"""vLLM's own `vllm bench serve` against an endpoint: its command line, and its `--save-result` JSON read back.

The figures come from the JSON file the tool writes (vllm/benchmarks/serve.py, `result_json` merged with the
`metrics`), never from its printed table. Requests go to the OpenAI completions endpoint with vLLM's random
dataset: `--ignore-eos` makes every request produce exactly the asked output length, `--seed` picks the prompts
(a fresh seed per bench, so they are new to the instance's prefix cache; the plain-PyTorch baseline draws the same
ones with it), and the percentiles asked for are the median and p99 of TTFT, TPOT, ITL and end-to-end latency.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError, EnvironmentMissingError, MeasurementError
from npuops.parsing import ParseError
from npuops.wire import loads_json

METRICS = ("ttft", "tpot", "itl", "e2el")  # vLLM's names; e2el is end-to-end latency
RESULT_FILENAME = "vllm-bench-serve.json"


@dataclass(frozen=True)
class BenchLoad:
    """What a bench sends: the lengths, how many at once (or how fast), how many in all."""

    input_len: int
    output_len: int
    concurrency: int
    request_rate: float | None  # requests/s (Poisson arrivals); None sends them all at once, `concurrency` at most
    num_prompts: int
    seed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"input_len": self.input_len, "output_len": self.output_len, "concurrency": self.concurrency,
                "request_rate": self.request_rate, "num_prompts": self.num_prompts, "seed": self.seed}

    def describe(self) -> str:
        arriving = f"at {self.request_rate} requests/s, " if self.request_rate is not None else ""
        return (f"{self.num_prompts} prompts of {self.input_len} in / {self.output_len} out tokens, {arriving}"
                f"{self.concurrency} in flight at most")


@dataclass(frozen=True)
class Latency:
    median_ms: float
    p99_ms: float
    mean_ms: float

    def as_dict(self) -> dict[str, float]:
        return {"median_ms": round(self.median_ms, 3), "p99_ms": round(self.p99_ms, 3),
                "mean_ms": round(self.mean_ms, 3)}


@dataclass(frozen=True)
class ServeFigures:
    """What one benchmark run measured (vLLM's through `vllm bench serve`, or plain PyTorch's with the same keys)."""

    backend: str
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # requests/s
    output_throughput: float  # output tokens/s
    latency: dict[str, Latency]  # METRICS -> figures

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "completed": self.completed, "failed": self.failed,
                "duration_s": round(self.duration_s, 3), "total_input_tokens": self.total_input_tokens,
                "total_output_tokens": self.total_output_tokens,
                "request_throughput": round(self.request_throughput, 4),
                "output_throughput": round(self.output_throughput, 2),
                "latency": {k: v.as_dict() for k, v in self.latency.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServeFigures:
        """The inverse of as_dict (a stored bench read back)."""
        return cls(backend=str(data["backend"]), completed=int(data["completed"]), failed=int(data["failed"]),
                   duration_s=float(data["duration_s"]), total_input_tokens=int(data["total_input_tokens"]),
                   total_output_tokens=int(data["total_output_tokens"]),
                   request_throughput=float(data["request_throughput"]),
                   output_throughput=float(data["output_throughput"]),
                   latency={k: Latency(float(v["median_ms"]), float(v["p99_ms"]), float(v["mean_ms"]))
                            for k, v in dict(data["latency"]).items()})


def _number(data: Mapping[str, Any], key: str, source: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ParseError(source, f"{key!r} is missing or not a finite number (got {value!r})")
    return float(value)


def parse_serve_result(text: str, source: str = "vllm bench serve result") -> ServeFigures:
    """The figures of a `--save-result` JSON (or the plain-PyTorch baseline's, which uses the same keys)."""
    try:
        data = loads_json(text)
    except json.JSONDecodeError as exc:
        raise ParseError(source, f"not JSON ({exc.msg})", exc.lineno) from None
    if not isinstance(data, dict):
        raise ParseError(source, "not a JSON object")
    latency = {}
    for metric in METRICS:
        latency[metric] = Latency(_number(data, f"median_{metric}_ms", source),
                                  _number(data, f"p99_{metric}_ms", source),
                                  _number(data, f"mean_{metric}_ms", source))
    duration = data.get("duration", data.get("duration_s"))
    return ServeFigures(
        backend=str(data.get("backend") or "openai"),
        completed=int(_number(data, "completed", source)) if "completed" in data else int(
            _number(data, "num_prompts", source)),
        failed=int(data.get("failed") or 0),
        duration_s=_number({"duration": duration}, "duration", source),
        total_input_tokens=int(_number(data, "total_input_tokens", source)),
        total_output_tokens=int(_number(data, "total_output_tokens", source)),
        request_throughput=_number(data, "request_throughput", source),
        output_throughput=_number(data, "output_throughput", source),
        latency=latency,
    )


def bench_serve_argv(vllm: str, *, base_url: str, model_path: str, served_model_name: str, load: BenchLoad,
                     result_dir: Path) -> list[str]:
    """`vllm bench serve` for the load, saving its result in result_dir/RESULT_FILENAME. No secret: the API key
    goes in OPENAI_API_KEY, which the tool reads for its Authorization header."""
    argv = [vllm, "bench", "serve", "--backend", "openai", "--base-url", base_url,
            # The tokenizer is read from the model directory; requests name the model as it is served.
            "--model", model_path, "--served-model-name", served_model_name,
            "--dataset-name", "random", "--random-input-len", str(load.input_len),
            "--random-output-len", str(load.output_len), "--num-prompts", str(load.num_prompts),
            "--max-concurrency", str(load.concurrency), "--ignore-eos", "--seed", str(load.seed),
            # A batch of requests first, unmeasured: an engine's first prompts of a shape compile or allocate.
            "--num-warmups", str(load.concurrency),
            "--percentile-metrics", ",".join(METRICS), "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", str(result_dir), "--result-filename", RESULT_FILENAME,
            "--disable-tqdm"]
    if load.request_rate is not None:
        argv += ["--request-rate", str(load.request_rate)]
    return argv


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def run_bench_serve(argv: list[str], *, env: Mapping[str, str], result_dir: Path, timeout_s: float,
                    progress: Callable[[float], None] | None = None) -> ServeFigures:
    """Run `vllm bench serve` (argv from bench_serve_argv), calling `progress(elapsed_s)` every few seconds, and
    read its saved result. Its output goes to result_dir/vllm-bench-serve.log, quoted when it fails."""
    log_path = result_dir / "vllm-bench-serve.log"
    started = time.monotonic()
    try:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                                       stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        raise EnvironmentMissingError(f"cannot run {argv[0]}: {exc.strerror}",
                                      "install vLLM in the serving venv (`npuops provision`) or pass --vllm") from None
    done = threading.Event()

    def tick() -> None:
        while not done.wait(5.0):
            if progress is not None:
                progress(time.monotonic() - started)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        rc = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # Its own process group, started here: stopping it touches nothing else on the node.
        os.killpg(process.pid, 15)
        process.wait()
        raise MeasurementError(f"vllm bench serve did not finish within {timeout_s:.0f} s",
                          "lower --num-prompts, or check the instance (`npuops status NAME`)") from None
    except KeyboardInterrupt:
        os.killpg(process.pid, 15)
        process.wait()
        raise
    finally:
        done.set()
    result = result_dir / RESULT_FILENAME
    if rc != 0 or not result.exists():
        raise MeasurementError(f"vllm bench serve failed (exit {rc}): {_tail(log_path)}",
                          f"see {log_path}; check the instance answers (`npuops status NAME`)")
    try:
        figures = parse_serve_result(result.read_text(encoding="utf-8"), str(result))
    except ParseError as exc:
        raise MeasurementError(str(exc), f"the vLLM in the serving venv wrote a result npuops does not know; see "
                                         f"{log_path}") from None
    if figures.completed == 0:
        raise MeasurementError(f"vllm bench serve completed no request ({figures.failed} failed)",
                          f"see {log_path} and the instance's logs (`npuops logs NAME`)")
    return figures


def bench_environment(api_key: str | None) -> dict[str, str]:
    """This process's environment for the tool, with the key (never on its command line) and no proxy for the
    node's own endpoint."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY",)}
    env.update({"NO_PROXY": "127.0.0.1,localhost,::1", "no_proxy": "127.0.0.1,localhost,::1",
                "HF_HUB_OFFLINE": env.get("HF_HUB_OFFLINE", "1"), "PYTHONUNBUFFERED": "1"})
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    return env


def scratch_dir(parent: Path | None = None) -> Path:
    return Path(tempfile.mkdtemp(prefix="npuops-bench-", dir=parent))


def ensure_positive(load: BenchLoad) -> None:
    for name, value in (("--input-len", load.input_len), ("--output-len", load.output_len),
                        ("--concurrency", load.concurrency), ("--num-prompts", load.num_prompts)):
        if value < 1:
            raise BadInputError(f"{name} {value} is not a positive number", f"give {name} 1 or more")
    if load.request_rate is not None and not load.request_rate > 0:
        raise BadInputError(f"--request-rate {load.request_rate} is not positive", "give a rate above 0, or omit it")

