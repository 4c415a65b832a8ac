"""`vllm serve` processes of the real engine (the CPU build) serving the tiny demo model, and that model.

The engine lives in its own venv outside the repository (scripts/engine-venv.sh); its python comes from
NPUOPS_ENGINE_PYTHON. Without it `engine_python_or_skip` skips, unless NPUOPS_REQUIRE_ENGINE=1, where a missing
engine is a test error (CI sets it so the engine tests cannot silently vanish). The fixtures (tests/engine/conftest.py)
call these.

`start_engine` does not wait; call `.wait_healthy()`. Every engine is started in its own process group, so `.stop()`
also reaps the EngineCore and worker processes after a kill -9 of the API server.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support.http_server import free_port, http_request, worker_index
from tests.support.paths import REPO

ENGINE_PYTHON_ENV = "NPUOPS_ENGINE_PYTHON"
REQUIRE_ENGINE_ENV = "NPUOPS_REQUIRE_ENGINE"

# The recipe (tests/engine/README.md): float32, a short context, no graph capture, and an explicit
# KV cache size (on the CPU a utilization fraction applies to the NUMA node's RAM and startup fails without one).
# "256M" is binary for vLLM (2**28 bytes); "256m" would be decimal (256e6).
KV_CACHE_BYTES = "256M"
MAX_MODEL_LEN = 512
SERVE_ARGS: tuple[str, ...] = (
    "--dtype",
    "float32",
    "--max-model-len",
    str(MAX_MODEL_LEN),
    "--enforce-eager",
    "--kv-cache-memory-bytes",
    KV_CACHE_BYTES,
)
HEALTH_TIMEOUT_S = 180.0
MODEL_TIMEOUT_S = 180.0

# vllm/v1/core/kv_cache_utils.py (update_kv_cache_capacity), 0.32:
#   "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
# with the device name ("CPU" here, "GPU" on CUDA, maybe "NPU" under vllm-ascend) and thousands separators, e.g.
#   (EngineCore pid=1) INFO 11-29 11:08:38 [kv_cache_utils.py:2327] CPU KV cache size: 262,144 tokens, Maximum ...
KV_CACHE_LINE = re.compile(r"(?:(\w[\w +]*?) )?KV cache size: ([\d,]+) tokens")
MAX_CONCURRENCY_LINE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


class EngineError(RuntimeError):
    """The engine died or did not become healthy; the message carries the end of its log."""


def parse_kv_cache_tokens(log_text: str) -> int | None:
    """The engine's KV capacity in tokens from its start-up log (the last such line), or None."""
    matches = KV_CACHE_LINE.findall(log_text)
    if not matches:
        return None
    return int(matches[-1][1].replace(",", ""))


