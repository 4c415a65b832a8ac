"""What vllm-router costs in front of two vLLM replicas, and what its cache-aware policy buys on shared prefixes.

Two `vllm serve` replicas of the tiny demo model (npuops.demo_model, made in a temp dir unless --model DIR) run on
the real vLLM CPU engine of the engine venv, with prefix caching on; two vllm-routers (PyPI `vllm-router`, the Rust
router) sit in front of the same replicas at the same time, one with `--policy round_robin`, one with
`--policy cache_aware`, each on its own port. Everything binds 127.0.0.1 on free ports. The client is this script
(aiohttp, streaming /v1/completions, `ignore_eos` so every request yields exactly max_tokens tokens); TTFT is the time
from sending a request to its first streamed chunk that carries a generated token (its text may be empty: the tiny
model's tokens are often partial UTF-8).

(a) Overhead: the same kind of batch (distinct ~32-token prompts, so no prefix-cache hits) at 16 concurrent requests
    through each arm:
        direct   the client itself alternates the two replicas' URLs (request i -> replica i mod 2)
        rr       through the round_robin router
        ca       through the cache_aware router
    The arms run interleaved, their order rotating each round (direct rr ca, rr ca direct, ...), after one untimed
    warm-up batch per arm, so drift on a noisy machine hits all of them; the medians over rounds and their ratios
    router/direct are what to read (goal: throughput >= 0.95).
(b) Shared prefixes: G groups (default 8) of R requests each (default 8) share a common ~200-token prefix and have
    distinct ~16-token suffixes; the requests come in waves of one per group, the groups shuffled within each wave
    (a fixed order would let round robin pin each group to one replica by accident when G is even), 16 in flight.
    Each round sends a fresh set of prefixes through cache_aware and then another fresh set through round_robin
    (alternating which goes first), and reads the replicas' Prometheus counters `vllm:prefix_cache_queries_total`
    and `vllm:prefix_cache_hits_total` (prompt tokens looked up / found in the prefix cache) before and after:
    hit rate = sum of hit deltas / sum of query deltas over both replicas. The routers' own
    `vllm_router_policy_decisions_total` shows how each spread the requests.

Run with the engine venv's python (it has vllm, vllm-router and aiohttp); npuops comes from this checkout:

    PYTHONPATH=. /opt/npuops-engine/venv/bin/python benchmarks/router_overhead.py [--quick] [--rounds 3] [--keep]

The default run took about 6 minutes on 2 busy cores (the two replicas start in 60-95 s together); --quick about 3.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL_NAME = "tiny"
# The recipe that works for the tiny model on the CPU engine (float32, short context, no graph capture, an explicit
# KV cache size) with prefix caching on: its counters are what part (b) reads.
SERVE_FLAGS: tuple[str, ...] = (
    "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--kv-cache-memory-bytes", str(256 * 2**20),
    "--served-model-name", MODEL_NAME, "--enable-prefix-caching",
)
# Health checks every 2 s and a 10 s circuit-breaker timeout: a dead replica leaves the rotation within seconds.
ROUTER_FLAGS: tuple[str, ...] = ("--health-check-interval-secs", "2", "--cb-timeout-duration-secs", "10")
HEALTH_TIMEOUT_S = 420.0
STOP_TIMEOUT_S = 30.0
CONCURRENCY = 16
# vLLM's CPU platform defaults to 128-token KV blocks (as vllm-ascend does); prefix-cache hits come in whole blocks.
CPU_BLOCK_SIZE = 128
# Words of the demo model's tokenizer corpus (npuops/demo_model.py), so prompts tokenize into whole words mostly.
WORD_TEXT = (
    "the a of to in on for with by from and or is are was be has have do model engine token cache block memory "
    "device chip node server request batch latency throughput prompt answer layer head weight tensor kernel "
    "precision float scale error check health ready start stop launch plan doctor status metrics log driver "
    "ascend npu cpu vllm llama tiny demo test hello world user system fast slow small large first last next one "
    "two three four five"
)
WORDS: tuple[str, ...] = tuple(WORD_TEXT.split())


class BenchError(RuntimeError):
    """A deployment that did not come up, or a run that could not be measured; the message says where to look."""


# ---------------------------------------------------------------------------------------------------------------
# Processes: every one in its own session, so a signal to its group takes its children (EngineCore, workers) too.
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Started:
    """A process this benchmark started (the leader of its own process group) and where its output goes."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid


