"""`npuops profile NAME`: vLLM's own profiler on a live instance, and where its time goes.

An instance launched with `--profiling` runs vLLM with `--profiler-config` (the torch profiler, its traces in the
instance's state directory; on an NPU vllm-ascend's profiler takes the same configuration and records with
torch_npu's). `profile` asks the engine to start (POST /start_profile), waits while the instance serves its load, asks
it to stop (POST /stop_profile), waits for the traces it writes, copies them to --output and summarizes them: the
operators by self time (an operator's own time, less the operators it called), and the shares of attention, matrix
multiplication, communication and everything else the host runs (Python, scheduling, element-wise operators). The
traces open in Perfetto (ui.perfetto.dev) or MindStudio Insight.

The summary (`summarize_trace`) is pure: it reads Chrome-trace events.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Trace events that are operators: torch's CPU operators and, on a device, its kernels (CUDA's "kernel", Ascend's
# task categories as torch_npu's profiler writes them).
OPERATOR_CATEGORIES = frozenset({"cpu_op", "kernel", "gpu_op", "npu_op", "ascend_op", "AscendCL"})
CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(r"(?i)all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|hccl|nccl|"
                                 r"gloo|c10d|send|recv|barrier")),
    ("attention", re.compile(r"(?i)attention|attn|flash|paged|sdpa|softmax|rotary|rope|kv_?cache|"
                             r"reshape_and_cache")),
    ("matmul", re.compile(r"(?i)matmul|\bmm\b|aten::mm|addmm|bmm|linear|gemm|onednn|mkldnn|baddbmm|"
                          r"QuantBatchMatmul|grouped_matmul")),
)
HOST = "host"
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", "trace_view.json")
STABLE_POLLS = 3


@dataclass(frozen=True)
class OperatorTime:
    name: str
    self_us: float
    calls: int
    kind: str  # attention, matmul, communication or host


@dataclass(frozen=True)
class TraceSummary:
    total_us: float
    operators: tuple[OperatorTime, ...]  # by self time, longest first
    shares: Mapping[str, float]  # class -> share of the operators' self time
    events: int

    def to_json(self, top: int = 15) -> dict[str, Any]:
        return {"total_ms": round(self.total_us / 1e3, 3), "events": self.events,
                "shares": {k: round(v, 4) for k, v in self.shares.items()},
                "top_operators": [{"name": o.name, "self_ms": round(o.self_us / 1e3, 3), "calls": o.calls,
                                   "kind": o.kind} for o in self.operators[:top]]}


def operator_class(name: str) -> str:
    for kind, pattern in CLASSES:
        if pattern.search(name):
            return kind
    return HOST


def _self_times(events: list[dict[str, Any]]) -> Iterable[tuple[str, float]]:
    """(name, self time) of complete events of one thread: each event's duration less its direct children's."""
    events.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
    stack: list[list[Any]] = []  # [name, end, children's time, duration]
    for event in events:
        start, duration = float(event["ts"]), float(event["dur"])
        while stack and stack[-1][1] <= start:
            name, _end, children, own = stack.pop()
            yield name, max(own - children, 0.0)
        if stack:
            stack[-1][2] += duration
        stack.append([str(event["name"]), start + duration, 0.0, duration])
    while stack:
        name, _end, children, own = stack.pop()
        yield name, max(own - children, 0.0)


def summarize_trace(trace_events: Iterable[Mapping[str, Any]]) -> TraceSummary:
    """The operators of a Chrome trace by self time, and the shares of their classes (pure)."""
    threads: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    count = 0
    for event in trace_events:
        if event.get("ph") != "X" or event.get("cat") not in OPERATOR_CATEGORIES:
            continue
        try:
            float(event["ts"])
            float(event["dur"])
        except (KeyError, TypeError, ValueError):
            continue
        threads[(event.get("pid"), event.get("tid"))].append(dict(event))
        count += 1
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for events in threads.values():
        for name, own in _self_times(events):
            per_name[name][0] += own
            per_name[name][1] += 1
    operators = sorted((OperatorTime(n, t, int(c), operator_class(n)) for n, (t, c) in per_name.items()),
                       key=lambda o: o.self_us, reverse=True)
    total = sum(o.self_us for o in operators)
    shares = {kind: 0.0 for kind in ("attention", "matmul", "communication", HOST)}
    for o in operators:
        shares[o.kind] += o.self_us / total if total else 0.0
    return TraceSummary(total, tuple(operators), shares, count)


def read_trace_events(path: Path) -> list[Mapping[str, Any]]:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path} holds no traceEvents list")
    return [e for e in events if isinstance(e, dict)]


def trace_files(directory: Path, since: float) -> list[Path]:
    """The traces written under `directory` at or after `since`."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                  and p.stat().st_mtime >= since)


@dataclass
class ProfileRun:
    traces: list[Path] = field(default_factory=list)  # the copies in the output directory
    summary: TraceSummary | None = None
    seconds: float = 0.0


Poster = Callable[[str, dict[str, Any]], tuple[int, bytes] | None]


def wait_for_traces(directory: Path, since: float, timeout_s: float, sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> list[Path]:
    """The traces the engine wrote after `since`, once their sizes stop changing (a worker writes its trace after
    /stop_profile returns, compressing it first)."""
    deadline = clock() + timeout_s
    previous: dict[Path, int] = {}
    unchanged = 0
    while True:
        found = trace_files(directory, since)
        sizes = {p: p.stat().st_size for p in found}
        # The API server's trace and each worker's are written by different processes, seconds apart: the set
        # must stay the same for STABLE_POLLS polls in a row.
        unchanged = unchanged + 1 if found and sizes == previous else 0
        if unchanged >= STABLE_POLLS or clock() > deadline:
            return found
        previous = sizes
        sleep(1.0)


def run_profile(post: Poster, profiler_dir: Path, output: Path, seconds: float, *, steps: int,
                progress: Callable[[str], None], trace_timeout_s: float = 180.0) -> ProfileRun:
    """Start (recording at most `steps` engine steps: a trace of every step of a busy engine takes minutes to
    write), wait `seconds`, stop, collect the new traces into `output` and summarize them."""
    started = time.time()
    answer = post("/start_profile", {"max_iterations": steps})
    if answer is None or answer[0] != 200:
        raise RuntimeError(f"/start_profile answered {answer[0] if answer else 'nothing'}")
    progress(f"profiling for {seconds:g} s ...")
    time.sleep(seconds)
    answer = post("/stop_profile", {})
    if answer is None or answer[0] != 200:
        raise RuntimeError(f"/stop_profile answered {answer[0] if answer else 'nothing'}")
    progress("waiting for the engine to write its traces ...")
    found = wait_for_traces(profiler_dir, started - 1.0, trace_timeout_s)
    if not found:
        raise RuntimeError(f"no trace appeared in {profiler_dir} within {trace_timeout_s:g} s")
    output.mkdir(parents=True, exist_ok=True)
    run = ProfileRun(seconds=seconds)
    events: list[Mapping[str, Any]] = []
    for path in found:
        copy = output / path.relative_to(profiler_dir)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, copy)
        run.traces.append(copy)
        events += read_trace_events(path)
    run.summary = summarize_trace(events)
    return run