def prometheus_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one metric in Prometheus text format: [(labels, value)]."""
    samples = []
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{(.*)\}})?\s+(\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            labels = {k: v for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1) or "")}
            samples.append((labels, float(m.group(2))))
    return samples


@dataclass
class EngineProcess:
    """A `vllm serve` started by `start_engine`: its process (group leader), address, work dir and log."""

    process: subprocess.Popen[bytes]
    host: str
    port: int
    model: Path
    log_path: Path
    work_dir: Path
    tmp_dir: Path
    argv: list[str]
    started_at: float = field(default_factory=time.monotonic)
    healthy_after_s: float | None = None
    first_request_s: float | None = None
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def served_model_name(self) -> str:
        """The model id in /v1/models and requests: vLLM's default is the model path as given."""
        return str(self.model)

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def kv_cache_tokens(self) -> int | None:
        """`N` from the engine's `... KV cache size: N tokens` start-up line (None before it is logged)."""
        return parse_kv_cache_tokens(self.log_text())

    def max_concurrency(self) -> float | None:
        matches = MAX_CONCURRENCY_LINE.findall(self.log_text())
        return float(matches[-1][1]) if matches else None

    def get(self, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
        return http_request(self.base_url + path, timeout=timeout)

    def post(self, path: str, data: Mapping[str, Any], timeout: float = 60.0) -> tuple[int, bytes]:
        return http_request(self.base_url + path, data=data, timeout=timeout)

    def is_healthy(self) -> bool:
        try:
            status, _ = self.get("/health", timeout=5.0)
        except (OSError, http.client.HTTPException):  # refused until the port opens; reset while it goes down
            return False
        return status == 200

    def wait_healthy(self, timeout: float = HEALTH_TIMEOUT_S, poll: float = 0.5) -> float:
        """Poll /health until 200; return the seconds since start. Raise EngineError (with the log's end) when
        the process exits first or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while True:
            if self.is_healthy():
                self.healthy_after_s = time.monotonic() - self.started_at
                return self.healthy_after_s
            rc = self.process.poll()
            if rc is not None:
                raise EngineError(f"engine exited with rc {rc} before it was healthy; log:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise EngineError(f"engine not healthy after {timeout:.0f} s; log:\n{self.log_tail()}")
            time.sleep(poll)

    def warm_up(self, timeout: float = 120.0) -> float:
        """Send one greedy 1-token request with logprobs and return its seconds. The first request that asks for
        logprobs torch.compiles vLLM's `batched_count_greater_than` (inductor, even with --enforce-eager): 15-20 s
        on 2 cores, ~8 s with a warm TORCHINDUCTOR_CACHE_DIR, 0.03 s afterwards. Warming up keeps that cost out of
        the tests' own timings."""
        started = time.monotonic()
        status, body = self.post(
            "/v1/completions",
            {"model": self.served_model_name, "prompt": "warm up", "max_tokens": 1, "temperature": 0, "logprobs": 1},
            timeout=timeout,
        )
        if status != 200:
            raise EngineError(f"warm-up request failed with HTTP {status}: {body[:500]!r}; log:\n{self.log_tail()}")
        self.first_request_s = time.monotonic() - started
        return self.first_request_s

    def signal(self, sig: int) -> None:
        """Send `sig` to the API server process only (e.g. SIGKILL to simulate a crash, SIGSTOP to freeze it)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait up to `timeout`, then SIGKILL; afterwards SIGKILL whatever is left of the process group
        (EngineCore, workers) so nothing outlives the test, and remove the engine's TMPDIR. Returns the API
        server's exit code."""
        try:
            if self.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.process.pid, signal.SIGCONT)  # a frozen engine cannot act on SIGTERM
                    os.kill(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(timeout=30)
            self._kill_group_leftovers()
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
        return int(self.process.returncode)

    def _kill_group_leftovers(self) -> None:
        # The group id is the API server's pid (start_new_session); children that outlived it keep that group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


def short_tmp_dir() -> Path:
    """A new temp dir with a short path: vLLM puts its ZeroMQ `ipc://` sockets in TMPDIR, and a Unix socket path
    longer than 107 bytes fails (a pytest tmp_path nested a few levels is already too long)."""
    root = "/tmp" if os.access("/tmp", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="npuops-tmp-", dir=root))


CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def worker_cpu_binding() -> dict[str, str]:
    """Under pytest-xdist, the core of its own that each worker's engines bind their OpenMP threads to
    (VLLM_CPU_OMP_THREADS_BIND), as {name: value}; {} outside xdist or on one core. vLLM's automatic binding puts
    every engine's threads on the first core and keeps the last for the API server, so the engines of two
    workers would share one core while the other idles. An instance whose plan binds its replicas itself (npuops'
    env file: several engines on one host) keeps its own binding."""
    index = worker_index()
    cores = sorted(os.sched_getaffinity(0))
    if index is None or len(cores) < 2:
        return {}
    return {CPU_BIND_ENV: str(cores[index % len(cores)])}


def engine_env(work_dir: Path, tmp_dir: Path, compile_cache_dir: Path | None = None) -> dict[str, str]:
    """This process's environment with the recipe's on top: offline, vLLM's cache inside `work_dir`, TMPDIR
    `tmp_dir` (see short_tmp_dir), torch inductor's cache in `compile_cache_dir` when given (to share it between
    engines), no usage reports."""
    env = dict(os.environ)
    (work_dir / "vllm-cache").mkdir(parents=True, exist_ok=True)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(work_dir / "hf-home"),
            "VLLM_CACHE_ROOT": str(work_dir / "vllm-cache"),
            "TMPDIR": str(tmp_dir),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
            "TORCHINDUCTOR_CACHE_DIR": str(compile_cache_dir or work_dir / "inductor-cache"),
        }
    )
    # Never inherit a service manager's socket from the test runner's environment.
    env.pop("NOTIFY_SOCKET", None)
    for name, value in worker_cpu_binding().items():
        env.setdefault(name, value)
    return env