class Processes:
    """Starts processes in their own sessions and stops every one of them: on `stop_all()`, at exit, on SIGTERM."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Started] = []
        atexit.register(self.stop_all)

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> Started:
        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        started = Started(name, popen, log)
        self.started.append(started)
        return started

    @staticmethod
    def family(started: Started) -> list[Any]:
        """The process and all its descendants (psutil.Process), including any that left its process group."""
        import psutil

        try:
            root = psutil.Process(started.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def stop(self, started: Started, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to the group, SIGKILL to the group and every straggling descendant after `timeout`."""
        import psutil

        family = self.family(started)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(started.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(family, timeout=timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(started.pid, signal.SIGKILL)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            started.popen.wait(timeout=10)

    def stop_all(self) -> None:
        while self.started:
            self.stop(self.started.pop())


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP end the run like Ctrl-C, so the `finally` blocks and atexit stop what was started."""

    def raise_interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_interrupt)


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now: all held open at once so that they differ, then released for the servers."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 only: never through a proxy


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answered."""
    try:
        with _OPENER.open(url, timeout=timeout) as answer:
            return answer.status, answer.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (OSError, ValueError):
        return 0, ""


def finish(processes: Processes, work: Path, *, keep: bool) -> None:
    """Stop everything the run started; keep the work directory (logs, model) only when asked or after an error."""
    processes.stop_all()
    if keep:
        print(f"work directory (logs, model): {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def wait_healthy(servers: Sequence[tuple[Started, str]], timeout: float = HEALTH_TIMEOUT_S) -> float:
    """Wait until every (process, base URL) answers GET /health with 200; seconds waited. Raises if one exits."""
    started_at = time.perf_counter()
    pending = list(servers)
    while pending:
        for process, url in list(pending):
            if process.popen.poll() is not None:
                raise BenchError(f"{process.name} exited {process.popen.returncode} before /health answered; "
                                 f"{process.log}:\n{tail(process.log)}")
            if http_get(f"{url}/health", timeout=2)[0] == 200:
                pending.remove((process, url))
        if time.perf_counter() - started_at > timeout:
            names = ", ".join(p.name for p, _ in pending)
            raise BenchError(f"no /health 200 from {names} in {timeout:.0f} s; {pending[0][0].log}:\n"
                             f"{tail(pending[0][0].log)}")
        if pending:
            time.sleep(0.5)
    return time.perf_counter() - started_at


def engine_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env["HF_HUB_OFFLINE"] = "1"
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONPATH"] = str(REPO)  # the engine venv's editable npuops may point elsewhere
    return env


def vllm_binary() -> Path:
    return Path(sys.executable).parent / "vllm"


def check_engine_python() -> str | None:
    """Why this interpreter cannot run the benchmark (no vllm, vllm-router or aiohttp beside it), or None."""
    import importlib.util

    missing = [m for m in ("vllm_router", "aiohttp", "psutil", "tokenizers") if importlib.util.find_spec(m) is None]
    if missing or not vllm_binary().is_file():
        return (f"{sys.executable} lacks {', '.join(missing) or 'the vllm command'}; run with the engine venv's "
                "python: PYTHONPATH=. /opt/npuops-engine/venv/bin/python benchmarks/...")
    return None


def make_model(work: Path) -> Path:
    model = work / "model"
    made = subprocess.run([sys.executable, "-m", "npuops.demo_model", str(model)], cwd=REPO, env=engine_env(),
                          capture_output=True, text=True, timeout=300)
    if made.returncode != 0:
        raise BenchError(f"npuops.demo_model failed:\n{made.stdout}{made.stderr}")
    return model


def replica_cores(index: int, count: int = 2) -> str | None:
    """The cores replica `index` of `count` is bound to, as `npuops launch --dp N` binds them on the CPU engine
    (VLLM_CPU_OMP_THREADS_BIND, npuops/plan/rules.py): an equal share each; None with fewer cores than replicas."""
    share = (os.cpu_count() or 1) // count
    return f"{index * share}-{(index + 1) * share - 1}" if share >= 1 else None


def spawn_replica(processes: Processes, name: str, model: Path, port: int, extra: Sequence[str] = (),
                  cores: str | None = None) -> Started:
    argv = [str(vllm_binary()), "serve", str(model), "--host", "127.0.0.1", "--port", str(port), *SERVE_FLAGS, *extra]
    env = engine_env()
    if cores is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    return processes.spawn(name, argv, env)


def spawn_router(processes: Processes, name: str, worker_urls: Sequence[str], policy: str, port: int,
                 metrics_port: int) -> Started:
    argv = [sys.executable, "-m", "vllm_router.launch_router", "--worker-urls", *worker_urls, "--host", "127.0.0.1",
            "--port", str(port), "--policy", policy, "--prometheus-host", "127.0.0.1", "--prometheus-port",
            str(metrics_port), *ROUTER_FLAGS]
    return processes.spawn(name, argv, engine_env())


# ---------------------------------------------------------------------------------------------------------------
# Prometheus counters
# ---------------------------------------------------------------------------------------------------------------


def scrape(url: str) -> dict[str, float]:
    """Every sample of a /metrics page, keyed by its name with labels (`name{a="b"}`); {} when it did not answer."""
    status, body = http_get(url, timeout=5)
    samples: dict[str, float] = {}
    if status != 200:
        return samples
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            samples[key] = float(value)
    return samples


def counter_sum(samples: Mapping[str, float], name: str) -> float:
    """A counter summed over its label sets (a native-DP server reports one per engine)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


@dataclass
class PrefixCounters:
    queries: float
    hits: float


def prefix_counters(metrics_urls: Iterable[str]) -> PrefixCounters:
    samples = [scrape(url) for url in metrics_urls]
    return PrefixCounters(sum(counter_sum(s, "vllm:prefix_cache_queries_total") for s in samples),
                          sum(counter_sum(s, "vllm:prefix_cache_hits_total") for s in samples))


def router_decisions(metrics_url: str) -> dict[str, float]:
    """vllm_router_policy_decisions_total per worker URL."""
    decisions: dict[str, float] = {}
    for key, value in scrape(metrics_url).items():
        if key.startswith("vllm_router_policy_decisions_total{"):
            worker = key.split('worker="', 1)[-1].split('"', 1)[0]
            decisions[worker] = decisions.get(worker, 0.0) + value
    return decisions


# ---------------------------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One streamed completion as the client saw it."""

    ok: bool  # HTTP 200, every token (max_tokens), a finish_reason and [DONE]
    sent_at: float  # perf_counter
    ttft_s: float | None
    latency_s: float
    output_tokens: int
    prompt_tokens: int
    error: str = ""  # what went wrong: "HTTP 503", "ClientConnectorError", "truncated after 17 tokens", ...


@dataclass
class Progress:
    """Tokens streamed so far over a batch: the replica-death runs kill a replica at a fixed share of it."""

    tokens: int = 0


async def stream_completion(session: Any, base_url: str, prompt: str, max_tokens: int,
                            progress: Progress | None = None) -> Outcome:
    import aiohttp

    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
    sent_at = time.perf_counter()
    ttft: float | None = None
    tokens = prompt_tokens = 0
    finished = done = False
    try:
        async with session.post(f"{base_url}/v1/completions", json=body) as answer:
            if answer.status != 200:
                text = (await answer.text())[:100].replace("\n", " ")
                return Outcome(False, sent_at, None, time.perf_counter() - sent_at, 0, 0,
                               f"HTTP {answer.status} {text}".strip())
            async for raw in answer.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return Outcome(False, sent_at, ttft, time.perf_counter() - sent_at, tokens, prompt_tokens,
                                   f"stream error after {tokens} tokens")
                for choice in chunk.get("choices") or []:
                    if ttft is None:
                        ttft = time.perf_counter() - sent_at
                    tokens += 1  # one chunk per generated token (no stream_interval, no n)
                    if progress is not None:
                        progress.tokens += 1
                    finished = finished or bool(choice.get("finish_reason"))
                usage = chunk.get("usage")
                if usage:
                    tokens = int(usage.get("completion_tokens") or tokens)
                    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        return Outcome(False, sent_at, ttft, time.perf_counter() - sent_at, tokens, prompt_tokens,
                       f"{type(exc).__name__} after {tokens} tokens")
    latency = time.perf_counter() - sent_at
    if not (done and finished and tokens == max_tokens):
        return Outcome(False, sent_at, ttft, latency, tokens, prompt_tokens, f"truncated after {tokens} tokens")
    return Outcome(True, sent_at, ttft, latency, tokens, prompt_tokens)


def client_session(limit: int, timeout_s: float) -> Any:
    import aiohttp

    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit, force_close=False),
                                 timeout=aiohttp.ClientTimeout(total=timeout_s), trust_env=False)


@dataclass
class Batch:
    """A batch of requests and its wall time (first sent until the last answered)."""

    outcomes: list[Outcome]
    wall_s: float

    @property
    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.ok]

    @property
    def tokens_per_s(self) -> float:
        return sum(o.output_tokens for o in self.ok) / self.wall_s

    @property
    def requests_per_s(self) -> float:
        return len(self.ok) / self.wall_s

    @property
    def ttfts(self) -> list[float]:
        return [o.ttft_s for o in self.ok if o.ttft_s is not None]

    @property
    def ttft_mean(self) -> float:
        return statistics.fmean(self.ttfts) if self.ttfts else float("nan")

    @property
    def ttft_p50(self) -> float:
        return statistics.median(self.ttfts) if self.ttfts else float("nan")

    @property
    def prompt_tokens_mean(self) -> float:
        return statistics.fmean(o.prompt_tokens for o in self.ok) if self.ok else float("nan")

    def errors(self) -> Counter[str]:
        return Counter(o.error.split(" after ")[0] for o in self.outcomes if not o.ok)


