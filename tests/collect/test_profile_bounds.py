"""`npuops profile` summarizes traces the engine's service user writes: whatever an event holds, the summary neither
raises nor prints NaN (finding 6), a name never reaches the terminal unescaped (finding 5), and the traces of one
profile cost bounded memory however big, however compressed, however many events (finding 3)."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuops.instance.record import write_record
from npuops.safefiles import ConfinedPath
from npuops.support import trace_summary
from npuops.support.profile import summarize_traces, trace_files
from npuops.support.trace_stream import TraceBudget, trace_elements
from npuops.support.trace_summary import OPERATOR_CATEGORIES, TraceError, summarize_trace
from tests.support.http_server import start_server, stop_server
from tests.support.instance_records import make_record
from tests.support.npuops_cli import npuops_argv

MIB = 2**20


def op(name: str, ts: float, dur: float, tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


@pytest.mark.parametrize("bad", [
    {"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 2},  # no name
    {**op("a", 0, 2), "ts": 10**400},  # an integer no float holds
    {**op("a", 0, 2), "dur": -(10**400)},
    {**op("a", 0, 2), "pid": [1]},  # unhashable
    {**op("a", 0, 2), "tid": {"x": 1}},
    {**op("a", 0, 2), "cat": {}},
    {**op("a", 0, 2), "cat": ["cpu_op"]},
    {**op("a", 0, 2), "ts": float("nan")},
    {**op("a", 0, 2), "dur": float("inf")},
    {**op("a", 0, 2), "ts": "NaN"},
    {**op("a", 0, 2), "dur": -5},
    {**op("a", 0, 2), "name": 12},
    {**op("a", 0, 2), "dur": True},
])
def test_an_event_of_the_wrong_shape_is_skipped_and_counted(bad: dict[str, Any]) -> None:
    summary = summarize_trace([bad, op("aten::mm", 10, 5)])
    shown = json.loads(json.dumps(summary.to_json(), allow_nan=False))
    assert [o["name"] for o in shown["top_operators"]] == ["aten::mm"]
    assert shown["total_ms"] == 0.005 and shown["events"] == 1
    # A category that is not an operator's is not an operator (not a bad one); everything else is counted.
    assert shown["bad_events"] == (0 if not isinstance(bad["cat"], str) else 1)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.integers(min_value=10**300)
                           | st.floats() | st.text(max_size=30),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4),
                           max_leaves=12)
# Events shaped like operators, every field of any JSON type (and left out), beside arbitrary JSON elements.
operator_like = st.fixed_dictionaries({"ph": st.just("X") | json_values},
                                      optional={"cat": st.sampled_from(sorted(OPERATOR_CATEGORIES)) | json_values,
                                                "name": st.text(max_size=300) | json_values,
                                                "ts": st.floats() | st.integers() | json_values,
                                                "dur": st.floats() | st.integers() | json_values,
                                                "pid": json_values, "tid": json_values})


@given(events=st.lists(operator_like | json_values, max_size=30))
@settings(max_examples=200, deadline=None)
def test_any_json_events_give_a_finite_summary_and_never_raise(events: list[Any]) -> None:
    summary = summarize_trace(events)
    text = json.dumps(summary.to_json(top=100), allow_nan=False)
    assert json.loads(text)["events"] + summary.bad_events <= len(events)
    assert sum(summary.shares.values()) == pytest.approx(1.0 if summary.total_us else 0.0)
    assert all(len(o.name) <= trace_summary.MAX_NAME_CHARS for o in summary.operators)


def _pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@given(events=st.lists(json_values, max_size=12), cuts=st.lists(st.integers(min_value=0), max_size=8),
       wrapped=st.booleans(), indent=st.sampled_from([None, 0, 2]))
@settings(max_examples=200, deadline=None)
def test_a_trace_read_in_any_pieces_gives_the_events_json_would(events: list[Any], cuts: list[int], wrapped: bool,
                                                                indent: int | None) -> None:
    trace: object = {"schemaVersion": 1, "traceEvents": events, "tail": {"x": [1, 2]}} if wrapped else events
    text = json.dumps(trace, indent=indent)
    streamed = list(trace_elements(iter(_pieces(text, cuts)), "t.json", TraceBudget.of()))
    assert json.dumps(streamed) == json.dumps(events)


@given(text=st.text(alphabet='[]{}",:0123456789.eE-+ \ntrueflasn', max_size=60),
       cuts=st.lists(st.integers(min_value=0), max_size=4))
@settings(max_examples=300, deadline=None)
def test_any_text_streams_into_events_or_one_trace_error(text: str, cuts: list[int]) -> None:
    try:
        streamed = list(trace_elements(iter(_pieces(text, cuts)), "t.json", TraceBudget.of()))
    except TraceError:
        return
    parsed = json.loads(text)
    assert json.dumps(streamed) == json.dumps(parsed["traceEvents"] if isinstance(parsed, dict) else parsed)


def test_a_trace_streamed_from_disk_gives_the_summary_of_its_events(tmp_path: Path) -> None:
    """The streaming reader against json.loads: the object form with other keys around traceEvents, the array form,
    whitespace and a .gz of many tiny members."""
    events = [op("aten::linear", 0, 100), op("aten::addmm", 10, 70), {"ph": "M", "name": "process_name"},
              op("gloo:all_reduce", 0, 25, tid=2), op(" spaced \u00e9 ", 300, 1.5)]
    expected = summarize_trace(events).to_json()
    (tmp_path / "a.pt.trace.json").write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [{"id": 0}],
                                                          "traceEvents": events, "traceName": "x"}, indent=3))
    members = json.dumps(events).encode()
    with open(tmp_path / "b.pt.trace.json.gz", "wb") as handle:
        for i in range(0, len(members), 7):
            handle.write(gzip.compress(members[i:i + 7]))
    for name in ("a.pt.trace.json", "b.pt.trace.json.gz"):
        run = summarize_traces([f for f in trace_files(ConfinedPath(tmp_path), 0) if f.relative.name == name],
                               ConfinedPath(tmp_path), tmp_path / "out")
        assert run.summary is not None and run.summary.to_json() == expected, name


def test_the_traces_of_a_profile_share_one_budget_and_the_rest_is_copied_with_why(tmp_path: Path) -> None:
    profiles, out = tmp_path / "profiles", tmp_path / "out"
    profiles.mkdir()
    (profiles / "a.pt.trace.json").write_text(json.dumps([op("aten::mm", 0, 5)] * 100))
    (profiles / "b.pt.trace.json").write_text(json.dumps([op("aten::silu", 0, 5)] * 100))
    (profiles / "c.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps([op("aten::bmm", 0, 5)] * 100).encode()))
    found = trace_files(ConfinedPath(profiles), 0)
    size = (profiles / "a.pt.trace.json").stat().st_size
    run = summarize_traces(found, ConfinedPath(profiles), out, budget=TraceBudget.of(max_bytes=size + 100))
    assert run.summary is not None and [o.name for o in run.summary.operators] == ["aten::mm"]
    why = dict(run.skipped)
    assert set(why) == {"b.pt.trace.json", "c.pt.trace.json.gz"}
    assert all("too big to summarize" in w or "copied, not summarized" in w for w in why.values())
    assert sorted(p.name for p in run.traces) == ["a.pt.trace.json", "b.pt.trace.json", "c.pt.trace.json.gz"]
    # The elements too: the trace that goes over is left out whole, never half counted.
    run = summarize_traces(found, ConfinedPath(profiles), out, budget=TraceBudget.of(max_elements=150))
    assert run.summary is not None and run.summary.events == 100 and len(run.skipped) == 2


def test_operator_events_past_the_cap_leave_their_trace_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_summary, "MAX_OPERATOR_EVENTS", 150)
    (tmp_path / "a.pt.trace.json").write_text(json.dumps([op("aten::mm", i, 1) for i in range(100)]))
    (tmp_path / "b.pt.trace.json").write_text(json.dumps([op("aten::silu", i, 1) for i in range(100)]))
    run = summarize_traces(trace_files(ConfinedPath(tmp_path), 0), ConfinedPath(tmp_path), tmp_path / "out")
    assert run.summary is not None and run.summary.events == 100
    assert "operator events" in dict(run.skipped)["b.pt.trace.json"]


# The worst a trace directory can hold for memory: many tiny elements (json.loads makes a dict of each), operator
# events nested in one thread (the summary keeps them all and sorts them), and a small .gz of hundreds of MiB. Sized
# so that parsing them whole takes more than the bound; at the cap (a million nested events) the peak was 118 MiB
# (docs/support.md).
FLOOD, NESTED = 1_500_000, 300_000
_MEASURE = """
import sys
from pathlib import Path
from npuops.errors import MeasurementError
from npuops.safefiles import ConfinedPath
from npuops.support.profile import summarize_traces, trace_files
for directory in sys.argv[1:]:
    try:
        run = summarize_traces(trace_files(ConfinedPath(Path(directory)), 0), ConfinedPath(Path(directory)),
                               Path(directory + "-out"))
        print(directory, run.summary.events, [why[:60] for _name, why in run.skipped], file=sys.stderr)
    except MeasurementError as exc:
        print(directory, exc.problem[:300], file=sys.stderr)
