"""Prometheus follows what serves (npuops/monitor/refresh.py): `npuops monitor render` keeps its directory and
choices, a refresh renders them again from the records on disk, and an instance its operator stopped leaves the
targets (a crashed one stays, so its alerts fire). Under real systemd with real engines and a real Prometheus:
tests/systemd/test_router.py."""

from __future__ import annotations

import json
from pathlib import Path

from npuops.instance.record import InstanceRecord, list_records, write_status
from npuops.instance.state import SupervisorExit, SupervisorState
from npuops.launch.install import write_instance
from npuops.launch.instance_files import LaunchSpec, render_instances
from npuops.monitor.refresh import MONITOR_FILE, refresh_monitoring, save_render, saved_render
from npuops.monitor.render import MonitorChoices
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target
from tests.support.instance_records import keep_status_under
from tests.support.model_dirs import write_tiny_model


def _launched(tmp_path: Path) -> tuple[Path, list[InstanceRecord]]:
    """Instance m (two replicas behind a router) as a launch leaves its files in the state directory."""
    state = tmp_path / "state"
    model = write_tiny_model(tmp_path / "tiny-llama")
    plan = make_plan(load_model(str(model)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", replicas=2))
    instances = render_instances(plan, LaunchSpec(name="m", port=9100, state_dir=state))
    for instance in instances:
        write_instance(instance, state)
        keep_status_under(state / instance.name, tmp_path / "var")
    return state, list_records(state)


def _parts(out: Path, job: str) -> list[str]:
    return [g["labels"]["npuops_part"] for g in json.loads((out / "targets" / f"{job}.json").read_text())]


def _ended(record: InstanceRecord, reason: str) -> None:
    """The state a supervisor leaves when it ends (no pid: it is gone)."""
    write_status(record, SupervisorState(record.name, None, exit=SupervisorExit(0 if reason == "stopped" else 1,
                                                                                   reason)))


def test_a_refresh_renders_the_saved_directory_from_what_serves(tmp_path: Path) -> None:
    state, records = _launched(tmp_path)
    assert refresh_monitoring(state, "node-1") is None  # never set up here: nothing to follow
    out = tmp_path / "monitor"
    save_render(state, out, MonitorChoices(node_exporter=None, latency_factor=4.0))
    assert saved_render(state) == (out.resolve(), MonitorChoices(node_exporter=None, latency_factor=4.0))
    saved = json.loads((state / MONITOR_FILE).read_text())
    (state / MONITOR_FILE).write_text(json.dumps({"output": saved["output"], "choices": {}}))  # an older npuops'
    assert saved_render(state) == (out.resolve(), MonitorChoices())
    save_render(state, out, MonitorChoices(node_exporter=None, latency_factor=4.0))
    line = refresh_monitoring(state, "node-1")
    assert line == f"monitoring: Prometheus' targets and rules in {out.resolve()} follow the change"
    assert _parts(out, "engines") == ["m-r0", "m-r1"] and _parts(out, "routers") == ["m"]
    assert json.loads((out / "targets" / "node.json").read_text()) == []  # node_exporter: none, as saved
    assert "NpuopsTTFTAbovePrediction" in (out / "rules" / "npuops.rules.yml").read_text()

    replica0, replica1 = (r for r in records if r.behind)
    _ended(replica1, "engine-exited")  # a crash: still watched, its alerts fire
    _ended(replica0, "stopped")  # the operator's stop: out of the targets
    refresh_monitoring(state, "node-1")
    assert _parts(out, "engines") == ["m-r1"] and _parts(out, "routers") == ["m"]
    _ended(replica1, "stopped")  # the whole instance stopped: its router goes with it
    refresh_monitoring(state, "node-1")
    assert _parts(out, "engines") == [] and _parts(out, "routers") == []


def test_a_refresh_that_cannot_run_says_so_in_one_line(tmp_path: Path) -> None:
    state, _ = _launched(tmp_path)
    (state / MONITOR_FILE).write_text("{not json")
    line = refresh_monitoring(state, "node-1")
    assert line is not None and line.startswith("warning: monitoring not refreshed: ")
    assert "npuops monitor render --output DIR" in line and "\n" not in line
    blocked = tmp_path / "file"
    blocked.write_text("")
    save_render(state, blocked / "monitor", MonitorChoices())
    line = refresh_monitoring(state, "node-1")
    assert line is not None and line.startswith("warning: monitoring not refreshed: cannot write")
