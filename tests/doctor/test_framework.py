"""The check model, discovery, the runner and the outputs, independent of any one check family."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity, Status
from npuops.doctor.registry import discover_checks, select_checks
from npuops.doctor.report import render_report_text, write_prometheus
from npuops.doctor.runner import run_checks
from npuops.errors import BadInputError
from npuops.hardware.probe import Probe
from npuops.resources import shipped_dir
from npuops.settings import Settings
from tests.support.captures import capture
from tests.support.fake_commands import FakeRunner
from tests.support.paths import REPO


def test_result_requires_remediation_unless_pass() -> None:
    Result.passed("fine")
    with pytest.raises(ValueError, match="remediation"):
        Result(Status.FAIL, "broken")
    with pytest.raises(ValueError, match="remediation"):
        Result(Status.SKIP, "cannot run")
    with pytest.raises(AttributeError):
        Result.passed("x").status = Status.FAIL  # type: ignore[misc]


def test_every_shipped_check_satisfies_the_model_and_has_a_page() -> None:
    checks = discover_checks()
    assert len(checks) >= 4
    docs = shipped_dir("checks") / "docs"
    for check in checks:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", check.id)
        assert check.title() != check.id, f"{check.id} has no docstring title"
        assert isinstance(check.severity, Severity) and check.level in (1, 2, 3)
        page = docs / f"{check.id}.md"
        assert page.is_file(), f"{check.id} has no page {page}"
        text = page.read_text()
        assert text.startswith(f"# {check.id}")
        for section in ("What it checks", "Why it matters", "How to fix"):
            assert section in text, f"{page} lacks '{section}'"
    pages = {p.stem for p in docs.glob("*.md")}
    assert pages == {c.id for c in checks}, "pages without a check, or checks without a page"


def test_select_by_level_only_and_skip() -> None:
    checks = discover_checks()
    level1 = select_checks(checks, 1, None, None)
    assert level1 and all(c.level == 1 for c in level1)
    only = select_checks(checks, 1, ["driver-installed"], None)
    assert [c.id for c in only] == ["driver-installed"]
    skipped = select_checks(checks, 3, None, ["driver-installed"])
    assert "driver-installed" not in {c.id for c in skipped}
    with pytest.raises(BadInputError, match="no check with id 'drivr-installed'"):
        select_checks(checks, 1, ["drivr-installed"], None)


class _Passing(Check):
    """Always passes."""

    id = "test-passing"
    area = "test"
    severity = Severity.LOW

    def run(self, ctx: CheckContext) -> Result:
        return Result.passed("ok", value=1)


class _Crashing(Check):
    """Always crashes."""

    id = "test-crashing"
    area = "test"
    severity = Severity.HIGH

    def run(self, ctx: CheckContext) -> Result:
        return {}["missing"]  # type: ignore[no-any-return]


class _Failing(Check):
    """Always fails."""

    id = "test-failing"
    area = "other"
    severity = Severity.CRITICAL
    requires: ClassVar[tuple[str, ...]] = ("npu-smi",)

    def run(self, ctx: CheckContext) -> Result:
        return Result.fail("broken", "mend it", pids=[1, 2])


def _ctx(tmp_path: Path, smi: str | None = None) -> CheckContext:
    answers = {} if smi is None else {("npu-smi", "info"): (0, smi, "")}
    return CheckContext(Probe(Settings(root=tmp_path), runner=FakeRunner(answers), machine=lambda: "aarch64"))


def test_a_crashing_check_becomes_error_and_the_others_still_run(tmp_path: Path) -> None:
    report = run_checks([_Passing, _Crashing, _Failing], _ctx(tmp_path))
    by_id = {o.check_id: o for o in report.outcomes}
    assert by_id["test-passing"].result.status is Status.PASS
    crashed = by_id["test-crashing"].result
    assert crashed.status is Status.ERROR and crashed.evidence["exception"] == "KeyError" and crashed.remediation
    assert by_id["test-failing"].result.status is Status.FAIL
    assert not report.ok
    # failures first, grouped by area
    assert [o.check_id for o in report.sorted_outcomes()] == ["test-failing", "test-crashing", "test-passing"]


def test_json_shape(tmp_path: Path) -> None:
    data = run_checks([_Passing, _Failing], _ctx(tmp_path)).to_json()
    assert set(data) == {"ok", "summary", "checks"}
    assert data["ok"] is False
    assert data["summary"]["fail"] == 1 and data["summary"]["pass"] == 1
    for entry in data["checks"]:
        assert set(entry) >= {"id", "title", "level", "severity", "status", "message", "evidence", "remediation",
                              "duration_s"}
    assert data["checks"][0]["evidence"] == {"pids": [1, 2]}
    json.dumps(data)


def test_text_report_has_failures_first_with_fix_and_summary(tmp_path: Path) -> None:
    text = render_report_text(run_checks([_Passing, _Failing], _ctx(tmp_path)))
    lines = text.splitlines()
    assert lines[0] == "other"
    assert "FAIL" in lines[1] and "fix: mend it" in lines[2]
    assert lines[-1].startswith("FAILED: 1 fail, 1 pass")


def _read_textfile(path: Path) -> dict[str, Metric]:
    """The families in a textfile, read back with prometheus_client's parser (it refuses a half-written line)."""
    return {family.name: family for family in text_string_to_metric_families(path.read_text(encoding="utf-8"))}