"""
# A process forked from pytest inherits its peak RSS: a small child runs the summary and reports its child's peak.
_PEAK_OF_CHILD = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
                  "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def _write_worst_traces(tmp_path: Path) -> list[Path]:
    flood, nested, bomb = tmp_path / "flood", tmp_path / "nested", tmp_path / "bomb"
    for directory in (flood, nested, bomb):
        directory.mkdir()
    with open(flood / "a.pt.trace.json", "w") as handle:  # 4.5 MB of `{}`: about 130 MB as json.loads' dicts
        handle.write("[" + "{}," * FLOOD + "{}]")
    with open(nested / "n.pt.trace.json", "w") as handle:  # each event inside the one before: a stack as deep
        handle.write('{"traceEvents": [')
        handle.write(",".join(f'{{"ph":"X","cat":"kernel","name":"k{i % 997}","ts":{i},"dur":{2 * NESTED - 2 * i}}}'
                              for i in range(NESTED)))
        handle.write("]}")
    with gzip.open(bomb / "z.pt.trace.json.gz", "wb", compresslevel=1) as zipped:  # 300 MiB of spaces in 1 MiB
        zipped.write(b"[")
        for _ in range(300):
            zipped.write(b" " * MIB)
        zipped.write(b"]")
    return [flood, nested, bomb]


def test_the_worst_traces_are_summarized_in_bounded_memory(tmp_path: Path) -> None:
    directories = _write_worst_traces(tmp_path)
    done = subprocess.run([sys.executable, "-c", _PEAK_OF_CHILD, sys.executable, "-c", _MEASURE,
                           *map(str, directories)], capture_output=True, text=True, timeout=600)
    rc, peak_kib = (int(v) for v in done.stdout.split())
    assert rc == 0, done.stderr[-3000:]
    peak_mib = peak_kib // 1024
    assert peak_mib < 100, f"profile's summary peaked at {peak_mib} MiB\n{done.stderr}"
    report = done.stderr.splitlines()
    assert f"{directories[1]} {NESTED} []" in report, report  # the nested events were summarized
    assert "too big to summarize" in next(line for line in report if line.startswith(str(directories[2])))


def test_an_operator_name_with_terminal_escapes_is_printed_escaped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    hostile = "\x1b]0;PWN\x07\x1b[2J\r\nFAKE\u202e"
    server, url, _seen = start_server({"/start_profile": (200, b"{}"), "/stop_profile": (200, b"{}")})
    try:
        profiles = state / "pf" / "profiles"
        write_record(make_record(state, "pf", manager="foreground", port=int(url.rsplit(":", 1)[1]),
                                 profiler_dir=str(profiles)))
        (state / "pf" / "env").write_text("")
        profiles.mkdir()
        trace = profiles / f"{hostile}.pt.trace.json"
        trace.write_text(json.dumps({"traceEvents": [op(hostile, 1, 2)]}))
        later = time.time() + 3600
        os.utime(trace, (later, later))
        done = subprocess.run(npuops_argv("profile", "pf", "--seconds", "1", "--output", str(tmp_path / "out")),
                              env={"NPUOPS_STATE_DIR": str(state), "PATH": "/usr/bin:/bin"}, capture_output=True,
                              text=True, timeout=120)
    finally:
        stop_server(server)
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(line.isprintable() for line in done.stdout.splitlines()), done.stdout
    assert "\\x1b]0;PWN\\x07" in done.stdout and "FAKE" in done.stdout


@given(name=st.text(max_size=80), why=st.text(max_size=80))
@settings(max_examples=200, deadline=None)
def test_every_line_profile_prints_is_printable_whatever_the_trace_names(name: str, why: str) -> None:
    from npuops.cli.profile_cmd import summary_lines

    summary = {"instance": "pf", "seconds": 1.0, "output": "/tmp/out", "total_ms": 1.0, "events": 1, "bad_events": 0,
               "shares": {"host": 1.0}, "skipped": [{"trace": name, "why": why}],
               "top_operators": [{"name": name, "self_ms": 1.0, "calls": 1, "kind": "host"}]}
    for line in summary_lines(summary):
        assert line.isprintable(), line


def test_why_a_hostile_named_trace_was_left_out_is_escaped(tmp_path: Path) -> None:
    """A trace the engine's user swaps for a link after it was listed: the reason names its directory as that user
    spelt it, escaped."""
    from npuops.errors import MeasurementError

    directory = tmp_path / "\x1b[2J\x1b]0;pwned\x07"
    directory.mkdir()
    (directory / "a.pt.trace.json").write_text("[]")
    found = trace_files(ConfinedPath(tmp_path), 0)
    (directory / "a.pt.trace.json").unlink()
    (directory / "a.pt.trace.json").symlink_to("/etc/hostname")
    with pytest.raises(MeasurementError) as failed:
        summarize_traces(found, ConfinedPath(tmp_path), tmp_path / "out")
    assert failed.value.one_line().isprintable() and "\\x1b[2J" in failed.value.problem
