"""`npuops profile` reads traces from a directory the engine's service user writes: a trace that is not JSON, a
truncated .gz, one too big to summarize, nesting deeper than a parser goes, a link to another file or directory
are each left out with why, never a traceback or "interrupted" (issue 45, findings 2 and 6). Where the traces are
is derived from the instance's name (tests/collect/test_instance_paths.py)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from npuops.errors import MeasurementError
from npuops.instance.record import write_record
from npuops.safefiles import ConfinedPath
from npuops.support.profile import summarize_traces, trace_files
from npuops.support.trace_stream import TraceBudget
from tests.support.http_server import start_server, stop_server
from tests.support.instance_records import make_record
from tests.support.npuops_cli import npuops_argv

HUGE = 2**20  # the most JSON the traces may hold in these tests (MAX_SUMMARY_BYTES in npuops)


def op(name: str, ts: float, dur: float) -> dict[str, object]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 7, "tid": 1, "ts": ts, "dur": dur}


def _plant_bad_traces(directory: Path, outside: Path) -> None:
    """Every kind of file a trace directory must not trip on (`outside`: a directory with a good trace)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "notjson.pt.trace.json").write_text("this is not JSON {")
    whole = gzip.compress(json.dumps({"traceEvents": [op("aten::mm", 0, 5)]}).encode())
    (directory / "cut.pt.trace.json.gz").write_bytes(whole[: len(whole) // 2])
    (directory / "deep.pt.trace.json").write_text("[" * 200_000)
    with open(directory / "huge.pt.trace.json", "wb") as handle:
        handle.truncate(2 * HUGE)  # sparse: bigger than the summaries below read
    (directory / "link.pt.trace.json").symlink_to(outside / "good.pt.trace.json")
    (directory / "linked-dir").symlink_to(outside)
    os.mkfifo(directory / "fifo.pt.trace.json")


def _good_trace(directory: Path, name: str = "good.pt.trace.json") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps({"traceEvents": [op("secret_elsewhere::op", 0, 50)]}))


def test_each_unreadable_trace_is_left_out_with_why_and_the_rest_summarized(tmp_path: Path) -> None:
    profiles, outside, out = tmp_path / "profiles", tmp_path / "outside", tmp_path / "out"
    _good_trace(outside)
    _plant_bad_traces(profiles, outside)
    (profiles / "w0").mkdir()
    (profiles / "w0" / "rank0.pt.trace.json.gz").write_bytes(
        gzip.compress(json.dumps({"traceEvents": [op("aten::addmm", 0, 40)]}).encode()))
    directory = ConfinedPath(profiles)
    found = trace_files(directory, since=0)
    # Links, the FIFO and whatever a linked directory holds are not traces to read.
    assert sorted(str(f.relative) for f in found) == ["cut.pt.trace.json.gz", "deep.pt.trace.json",
                                                      "huge.pt.trace.json", "notjson.pt.trace.json",
                                                      "w0/rank0.pt.trace.json.gz"]
    run = summarize_traces(found, directory, out, budget=TraceBudget.of(max_bytes=HUGE))
    assert run.summary is not None and [o.name for o in run.summary.operators] == ["aten::addmm"]
    why = dict(run.skipped)
    assert "not a whole gzip file" in why["cut.pt.trace.json.gz"]
    assert "not JSON" in why["notjson.pt.trace.json"] and "not JSON" in why["deep.pt.trace.json"]
    assert "too big" in why["huge.pt.trace.json"]
    assert (out / "w0" / "rank0.pt.trace.json.gz").is_file() and not (out / "link.pt.trace.json").exists()


def test_no_readable_trace_is_one_measurement_error(tmp_path: Path) -> None:
    profiles, outside = tmp_path / "profiles", tmp_path / "outside"
    _good_trace(outside)
    _plant_bad_traces(profiles, outside)
    directory = ConfinedPath(profiles)
    with pytest.raises(MeasurementError) as failed:
        summarize_traces(trace_files(directory, since=0), directory, tmp_path / "out",
                         budget=TraceBudget.of(max_bytes=HUGE))
    assert "could be read" in failed.value.problem


def test_profile_of_unreadable_traces_says_why_in_one_line(tmp_path: Path) -> None:
    state, elsewhere = tmp_path / "state", tmp_path / "elsewhere"
    server, url, seen = start_server({"/start_profile": (200, b"{}"), "/stop_profile": (200, b"{}")})
    try:
        port = int(url.rsplit(":", 1)[1])
        profiles = state / "pf" / "profiles"  # the foreground status directory's profiles/, as launch puts them
        write_record(make_record(state, "pf", manager="foreground", port=port, profiler_dir=str(profiles)))
        (state / "pf" / "env").write_text("")
        # A good trace reachable only through links: not read.
        _good_trace(elsewhere, "elsewhere.pt.trace.json")
        _plant_bad_traces(profiles, elsewhere)
        later = time.time() + 3600  # written "after" the profile starts
        for trace in profiles.iterdir():
            if trace.is_file() and not trace.is_symlink():
                os.utime(trace, (later, later))
        done = subprocess.run(npuops_argv("profile", "pf", "--seconds", "1", "--output", str(tmp_path / "out")),
                              env={"NPUOPS_STATE_DIR": str(state), "PATH": "/usr/bin:/bin"}, capture_output=True,
                              text=True, timeout=120)
    finally:
        stop_server(server)
    assert [s.path for s in seen] == ["/start_profile", "/stop_profile"]
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and "interrupted" not in done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("npuops: error:")]
    assert len(error) == 1 and "could be read" in error[0] and "not a whole gzip file" in error[0]
    assert "secret_elsewhere" not in done.stdout + done.stderr
