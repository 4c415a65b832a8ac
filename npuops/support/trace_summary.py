"""Where a profile's time goes, from Chrome-trace events (pure): the operators by self time (an operator's own time,
less the operators it called) and the shares of attention, matrix multiplication, communication and the host.

The events come from a file the engine's service user can write, so each one is checked before it counts: an
operator event (`"ph": "X"`, an operator category) needs a string name and finite numbers within a clock's range
for its start and duration (a number of 400 digits, NaN or a list is not one); its thread ids must be integers or
short strings. An operator event that fails is skipped and counted (`bad_events`), anything else is not an operator
and ignored. What is kept is bounded too: at most MAX_OPERATOR_EVENTS events, in arrays (20 bytes an event), names
cut to MAX_NAME_CHARS, at most MAX_NAMES distinct names and MAX_THREADS threads. So a summary never raises on what a
trace holds (TraceError past the event cap) and its figures are always finite.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
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
KINDS = ("attention", "matmul", "communication", HOST)
# The operator events a summary keeps (about 20 bytes each, plus a sort's 70 while it is summarized): 1 million is
# 10,000 operators a step over 100 steps, more than a profile of vLLM records.
MAX_OPERATOR_EVENTS = 1_000_000
MAX_NAME_CHARS = 200
MAX_NAMES = 50_000
OTHER_NAMES = "(other operators)"  # where the events of names past MAX_NAMES go
MAX_THREADS = 10_000
MAX_THREAD_ID_CHARS = 100
# Times in microseconds: |ts| up to 1e18 (31,000 years), a duration up to 1e15 (31 years): any sum of a million
# of them stays finite.
MAX_START_US = 1e18
MAX_DURATION_US = 1e15
MAX_NUMBER_CHARS = 40  # a time given as a string ("12.5")


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
    events: int  # operator events summarized
    bad_events: int = 0  # operator events skipped: a field missing, of the wrong type or out of range

    def to_json(self, top: int = 15) -> dict[str, Any]:
        return {"total_ms": round(self.total_us / 1e3, 3), "events": self.events, "bad_events": self.bad_events,
                "shares": {k: round(v, 4) for k, v in self.shares.items()},
                "top_operators": [{"name": o.name, "self_ms": round(o.self_us / 1e3, 3), "calls": o.calls,
                                   "kind": o.kind} for o in self.operators[:top]]}


def operator_class(name: str) -> str:
    for kind, pattern in CLASSES:
        if pattern.search(name):
            return kind
    return HOST


def _time(value: object, low: float, high: float) -> float | None:
    """A time of an event: a finite number (or a number's short string) within [low, high]; None otherwise."""
    if isinstance(value, str) and len(value) <= MAX_NUMBER_CHARS:
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return None
    return number if math.isfinite(number) and low <= number <= high else None


def _thread_id(value: object) -> int | str | None:
    """A pid or tid as a key: an integer or a short string (absent: None); anything else raises ValueError."""
    if value is None or (isinstance(value, str) and len(value) <= MAX_THREAD_ID_CHARS):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63:
        return value
    raise ValueError(value)


@dataclass
class _Thread:
    starts: array[float] = field(default_factory=lambda: array("d"))
    durations: array[float] = field(default_factory=lambda: array("d"))
    names: array[int] = field(default_factory=lambda: array("I"))


@dataclass
class _Names:
    ids: dict[str, int] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)

    def id(self, name: str) -> int:
        name = name[:MAX_NAME_CHARS]
        found = self.ids.get(name)
        if found is None:
            if len(self.names) >= MAX_NAMES:
                name = OTHER_NAMES
                found = self.ids.get(name)
            if found is None:
                found = self.ids[name] = len(self.names)
                self.names.append(name)
        return found