async def run_batch(targets: Sequence[str], prompts: Sequence[str], concurrency: int, max_tokens: int,
                    timeout_s: float = 300.0, progress: Progress | None = None) -> Batch:
    """Every prompt once, `concurrency` in flight at most; request i goes to targets[i % len(targets)]."""
    limiter = asyncio.Semaphore(concurrency)
    async with client_session(concurrency, timeout_s) as session:

        async def one(index: int, prompt: str) -> Outcome:
            async with limiter:
                return await stream_completion(session, targets[index % len(targets)], prompt, max_tokens, progress)

        started = time.perf_counter()
        outcomes = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        return Batch(list(outcomes), time.perf_counter() - started)


def batch(targets: Sequence[str], prompts: Sequence[str], concurrency: int, max_tokens: int) -> Batch:
    return asyncio.run(run_batch(targets, prompts, concurrency, max_tokens))


# ---------------------------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------------------------


class PromptMaker:
    """Word prompts of a given length in the model's own tokens (its tokenizer.json), from a seeded generator."""

    def __init__(self, model: Path, seed: int) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
        self.rng = random.Random(seed)  # reproducible prompts, not cryptography
        self.serial = 0

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def words(self, tokens: int, lead: str = "") -> str:
        """`lead` then random words until the text is `tokens` tokens long (or one word more)."""
        text = lead
        while self.count(text) < tokens:
            text = f"{text} {self.rng.choice(WORDS)}" if text else self.rng.choice(WORDS)
        return text

    def unique(self, tokens: int) -> str:
        """A prompt no other starts like (a serial number first), so it finds nothing in the prefix cache."""
        self.serial += 1
        return self.words(tokens, lead=f"{self.serial} {self.rng.randrange(10**6)}:")

    def shared_prefix(self, groups: int, per_group: int, prefix_tokens: int, suffix_tokens: int) -> list[str]:
        """groups x per_group prompts: each group's share a fresh prefix; in waves of one per group, shuffled."""
        prefixes = [self.unique(prefix_tokens) for _ in range(groups)]
        prompts = []
        for _ in range(per_group):
            order = list(range(groups))
            self.rng.shuffle(order)
            prompts.extend(f"{prefixes[g]}. {self.words(suffix_tokens)}?" for g in order)
        return prompts