def vllm_command(python: str | os.PathLike[str]) -> list[str]:
    """`<venv>/bin/vllm` beside the engine python (scripts/engine-venv.sh makes it work); else the API server
    module, which takes the same flags but the model as `--model`."""
    script = Path(python).parent / "vllm"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), "serve"]
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model"]


def start_engine(
    python: str | os.PathLike[str],
    model: str | os.PathLike[str],
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    host: str = "127.0.0.1",
    work_dir: Path | None = None,
    compile_cache_dir: Path | None = None,
    serve_args: Sequence[str] = SERVE_ARGS,
) -> EngineProcess:
    """Start `vllm serve MODEL --host HOST --port PORT <serve_args> <extra_args>` in its own process group, with
    stdout and stderr in `<work_dir>/engine.log`, and return at once (see `EngineProcess.wait_healthy`).

    The environment is this process's, then the recipe's (`engine_env`), then `env` on top (e.g.
    `{"VLLM_CPU_OMP_THREADS_BIND": "0|1"}`). `port` defaults to a free one; `work_dir` to a new temp dir (kept
    afterwards for its log); `compile_cache_dir` (torch inductor's cache) to one inside `work_dir` — pass the
    session's `engine_compile_cache` to share it."""
    if work_dir is None:
        work_dir = Path(tempfile.mkdtemp(prefix="npuops-engine-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port(host) if port is None else port
    model_path = Path(model)
    argv = [
        *vllm_command(python),
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        *serve_args,
        *extra_args,
    ]
    tmp_dir = short_tmp_dir()
    log_path = work_dir / "engine.log"
    log_file = open(log_path, "ab")  # noqa: SIM115 - owned by the EngineProcess, closed in stop()
    log_file.write(f"# npuops test: {' '.join(argv)}\n".encode())
    log_file.flush()
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**engine_env(work_dir, tmp_dir, compile_cache_dir), **(env or {})},
        cwd=work_dir,
        start_new_session=True,
    )
    return EngineProcess(
        process=process,
        host=host,
        port=port,
        model=model_path,
        log_path=log_path,
        work_dir=work_dir,
        tmp_dir=tmp_dir,
        argv=argv,
        _log_file=log_file,
    )


def make_model(
    python: str | os.PathLike[str], dest: Path, *, seed: int = 0, noise: float = 0.0, size: str = "tiny"
) -> Path:
    """Make a demo model (the tiny one unless `size` says "small") with the engine python (`python -m
    npuops.demo_model`), from this checkout."""
    argv = [str(python), "-m", "npuops.demo_model", str(dest), "--seed", str(seed), "--noise", repr(noise)]
    if size != "tiny":  # the tiny model's command line stays what it always was
        argv += ["--size", size]
    env = dict(os.environ)
    # This checkout's npuops first, whatever checkout the engine venv was installed from.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=MODEL_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with rc {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return dest


def engine_python_or_skip() -> Path:
    """The engine venv's python (NPUOPS_ENGINE_PYTHON); skip without it, or fail as the module docstring says."""
    value = os.environ.get(ENGINE_PYTHON_ENV, "")
    required = os.environ.get(REQUIRE_ENGINE_ENV, "") == "1"
    if not value:
        reason = (
            f"{ENGINE_PYTHON_ENV} is not set: build the engine venv with scripts/engine-venv.sh and set "
            f"{ENGINE_PYTHON_ENV} to the python it prints"
        )
        if required:
            pytest.fail(f"{REQUIRE_ENGINE_ENV}=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    python = Path(value)
    if not (python.is_file() and os.access(python, os.X_OK)):
        # Set but wrong is always an error: someone asked for the engine tests.
        pytest.fail(f"{ENGINE_PYTHON_ENV}={value} is not an executable file", pytrace=False)
    return python


# A greedy completion of 8 tokens from inside a test host (argv: base URL, model); prints its tokens and text.
COMPLETION_SCRIPT = r"""
import json, sys, urllib.request
request = urllib.request.Request(sys.argv[1] + "/v1/completions", method="POST",
    data=json.dumps({"model": sys.argv[2], "prompt": "The capital of", "max_tokens": 8, "temperature": 0}).encode(),
    headers={"Content-Type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(request, timeout=120) as answer:
    body = json.loads(answer.read())
print(json.dumps({"tokens": body["usage"]["completion_tokens"], "text": body["choices"][0]["text"]}))
"""