class OperatorEvents:
    """The operator events of one or more traces, kept compactly: per thread, their starts, durations and name ids
    in arrays. `part()` gives one for a single trace, sharing the names, whose events join with `absorb` once the
    trace was read whole."""

    def __init__(self, names: _Names | None = None, before: int = 0) -> None:
        self.names = names or _Names()
        self.threads: dict[tuple[int | str | None, int | str | None], _Thread] = {}
        self.events = 0
        self.bad = 0
        self._before = before  # events held elsewhere that count against the cap

    def part(self) -> OperatorEvents:
        return OperatorEvents(self.names, self.events + self._before)

    def add(self, event: object) -> None:
        """Keep an operator event, count a bad one, ignore anything else; TraceError past the cap."""
        if not isinstance(event, dict) or event.get("ph") != "X":
            return
        category = event.get("cat")
        if not isinstance(category, str) or category not in OPERATOR_CATEGORIES:
            return
        name, start, duration = event.get("name"), event.get("ts"), event.get("dur")
        # A float in range as it comes (NaN fails the comparison); anything else through _time.
        if type(start) is not float or not -MAX_START_US <= start <= MAX_START_US:
            start = _time(start, -MAX_START_US, MAX_START_US)
        if type(duration) is not float or not 0.0 <= duration <= MAX_DURATION_US:
            duration = _time(duration, 0.0, MAX_DURATION_US)
        try:
            key = (_thread_id(event.get("pid")), _thread_id(event.get("tid")))
        except ValueError:
            key = None
        if not isinstance(name, str) or start is None or duration is None or key is None or \
                (key not in self.threads and len(self.threads) >= MAX_THREADS):
            self.bad += 1
            return
        if self.events + self._before >= MAX_OPERATOR_EVENTS:
            raise TraceError(f"more than {MAX_OPERATOR_EVENTS:,} operator events (record fewer --steps)")
        thread = self.threads.get(key)
        if thread is None:
            thread = self.threads[key] = _Thread()
        thread.starts.append(start)
        thread.durations.append(duration)
        thread.names.append(self.names.id(name))
        self.events += 1

    def absorb(self, part: OperatorEvents) -> None:
        for key, events in part.threads.items():
            mine = self.threads.setdefault(key, _Thread())
            mine.starts.extend(events.starts)
            mine.durations.extend(events.durations)
            mine.names.extend(events.names)
        self.events += part.events
        self.bad += part.bad

    def summary(self) -> TraceSummary:
        """The operators by self time and the shares of their classes."""
        times = array("d", bytes(8 * len(self.names.names)))
        calls = array("q", bytes(8 * len(self.names.names)))
        for thread in self.threads.values():
            for name, own in _self_times(thread):
                times[name] += own
                calls[name] += 1
        operators = sorted((OperatorTime(n, times[i], calls[i], operator_class(n))
                            for i, n in enumerate(self.names.names) if calls[i]),
                           key=lambda o: o.self_us, reverse=True)
        total = math.fsum(o.self_us for o in operators)
        shares = dict.fromkeys(KINDS, 0.0)
        for o in operators:
            shares[o.kind] += o.self_us / total if total else 0.0
        return TraceSummary(total, tuple(operators), shares, self.events, self.bad)


def _self_times(thread: _Thread) -> Iterator[tuple[int, float]]:
    """(name id, self time) of the complete events of one thread: each event's duration less its direct children's.
    The order and the stack are arrays too: a million nested events cost megabytes, not a list of lists each."""
    starts, durations = thread.starts, thread.durations
    order = sorted(range(len(starts)), key=durations.__getitem__, reverse=True)
    order.sort(key=starts.__getitem__)  # stable: by start, the longer first where two start together
    names, ends, children, owns = array("I"), array("d"), array("d"), array("d")
    for index in order:
        start, duration = starts[index], durations[index]
        while ends and ends[-1] <= start:
            children_time, own = children.pop(), owns.pop()
            ends.pop()
            yield names.pop(), max(own - children_time, 0.0)
        if ends:
            children[-1] += duration
        names.append(thread.names[index])
        ends.append(start + duration)
        children.append(0.0)
        owns.append(duration)
    while ends:
        children_time, own = children.pop(), owns.pop()
        ends.pop()
        yield names.pop(), max(own - children_time, 0.0)


def summarize_trace(trace_events: Iterable[object]) -> TraceSummary:
    """The operators of a Chrome trace's events by self time, and the shares of their classes (pure)."""
    events = OperatorEvents()
    for event in trace_events:
        events.add(event)
    return events.summary()
