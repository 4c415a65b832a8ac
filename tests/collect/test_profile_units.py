"""`npuops profile`'s summary of a Chrome trace (npuops/support/trace_summary.py, pure) and its refusal of an instance
launched without the profiler; the real profile of a running CPU engine is tests/engine/test_profile.py."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from npuops.instance.record import write_record
from npuops.safefiles import ConfinedPath
from npuops.support.profile import summarize_file, trace_files
from npuops.support.trace_stream import TraceBudget
from npuops.support.trace_summary import OperatorEvents, operator_class, summarize_trace
from tests.support.instance_records import make_record
from tests.support.npuops_cli import npuops_argv


def op(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


def test_self_time_takes_each_operator_less_the_operators_it_called() -> None:
    # aten::linear (100 us) calls aten::addmm (70 us), which calls aten::copy_ (10 us); attention beside it.
    events = [op("aten::linear", 0, 100), op("aten::addmm", 10, 70), op("aten::copy_", 20, 10),
              op("aten::_scaled_dot_product_flash_attention", 120, 50), op("aten::linear", 200, 40),
              op("aten::addmm", 205, 30), op("python", 0, 300, cat="python_function"),
              {"ph": "i", "cat": "cpu_op", "name": "marker", "ts": 5}, op("gloo:all_reduce", 0, 25, tid=2)]
    summary = summarize_trace(events)
    times = {o.name: o.self_us for o in summary.operators}
    assert times == {"aten::addmm": 60 + 30, "aten::_scaled_dot_product_flash_attention": 50, "aten::linear": 40,
                     "gloo:all_reduce": 25, "aten::copy_": 10}
    assert summary.total_us == 215 and summary.events == 7
    assert [o.name for o in summary.operators][:2] == ["aten::addmm", "aten::_scaled_dot_product_flash_attention"]
    assert summary.shares["matmul"] == pytest.approx((90 + 40) / 215)
    assert summary.shares["attention"] == pytest.approx(50 / 215)
    assert summary.shares["communication"] == pytest.approx(25 / 215)
    assert summary.shares["host"] == pytest.approx(10 / 215)
    assert sum(summary.shares.values()) == pytest.approx(1.0)
    assert summarize_trace([]).total_us == 0 and summarize_trace([]).shares["host"] == 0


@pytest.mark.parametrize(("name", "kind"), [("aten::mm", "matmul"), ("aten::addmm", "matmul"),
                                            ("_C::onednn_mm", "matmul"), ("hcom_allReduce_", "communication"),
                                            ("npu_fused_infer_attention_score", "attention"),
                                            ("aten::silu", "host"), ("vllm::unified_attention", "attention")])
def test_operators_fall_into_their_class(name: str, kind: str) -> None:
    assert operator_class(name) == kind


def test_traces_are_found_and_read_gzip_or_not(tmp_path: Path) -> None:
    trace = {"traceEvents": [op("aten::mm", 0, 5)]}
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "rank0.123.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    (tmp_path / "frontend.pt.trace.json").write_text(json.dumps(trace))
    (tmp_path / "notes.txt").write_text("not a trace")
    found = trace_files(ConfinedPath(tmp_path), since=0)
    assert [str(f.relative) for f in found] == ["frontend.pt.trace.json", "w/rank0.123.pt.trace.json.gz"]
    for trace in found:
        events = OperatorEvents()
        summarize_file(ConfinedPath(tmp_path) / trace.relative, events, TraceBudget.of())
        assert [o.name for o in events.summary().operators] == ["aten::mm"]
    assert trace_files(ConfinedPath(tmp_path / "absent"), 0) == [] and trace_files(ConfinedPath(tmp_path), 2e9) == []


def test_an_instance_launched_without_profiling_is_refused_with_the_fix(tmp_path: Path) -> None:
    write_record(make_record(tmp_path, "plain"))
    done = subprocess.run(npuops_argv("profile", "plain", "--seconds", "1"), capture_output=True, text=True,
                          env={"NPUOPS_STATE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "launched without profiling" in done.stderr and "--profiling" in done.stderr
    missing = subprocess.run(npuops_argv("profile", "nosuch"), capture_output=True, text=True,
                             env={"NPUOPS_STATE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert missing.returncode != 0 and "nosuch" in missing.stderr and "Traceback" not in missing.stderr


def test_traces_are_waited_for_until_every_writer_is_done(tmp_path: Path) -> None:
    """The API server's trace comes first, a worker's seconds later: the wait returns both, once neither grows."""
    from npuops.support.profile import wait_for_traces

    clock = [0.0]
    frontend, worker = tmp_path / "fe.pt.trace.json", tmp_path / "w0.pt.trace.json.gz"

    def sleep(seconds: float) -> None:
        clock[0] += seconds
        if clock[0] == 1.0:
            frontend.write_text("{}")
        if clock[0] == 3.0:
            worker.write_bytes(b"x" * 10)
        if clock[0] == 4.0:
            worker.write_bytes(b"x" * 20)  # still being written

    found = wait_for_traces(ConfinedPath(tmp_path), since=0, timeout_s=60, sleep=sleep, clock=lambda: clock[0])
    assert [f.relative.name for f in found] == [frontend.name, worker.name] and clock[0] >= 7.0
    assert wait_for_traces(ConfinedPath(tmp_path / "none"), since=0, timeout_s=3, sleep=sleep,
                           clock=lambda: clock[0]) == []