# ---------------------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    known = [v for v in values if v == v]  # drop NaN
    return statistics.median(known) if known else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def errors_text(errors: Counter[str]) -> str:
    return ", ".join(f"{n}x {kind}" for kind, n in errors.most_common()) or "none"


@dataclass
class PrefixRun:
    """One shared-prefix batch through one arm, with the replicas' prefix-cache deltas over it."""

    batch: Batch
    queries: float
    hits: float
    decisions: dict[str, float] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return ratio(self.hits, self.queries)


def run_prefix(target: str, prompts: Sequence[str], metrics_urls: Sequence[str], max_tokens: int,
               router_metrics: str | None = None) -> PrefixRun:
    before = prefix_counters(metrics_urls)
    decisions_before = router_decisions(router_metrics) if router_metrics else {}
    result = batch([target], prompts, CONCURRENCY, max_tokens)
    after = prefix_counters(metrics_urls)
    decisions = {}
    if router_metrics:
        decisions = {w: n - decisions_before.get(w, 0.0) for w, n in router_decisions(router_metrics).items()}
    return PrefixRun(result, after.queries - before.queries, after.hits - before.hits, decisions)


def spread_text(decisions: Mapping[str, float]) -> str:
    """Requests per worker, in worker-URL order (replica0/replica1)."""
    return "/".join(f"{int(n)}" for _, n in sorted(decisions.items())) or "?"


