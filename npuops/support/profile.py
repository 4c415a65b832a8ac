"""`npuops profile NAME`: vLLM's own profiler on a live instance, and where its time goes.

An instance launched with `--profiling` runs vLLM with `--profiler-config` (the torch profiler, its traces in the
instance's state directory; on an NPU vllm-ascend's profiler takes the same configuration and records with
torch_npu's). `profile` asks the engine to start (POST /start_profile), waits while the instance serves its load, asks
it to stop (POST /stop_profile), waits for the traces it writes, copies them to --output and summarizes them: the
operators by self time (an operator's own time, less the operators it called), and the shares of attention, matrix
multiplication, communication and everything else the host runs (Python, scheduling, element-wise operators). The
traces open in Perfetto (ui.perfetto.dev) or MindStudio Insight.

The summary (npuops/support/trace_summary.py) is pure: it reads Chrome-trace events. The traces come from a
directory the engine's service user writes (the status directory npuops derives, not the record's `profiler_dir`):
each is read through npuops.safefiles (a regular file, no link followed) and streamed, never parsed whole
(npuops/support/trace_stream.py: a .gz decompressed a piece at a time; all the traces together within one budget of
JSON and events); one that is not a trace (not JSON, a truncated .gz, past the budget, a link) is left out with why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError, MeasurementError
from npuops.safefiles import READ_CHUNK, ConfinedPath, FoundFile, NotRead, open_regular, printable, walk_regular_files
from npuops.support.trace_stream import MIB, TraceBudget, trace_elements, trace_text
from npuops.support.trace_summary import OperatorEvents, TraceError, TraceSummary

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", "trace_view.json")
STABLE_POLLS = 3
# A trace bigger than this is not even copied (--steps bounds what the engine records).
MAX_COPY_BYTES = 4 * 2**30


def summarize_file(path: ConfinedPath, into: OperatorEvents, budget: TraceBudget) -> None:
    """The operator events of one trace (Chrome-trace JSON, gzip'd or not) added to `into` once it was read whole,
    streamed in bounded memory within the budget; TraceError says why a file is not summarized (nothing added)."""
    if budget.spent:
        raise TraceError(budget.why_spent())
    part = into.part()
    try:
        with open_regular(path) as (fd, info):
            if not path.name.endswith(".gz") and info.st_size > budget.bytes_left:
                raise TraceError(f"{printable(path.name)} holds {info.st_size / MIB:.0f} MiB of JSON, more than the "
                                 f"{budget.bytes_left / MIB:.0f} MiB left: too big to summarize: {budget.why_spent()}")
            for event in trace_elements(trace_text(fd, path.name, budget), path.name, budget):
                part.add(event)
    except NotRead as exc:
        raise TraceError(exc.reason) from None
    into.absorb(part)


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
                     budget: TraceBudget | None = None) -> ProfileRun:
    """Each trace copied into `output` (as `directory` holds it) and summarized, all of them within one budget (
    TraceBudget: the JSON and the events the summary reads); one that cannot be is skipped with why.
    MeasurementError when none could be read."""
    run = ProfileRun()
    budget = budget or TraceBudget.of()
    events = OperatorEvents()
    readable = 0
    for trace in found:
        source = directory / trace.relative
        copy = output.joinpath(*(printable(part) for part in trace.relative.parts))
        try:
            copy_trace(source, copy)
            run.traces.append(copy)
            summarize_file(source, events, budget)
            readable += 1
        except TraceError as exc:  # its reason may name the file as the service user spelt it: escaped
            run.skipped.append((printable(str(trace.relative)), printable(str(exc))))
    if not readable:
        reasons = "; ".join(why for _name, why in run.skipped[:3])
        raise MeasurementError(f"none of the {len(run.skipped)} traces in {directory} could be read ({reasons})",
                               f"see the traces in {output}; profile again (with fewer --steps if one is too big)")
    run.summary = events.summary()
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
