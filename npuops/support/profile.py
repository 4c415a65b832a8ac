"""`npuops profile NAME`: vLLM's own profiler on a live instance, and where its time goes.

An instance launched with `--profiling` runs vLLM with `--profiler-config` (the torch profiler, its traces in the
instance's state directory; on an NPU vllm-ascend's profiler takes the same configuration and records with
torch_npu's). `profile` asks the engine to start (POST /start_profile), waits while the instance serves its load, asks
it to stop (POST /stop_profile), waits for the traces it writes, copies them to --output and summarizes them: the
operators by self time (an operator's own time, less the operators it called), and the shares of attention, matrix
multiplication, communication and everything else the host runs (Python, scheduling, element-wise operators). The
traces open in Perfetto (ui.perfetto.dev) or MindStudio Insight.

The summary (`summarize_trace`) is pure: it reads Chrome-trace events. The traces come from a directory the
engine's service user writes (the status directory npuops derives, not the record's `profiler_dir`): each is read
through npuops.safefiles (a regular file, no link followed, at most MAX_TRACE_BYTES, a .gz decompressed up to that
bound), and one that is not a trace (not JSON, a truncated .gz, too big, a link) is left out with why.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError, MeasurementError
from npuops.safefiles import READ_CHUNK, ConfinedPath, FoundFile, NotRead, open_regular, printable, walk_regular_files

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
# A trace summarized is parsed whole (a few times its size in memory): a bigger one is copied, not summarized.
MAX_TRACE_BYTES = 256 * 2**20
# A trace bigger than this is not even copied (--steps bounds what the engine records).
MAX_COPY_BYTES = 4 * 2**30


class TraceError(ValueError):
    """A trace that cannot be summarized, and why (one line)."""


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


def _trace_bytes(fd: int, name: str, size: int, max_bytes: int) -> bytes:
    """A trace's JSON text from its open fd, decompressed when it is a .gz, at most max_bytes."""
    too_big = TraceError(f"{printable(name)} holds more than {max_bytes // 2**20} MiB of JSON: too big to summarize")
    with os.fdopen(os.dup(fd), "rb") as raw:
        if not name.endswith(".gz"):
            if size > max_bytes:
                raise too_big
            data = raw.read(max_bytes + 1)
        else:
            try:
                with gzip.GzipFile(fileobj=raw) as unzipped:
                    data = unzipped.read(max_bytes + 1)
            except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
                # EOFError: the engine was still writing it, or it was cut short.
                raise TraceError(f"{printable(name)} is not a whole gzip file ({exc})") from None
    if len(data) > max_bytes:
        raise too_big
    return data


def read_trace_events(path: ConfinedPath, *, max_bytes: int | None = None) -> list[Mapping[str, Any]]:
    """The events of one trace (Chrome-trace JSON, gzip'd or not, at most max_bytes [MAX_TRACE_BYTES] of it);
    TraceError says why a file is not one."""
    max_bytes = MAX_TRACE_BYTES if max_bytes is None else max_bytes
    try:
        with open_regular(path) as (fd, info):
            data = _trace_bytes(fd, path.name, info.st_size, max_bytes)
    except NotRead as exc:
        raise TraceError(exc.reason) from None
    except OSError as exc:
        raise TraceError(f"{path} cannot be read ({exc.strerror})") from None
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser goes
        raise TraceError(f"{printable(path.name)} is not JSON ({str(exc)[:80]})") from None
    events = parsed.get("traceEvents") if isinstance(parsed, dict) else parsed
    if not isinstance(events, list):
        raise TraceError(f"{printable(path.name)} holds no traceEvents list")
    return [e for e in events if isinstance(e, dict)]


def trace_files(directory: ConfinedPath, since: float) -> list[FoundFile]:
    """The traces written under `directory` at or after `since` (regular files only; links are not followed)."""
    try:
        walk = walk_regular_files(directory)
    except NotRead:
        return []
    return sorted((f for f in walk.files if f.relative.name.endswith(TRACE_SUFFIXES) and f.mtime >= since),
                  key=lambda f: f.relative)