def _values(family: Metric) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def _chip(device_id: str, bus: str) -> tuple[tuple[str, str], ...]:
    return (("id", device_id), ("model_name", "910B1"), ("pcie_bus_info", bus))


def test_prometheus_textfile_has_npu_exporter_names_and_the_checks(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, capture("npu-smi-info_910b1_8dev_busy_elided_1.txt"))
    report = run_checks([_Passing, _Failing], ctx)
    target = tmp_path / "textfile" / "npuops.prom"
    previous = os.umask(0o077)  # a root shell's strict umask must not hide the file from node_exporter's user
    try:
        write_prometheus(target, report, ctx.node)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["npuops.prom"]  # no temp file left
    families = _read_textfile(target)
    assert {f.type for f in families.values()} == {"gauge"}
    assert _values(families["npuops_check_status"]) == {
        (("area", "other"), ("id", "test-failing"), ("severity", "critical")): 2.0,
        (("area", "test"), ("id", "test-passing"), ("severity", "low")): 0.0,
    }
    durations = _values(families["npuops_check_duration_seconds"])
    assert set(durations) == {(("id", "test-failing"),), (("id", "test-passing"),)}
    assert all(0 <= d < 60 for d in durations.values())
    assert _values(families["npuops_doctor_ok"]) == {(): 0.0}
    assert _values(families["machine_npu_nums"]) == {(): 2.0}
    hbm_used = _values(families["npu_chip_info_hbm_used_memory"])
    assert hbm_used[_chip("0", "0000:C1:00.0")] == 64293.0
    assert _values(families["npu_chip_info_health_status"])[_chip("7", "0000:42:00.0")] == 1.0
    chip_families = {name for name in families if name.startswith("npu_chip_info_")}
    assert chip_families <= {"npu_chip_info_health_status", "npu_chip_info_temperature", "npu_chip_info_power",
                             "npu_chip_info_utilization", "npu_chip_info_hbm_used_memory",
                             "npu_chip_info_hbm_total_memory"}
    assert {"npu_chip_info_health_status", "npu_chip_info_hbm_used_memory"} <= chip_families
    assert all(len(families[name].samples) == 2 for name in chip_families)
    assert families["npuops_check_status"].documentation.startswith("Result of an npuops doctor check")


def test_prometheus_textfile_without_a_node_has_only_the_checks(tmp_path: Path) -> None:
    target = tmp_path / "npuops.prom"
    write_prometheus(target, run_checks([_Passing], _ctx(tmp_path)), None)
    families = _read_textfile(target)
    assert set(families) == {"npuops_check_status", "npuops_check_duration_seconds", "npuops_doctor_ok"}
    assert _values(families["npuops_doctor_ok"]) == {(): 1.0}


def test_node_exporter_sees_a_complete_textfile_while_the_doctor_rewrites_it(tmp_path: Path) -> None:
    # node_exporter's textfile collector reads every *.prom in its directory whenever it is scraped; a rewrite must
    # never show it a half-written file, nor a temp file of its own.
    ctx = _ctx(tmp_path, capture("npu-smi-info_910b1_8dev_busy_elided_1.txt"))
    reports = [run_checks([_Passing, _Failing], ctx), run_checks([_Passing], ctx)]
    directory = tmp_path / "textfile"
    write_prometheus(directory / "npuops.prom", reports[0], ctx.node)
    expected = set(_read_textfile(directory / "npuops.prom"))
    done = threading.Event()

    def rewrite() -> None:
        for i in range(300):
            write_prometheus(directory / "npuops.prom", reports[i % 2], ctx.node)
        done.set()

    writer = threading.Thread(target=rewrite)
    writer.start()
    reads = 0
    try:
        while not done.is_set():
            files = sorted(directory.glob("*.prom"))
            assert [f.name for f in files] == ["npuops.prom"]
            families = _read_textfile(files[0])
            assert set(families) == expected
            assert len(families["npuops_check_status"].samples) in (1, 2)
            reads += 1
    finally:
        writer.join()
    assert reads > 0


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    run_env = dict(os.environ)
    run_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "npuops", "doctor", *args], capture_output=True, text=True,
                          env=run_env, cwd=REPO, timeout=120, check=False)