def print_throughput_summary(arms: Sequence[str], runs: Mapping[str, Sequence[Batch]], baseline: str) -> None:
    base_tps = median(b.tokens_per_s for b in runs[baseline])
    base_rps = median(b.requests_per_s for b in runs[baseline])
    base_ttft = median(b.ttft_mean for b in runs[baseline])
    base_p50 = median(b.ttft_p50 for b in runs[baseline])
    print(f"  {'arm':<8} {'tok/s':>8} {'req/s':>7} {'TTFT mean ms':>12} {'TTFT p50 ms':>11}   "
          f"ratios to {baseline}: tok/s  req/s  TTFT mean  TTFT p50")
    for arm in arms:
        tps = median(b.tokens_per_s for b in runs[arm])
        rps = median(b.requests_per_s for b in runs[arm])
        ttft = median(b.ttft_mean for b in runs[arm])
        p50 = median(b.ttft_p50 for b in runs[arm])
        print(f"  {arm:<8} {tps:8.1f} {rps:7.2f} {ttft * 1e3:12.1f} {p50 * 1e3:11.1f}   "
              f"{'':>{len(baseline) + 11}}{ratio(tps, base_tps):6.3f} {ratio(rps, base_rps):6.3f} "
              f"{ratio(ttft, base_ttft):10.3f} {ratio(p50, base_p50):9.3f}")
    # The same round's batches ran back to back, so their ratio cancels the drift that rounds differ by.
    for arm in arms:
        if arm != baseline:
            paired = [ratio(b.tokens_per_s, a.tokens_per_s) for a, b in zip(runs[baseline], runs[arm], strict=True)]
            print(f"  {arm}/{baseline} tok/s per round: {' '.join(f'{p:.2f}' for p in paired)} "
                  f"(median {median(paired):.3f})")
    failed = {arm: sum(len(b.outcomes) - len(b.ok) for b in runs[arm]) for arm in arms}
    if any(failed.values()):
        print(f"  failed requests: {failed}")


def print_prefix_summary(arms: Sequence[str], runs: Mapping[str, Sequence[PrefixRun]], prefix_tokens: int) -> None:
    prompt_mean = median(r.batch.prompt_tokens_mean for arm in arms for r in runs[arm])
    cacheable = prefix_tokens // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE
    print(f"  the CPU engine caches whole {CPU_BLOCK_SIZE}-token blocks: of a ~{prompt_mean:.0f}-token prompt at most "
          f"{cacheable} tokens can hit (hit rate {ratio(cacheable, prompt_mean):.3f} if every request hit)")
    print(f"  {'arm':<8} {'hit rate':>8} {'TTFT mean ms':>12} {'TTFT p50 ms':>11} {'tok/s':>8}  "
          "(medians over rounds; hit rate = prefix-cache hit tokens / query tokens, both replicas)")
    for arm in arms:
        print(f"  {arm:<8} {median(r.hit_rate for r in runs[arm]):8.3f} "
              f"{median(r.batch.ttft_mean for r in runs[arm]) * 1e3:12.1f} "
              f"{median(r.batch.ttft_p50 for r in runs[arm]) * 1e3:11.1f} "
              f"{median(r.batch.tokens_per_s for r in runs[arm]):8.1f}")