def copy_trace(source: ConfinedPath, destination: Path, *, max_bytes: int = MAX_COPY_BYTES) -> None:
    """A trace copied as it is read (bounded memory, at most max_bytes), into a new file (a link there is not
    followed); TraceError says why not."""
    try:
        with open_regular(source) as (fd, info):
            if info.st_size > max_bytes:
                raise TraceError(f"{source} is {info.st_size // 2**20} MiB, more than the {max_bytes // 2**20} MiB "
                                 "a trace is copied up to")
            destination.parent.mkdir(parents=True, exist_ok=True)
            out = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(out, "wb") as target:
                copied = 0
                while copied < max_bytes and (chunk := os.read(fd, min(READ_CHUNK, max_bytes - copied))):
                    target.write(chunk)
                    copied += len(chunk)
    except NotRead as exc:
        raise TraceError(exc.reason) from None
    except OSError as exc:
        raise TraceError(f"{source} cannot be copied to {destination} ({exc.strerror})") from None


@dataclass
class ProfileRun:
    traces: list[Path] = field(default_factory=list)  # the copies in the output directory
    summary: TraceSummary | None = None
    seconds: float = 0.0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # traces left out of the summary (or the copy)


Poster = Callable[[str, dict[str, Any]], tuple[int, bytes] | None]


def wait_for_traces(directory: ConfinedPath, since: float, timeout_s: float,
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> list[FoundFile]:
    """The traces the engine wrote after `since`, once their sizes stop changing (a worker writes its trace after
    /stop_profile returns, compressing it first)."""
    deadline = clock() + timeout_s
    previous: dict[Any, int] = {}
    unchanged = 0
    while True:
        found = trace_files(directory, since)
        sizes = {f.relative: f.size for f in found}
        # The API server's trace and each worker's are written by different processes, seconds apart: the set
        # must stay the same for STABLE_POLLS polls in a row.
        unchanged = unchanged + 1 if found and sizes == previous else 0
        if unchanged >= STABLE_POLLS or clock() > deadline:
            return found
        previous = sizes
        sleep(1.0)


def summarize_traces(found: Iterable[FoundFile], directory: ConfinedPath, output: Path, *,
                     max_trace_bytes: int | None = None) -> ProfileRun:
    """Each trace copied into `output` (as `directory` holds it) and summarized (up to max_trace_bytes of JSON
    each: MAX_TRACE_BYTES); one that cannot be is skipped with why. MeasurementError when none could be read."""
    run = ProfileRun()
    events: list[Mapping[str, Any]] = []
    readable = 0
    for trace in found:
        source = directory / trace.relative
        copy = output.joinpath(*(printable(part) for part in trace.relative.parts))
        try:
            copy_trace(source, copy)
            run.traces.append(copy)
            events += read_trace_events(source, max_bytes=max_trace_bytes)
            readable += 1
        except TraceError as exc:
            run.skipped.append((printable(str(trace.relative)), str(exc)))
    if not readable:
        reasons = "; ".join(why for _name, why in run.skipped[:3])
        raise MeasurementError(f"none of the {len(run.skipped)} traces in {directory} could be read ({reasons})",
                               f"see the traces in {output}; profile again (with fewer --steps if one is too big)")
    run.summary = summarize_trace(events)
    return run


def run_profile(post: Poster, profiles: ConfinedPath, output: Path, seconds: float, *, steps: int,
                progress: Callable[[str], None], trace_timeout_s: float = 180.0,
                sleep: Callable[[float], None] = time.sleep) -> ProfileRun:
    """Start (recording at most `steps` engine steps: a trace of every step of a busy engine takes minutes to
    write), wait `seconds`, stop, collect the new traces into `output` and summarize them."""
    try:  # before the engine records anything
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInputError(f"--output {output} cannot be made a directory: {exc.strerror}",
                            "give --output a new directory's path") from None
    started = time.time()
    answer = post("/start_profile", {"max_iterations": steps})
    if answer is None or answer[0] != 200:
        raise RuntimeError(f"/start_profile answered {answer[0] if answer else 'nothing'}")
    progress(f"profiling for {seconds:g} s ...")
    sleep(seconds)
    answer = post("/stop_profile", {})
    if answer is None or answer[0] != 200:
        raise RuntimeError(f"/stop_profile answered {answer[0] if answer else 'nothing'}")
    progress("waiting for the engine to write its traces ...")
    found = wait_for_traces(profiles, started - 1.0, trace_timeout_s, sleep=sleep)
    if not found:
        raise RuntimeError(f"no trace appeared in {profiles} within {trace_timeout_s:g} s")
    run = summarize_traces(found, profiles, output)
    run.seconds = seconds
    return run