def test_doctor_on_this_machine_runs_to_the_end_and_fails_the_driver_checks(tmp_path: Path) -> None:
    prom = tmp_path / "doctor.prom"
    proc = _doctor("--json", "--prometheus", str(prom), env={"NPUOPS_ASCEND_ROOT": str(tmp_path / "no-ascend")})
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    status = {c["id"]: c["status"] for c in data["checks"]}
    assert status["driver-installed"] == "fail"
    assert status["npu-smi-runs"] == "fail"
    assert "error" not in status.values(), [c for c in data["checks"] if c["status"] == "error"]
    # The instance's checks (tag `instance`) have nothing to look at here: a plain run leaves them out.
    assert not {"engine-executable", "model-directory", "port-free", "ray-cluster"} & set(status)
    failing = [c for c in data["checks"] if c["status"] == "fail"]
    assert all(c["remediation"] for c in failing)
    check_status = {s.labels["id"]: s.value for s in _read_textfile(prom)["npuops_check_status"].samples}
    assert check_status["driver-installed"] == 2.0
    human = _doctor(env={"NPUOPS_ASCEND_ROOT": str(tmp_path / "no-ascend")})
    assert human.returncode == 1 and "fix:" in human.stdout and "FAILED:" in human.stdout


def test_doctor_list_explain_and_bad_ids() -> None:
    listing = _doctor("--list")
    assert listing.returncode == 0 and "driver-installed" in listing.stdout
    listed = json.loads(_doctor("--list", "--json").stdout)
    assert {"id", "title", "level", "severity", "area", "requires", "tags", "doc"} <= set(listed[0])
    page = _doctor("--explain", "npu-smi-runs")
    assert page.returncode == 0 and "-8005" in page.stdout
    bad = _doctor("--explain", "no-such-check")
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1
    bad_only = _doctor("--only", "no-such-check")
    assert bad_only.returncode == 3 and "doctor --list" in bad_only.stderr
    bad_level = _doctor("--level", "7")
    assert bad_level.returncode == 2 and "Traceback" not in bad_level.stderr
    bad_devices = _doctor("--devices", "3-1")
    assert bad_devices.returncode == 3 and "backwards" in bad_devices.stderr


def test_doctor_with_a_sick_chip_from_a_fake_npu_smi(tmp_path: Path) -> None:
    from tests.support.fake_commands import write_fake_tool

    write_fake_tool(tmp_path / "bin", "npu-smi", capture("npu-smi-info_error-8005_container_1.txt"), rc=255)
    proc = _doctor("--json", "--only", "npu-smi-runs",
                   env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    assert proc.returncode == 1
    (check,) = json.loads(proc.stdout)["checks"]
    assert check["evidence"]["code"] == "-8005" and "reboot" in check["remediation"].lower()


def test_doctor_lists_every_check_with_its_tags_and_page_and_selects_by_tag() -> None:
    listed = {c["id"]: c for c in json.loads(_doctor("--list", "--json").stdout)}
    assert set(listed) == {c.id for c in discover_checks()}
    for entry in listed.values():
        assert Path(entry["doc"]).is_file() and Path(entry["doc"]).name == f"{entry['id']}.md"
    assert listed["ray-cluster"]["tags"] == ["gate", "instance"] and listed["ray-cluster"]["area"] == "launch"
    assert listed["hbm-free"]["tags"] == ["gate-npu"] and listed["served-precision"]["tags"] == ["verify"]
    text = _doctor("--list").stdout.splitlines()
    port_line = next(line for line in text if line.startswith("port-free "))
    assert "gate,instance" in port_line and "critical" in port_line
    page = _doctor("--explain", "port-free")
    assert page.returncode == 0 and page.stdout.startswith("# port-free: ")
    # --tag reaches the opt-in instance checks; without an instance each skips, saying where it runs.
    tagged = _doctor("--tag", "instance", "--json")
    assert tagged.returncode == 0, tagged.stderr
    checks = json.loads(tagged.stdout)["checks"]
    assert {c["id"] for c in checks} == {"engine-executable", "model-directory", "port-free", "ray-cluster",
                                             "pd-kv-ports", "pd-mooncake", "pd-npu-nics", "cpu-compiler"}
    assert all(c["status"] == "skip" and "--preflight" in c["remediation"] for c in checks)
    bad = _doctor("--tag", "gaet")
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1 and "gate-npu" in bad.stderr