def rotated(arms: Sequence[str], round_index: int) -> list[str]:
    shift = round_index % len(arms)
    return [*arms[shift:], *arms[:shift]]


# ---------------------------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Sizes:
    rounds: int
    requests: int  # per throughput batch
    max_tokens: int
    prompt_tokens: int
    groups: int
    per_group: int
    prefix_tokens: int
    suffix_tokens: int
    prefix_max_tokens: int


def sizes_from(args: argparse.Namespace) -> Sizes:
    quick = bool(args.quick)
    return Sizes(rounds=args.rounds or (3 if quick else 5), requests=32 if quick else 64, max_tokens=64,
                 prompt_tokens=32, groups=args.groups, per_group=args.per_group or (4 if quick else 8),
                 prefix_tokens=args.prefix_tokens, suffix_tokens=16, prefix_max_tokens=16)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer rounds and requests (about half the run)")
    parser.add_argument("--rounds", type=int, default=0, help="interleaved rounds per part (default 5, --quick 3)")
    parser.add_argument("--groups", type=int, default=8, help="shared-prefix groups (default 8)")
    parser.add_argument("--per-group", type=int, default=0, help="requests per group (default 8, --quick 4)")
    parser.add_argument("--prefix-tokens", type=int, default=200, help="shared prefix length in tokens (default 200)")
    parser.add_argument("--model", type=Path, help="a model directory (default: npuops.demo_model in a temp dir)")
    parser.add_argument("--seed", type=int, default=0, help="prompt generator seed")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, model)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    args = parser.parse_args()
    reason = check_engine_python()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    sizes = sizes_from(args)
    install_signal_handlers()
    work = Path(tempfile.mkdtemp(prefix="npuops-bench-router-"))
    processes = Processes(work)
    arms = ["direct", "rr", "ca"]
    throughput: dict[str, list[Batch]] = {arm: [] for arm in arms}
    prefix: dict[str, list[PrefixRun]] = {"ca": [], "rr": []}
    try:
        model = args.model or make_model(work)
        prompts = PromptMaker(model, args.seed)
        replica_ports = free_ports(2)
        replicas = [spawn_replica(processes, f"replica{i}", model, port, cores=replica_cores(i))
                    for i, port in enumerate(replica_ports)]
        replica_urls = [f"http://127.0.0.1:{port}" for port in replica_ports]
        print(f"starting 2 replicas of {model} ...", flush=True)
        print(f"  healthy in {wait_healthy(list(zip(replicas, replica_urls, strict=True))):.1f} s", flush=True)
        rr_port, rr_metrics, ca_port, ca_metrics = free_ports(4)
        routers = [spawn_router(processes, "router-rr", replica_urls, "round_robin", rr_port, rr_metrics),
                   spawn_router(processes, "router-ca", replica_urls, "cache_aware", ca_port, ca_metrics)]
        router_urls = {"rr": f"http://127.0.0.1:{rr_port}", "ca": f"http://127.0.0.1:{ca_port}"}
        router_metrics = {"rr": f"http://127.0.0.1:{rr_metrics}/metrics", "ca": f"http://127.0.0.1:{ca_metrics}/metrics"}
        wait_healthy(list(zip(routers, router_urls.values(), strict=True)), timeout=120)
        targets = {"direct": replica_urls, "rr": [router_urls["rr"]], "ca": [router_urls["ca"]]}
        metrics_urls = [f"{url}/metrics" for url in replica_urls]

        print(f"(a) throughput: {sizes.requests} requests of ~{sizes.prompt_tokens} prompt + {sizes.max_tokens} "
              f"output tokens, {CONCURRENCY} concurrent, {sizes.rounds} interleaved round(s) after a warm-up",
              flush=True)
        for arm in arms:  # warm-up: first requests on fresh servers and connections are slower
            batch(targets[arm], [prompts.unique(sizes.prompt_tokens) for _ in range(CONCURRENCY)], CONCURRENCY,
                  sizes.max_tokens)
        for r in range(sizes.rounds):
            line = []
            for arm in rotated(arms, r):
                decisions_before = router_decisions(router_metrics[arm]) if arm in router_metrics else {}
                result = batch(targets[arm], [prompts.unique(sizes.prompt_tokens) for _ in range(sizes.requests)],
                               CONCURRENCY, sizes.max_tokens)
                throughput[arm].append(result)
                spread = ""
                if arm in router_metrics:
                    after = router_decisions(router_metrics[arm])
                    spread = f" spread {spread_text({w: n - decisions_before.get(w, 0.0) for w, n in after.items()})}"
                line.append(f"{arm} {result.tokens_per_s:6.1f} tok/s TTFT {result.ttft_mean * 1e3:6.1f} ms{spread}"
                            f"{'' if not result.errors() else ' errors: ' + errors_text(result.errors())}")
            print(f"  round {r + 1}: " + " | ".join(line), flush=True)

        print(f"(b) shared prefixes: {sizes.groups} groups x {sizes.per_group} requests, ~{sizes.prefix_tokens}-token "
              f"prefix + ~{sizes.suffix_tokens}-token suffix, {sizes.prefix_max_tokens} output tokens, "
              f"{CONCURRENCY} concurrent, fresh prefixes per batch", flush=True)
        for r in range(sizes.rounds):
            line = []
            for arm in rotated(["ca", "rr"], r):
                batch_prompts = prompts.shared_prefix(sizes.groups, sizes.per_group, sizes.prefix_tokens,
                                                      sizes.suffix_tokens)
                run = run_prefix(router_urls[arm], batch_prompts, metrics_urls, sizes.prefix_max_tokens,
                                 router_metrics[arm])
                prefix[arm].append(run)
                line.append(f"{arm} hit {run.hit_rate:.3f} TTFT {run.batch.ttft_mean * 1e3:6.1f} ms "
                            f"spread {spread_text(run.decisions)} prompt {run.batch.prompt_tokens_mean:.0f} tok"
                            f"{'' if not run.batch.errors() else ' errors: ' + errors_text(run.batch.errors())}")
            print(f"  round {r + 1}: " + " | ".join(line), flush=True)
    except (BenchError, KeyboardInterrupt) as exc:
        print(f"error: {exc}", file=sys.stderr)
        args.keep = True
        return 1
    finally:
        finish(processes, work, keep=args.keep)

    print()
    print("summary: vllm-router (Rust) in front of 2 vLLM CPU replicas of the tiny model; medians over "
          f"{sizes.rounds} interleaved round(s)")
    print(f"(a) {sizes.requests} requests, {CONCURRENCY} concurrent, {sizes.max_tokens} output tokens each:")
    print_throughput_summary(arms, throughput, "direct")
    tps_ratio = ratio(median(b.tokens_per_s for b in throughput["rr"]), median(b.tokens_per_s for b in
                                                                               throughput["direct"]))
    print(f"  router(round_robin)/direct throughput: {tps_ratio:.3f} "
          f"({'meets' if tps_ratio >= 0.95 else 'misses'} the 0.95 goal)")
    print(f"(b) shared prefixes, {sizes.groups} groups x {sizes.per_group}:")
    print_prefix_summary(["ca", "rr"], prefix, sizes.prefix_tokens)
    ca_hit, rr_hit = (median(r.hit_rate for r in prefix[a]) for a in ("ca", "rr"))
    ca_ttft, rr_ttft = (median(r.batch.ttft_mean for r in prefix[a]) for a in ("ca", "rr"))
    print(f"  cache_aware/round_robin: hit rate {ratio(ca_hit, rr_hit):.3f}, TTFT mean {ratio(ca_ttft, rr_ttft):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
