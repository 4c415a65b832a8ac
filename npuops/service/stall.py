"""A serving engine that holds requests and makes no progress: a hung rank somewhere in its group.

vLLM's /health asks only whether the engine process is alive. A pipeline stage or data-parallel rank that hangs on
another host (a stopped process, a stuck collective: on NPUs the HCCL wait lasts HCCL_EXEC_TIMEOUT, which
deployment guides set to 30-60 min) leaves /health answering 200 while every request waits; a CI run with one
Ray worker stopped by SIGSTOP saw exactly that. The engine's own counters say it: requests running or waiting, and
the prompt and generation tokens it has processed (`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`)
not moving. An idle engine holds nothing and is never a stall; a busy one moves its counters every step.

A stopped process is the other hang one host can see for itself: a headless data-parallel rank has no /metrics,
but its supervisor sees its engine's processes in state T (SIGSTOP, SIGTSTP, a debugger) in /proc.

The verdicts are pure (samples or /proc text in); the supervisor scrapes, reads and acts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from npuops.instance.metrics import Sample

HELD = ("vllm:num_requests_running", "vllm:num_requests_waiting")
PROGRESS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


@dataclass(frozen=True)
class EngineProgress:
    held: float  # requests the engine holds: running and waiting, over every engine of the endpoint
    tokens: float  # prompt and generation tokens processed since the engine started


def engine_progress(samples: Sequence[Sample]) -> EngineProgress | None:
    """The figures a stall is judged by, or None when the scrape lacks them (an engine that exports none)."""
    values = {name: [s.value for s in samples if s.name == name] for name in (*HELD, *PROGRESS)}
    if not all(values[name] for name in PROGRESS) or not any(values[name] for name in HELD):
        return None
    return EngineProgress(sum(sum(values[n]) for n in HELD), sum(sum(values[n]) for n in PROGRESS))


class StallWatch:
    """Remembers when the engine's token counters last moved, and since when it has held requests; `observe` names
    a stall once the engine has held requests, or left a probe request unanswered, for `window_s` (the instance's
    watchdog: as long as /health may fail before a restart) with its counters standing still.

    A probe is needed because a blocked step publishes nothing: a request that arrives at an engine whose rank hangs
    joins a step that never ends, and the gauges keep saying 0 running (a CI run's PP=2 engine with its second stage
    stopped by SIGSTOP). The supervisor of a multi-node engine therefore sends one 1-token completion now and then
    and passes `probe_sent_at` while it is unanswered; a busy engine moves its counters while the probe queues, so
    load alone is never a stall."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._tokens: float | None = None
        self._moved_at = 0.0
        self._busy_since: float | None = None

    def observe(self, progress: EngineProgress | None, now: float, probe_sent_at: float | None = None) -> str | None:
        if progress is None:  # a scrape that failed says nothing
            return None
        if progress.held <= 0:
            self._busy_since = None
        elif self._busy_since is None:
            self._busy_since = now
        if progress.tokens != self._tokens:
            self._tokens, self._moved_at = progress.tokens, now
            return None
        starts = [max(self._moved_at, since) for since in (self._busy_since, probe_sent_at) if since is not None]
        if not starts:
            return None
        stalled = now - min(starts)
        if stalled < self.window_s:
            return None
        what = (f"{progress.held:.0f} request(s) held" if progress.held > 0
                else "a 1-token probe completion unanswered")
        return f"{what} and no token processed for {stalled:.0f} s while /health answers"


def parse_proc_stat(text: str) -> tuple[str, int] | None:
    """(state, process group) from a /proc/PID/stat line, or None. The command name (field 2) is in parentheses and
    may hold spaces and parentheses itself, so the fields after it are counted from its last ')' (proc(5))."""
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 3 or not fields[2].lstrip("-").isdigit():
        return None
    return fields[0], int(fields[2])


def _stopped(proc: Path, wanted: Callable[[Path, int], bool]) -> list[int]:
    stopped = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parsed = parse_proc_stat((entry / "stat").read_text())
            if parsed is not None and parsed[0] in ("T", "t") and wanted(entry, parsed[1]):
                stopped.append(int(entry.name))
        except OSError:  # gone since the listing
            continue
    return sorted(stopped)


def stopped_in_group(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes of process group `pgid` that are stopped (state T: SIGSTOP, SIGTSTP; t: a tracer's stop). A
    stopped rank holds its whole group at the next collective, and nothing but its own host can see it."""
    return _stopped(proc, lambda entry, group: group == pgid)


def stopped_ray_workers(proc: Path = Path("/proc")) -> list[int]:
    """This host's stopped Ray worker processes (their titles start with `ray::`, e.g. `ray::RayWorkerProc.run`):
    what a Ray head asks every node when its engine stalls (npuops.instance.ray.find_stopped_workers)."""
    return _stopped(proc, lambda entry, group: (entry / "cmdline").read_bytes().startswith(b"ray::"))
