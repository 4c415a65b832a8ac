"""The CLI end to end as a subprocess: help, errors and exit codes, and `npuops node` with a replayed npu-smi."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from npuops.cli.main import COMMANDS
from tests.support.captures import capture
from tests.support.fake_commands import write_fake_tool
from tests.support.paths import REPO

HEAVY = ("torch", "vllm", "ansible_runner", "jinja2", "torch_npu", "ansible")


def npuops(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    run_env = dict(os.environ)
    run_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True,
                          env=run_env, timeout=timeout, cwd=REPO, check=False)


def test_help_lists_every_command() -> None:
    proc = npuops("--help")
    assert proc.returncode == 0
    for name in ("node", "doctor", "plan", "launch", "status", "stop", "logs", "provision"):
        assert name in COMMANDS
        assert f"\n  {name} " in proc.stdout


def test_help_imports_nothing_heavy() -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "npuops", "--help"], capture_output=True,
                          text=True, cwd=REPO, check=True)
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "click" in imported  # the probe of the test itself works
    assert not imported & set(HEAVY), imported & set(HEAVY)


def test_unknown_flag_is_one_line_usage_error() -> None:
    proc = npuops("node", "--jsn")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--jsn" in proc.stderr and "--json" in proc.stderr
    assert "Traceback" not in proc.stderr
    # One suggestion, not click's and then npuops' own again.
    misspelt = npuops("plan", "qwen3-8b", "--hardwre", "cpu")
    assert misspelt.stderr == ("npuops: usage error: No such option '--hardwre'. Did you mean '--hardware'?; "
                               "see `npuops plan --help`\n")


def test_unknown_command_is_usage_error_with_the_closest_command() -> None:
    proc = npuops("nodes")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == "npuops: usage error: No such command 'nodes'. Did you mean 'node'?; see `npuops --help`\n"
    assert "Did you mean 'plan'?" in npuops("plna").stderr
    far = npuops("zzz")
    assert far.returncode == 2 and far.stderr == "npuops: usage error: No such command 'zzz'; see `npuops --help`\n"


def test_models_lists_the_catalog_plan_accepts() -> None:
    from npuops.plan.catalog import catalog_names, load_model

    listed = json.loads(npuops("models", "--json").stdout)["models"]
    assert [m["name"] for m in listed] == catalog_names()
    for model in listed:  # every name and alias shown is one plan accepts, for that very model
        for ref in (model["name"], model["hf_id"], *model["aliases"]):
            assert load_model(ref).catalog_name == model["name"], ref
        assert model["weight_bytes"] == load_model(model["name"]).weight_bytes
    moe = next(m for m in listed if m["name"] == "qwen3-30b-a3b")
    assert moe["experts"] == 128 and 0 < moe["active_parameters"] < moe["parameters"]
    text = npuops("models").stdout
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "\nqwen3-30b-a3b  " in text and "30.5B/3.4B" in text and "Qwen/Qwen3-30B-A3B" in text
    unknown = npuops("plan", "nosuchmodel")
    assert unknown.returncode == 3 and "`npuops models` lists them" in unknown.stderr


def test_malformed_config_is_exit_3_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("ascend_root = [\n")
    proc = npuops("--config", str(cfg), "node")
    assert proc.returncode == 3
    assert proc.stderr.startswith("npuops: error: ") and proc.stderr.count("\n") == 1
    assert "TOML" in proc.stderr


def test_bad_environment_setting_is_exit_3() -> None:
    proc = npuops("node", env={"NPUOPS_COMMAND_TIMEOUT_S": "-5"})
    assert proc.returncode == 3 and "NPUOPS_COMMAND_TIMEOUT_S" in proc.stderr


def test_json_error_output_is_machine_readable(tmp_path: Path) -> None:
    proc = npuops("--config", str(tmp_path / "missing.toml"), "node", "--json")
    assert proc.returncode == 3
    assert json.loads(proc.stdout)["error"]["exit_code"] == 3


def test_node_on_this_machine_says_no_driver_and_why() -> None:
    proc = npuops("node", env={"NPUOPS_ASCEND_ROOT": "/nonexistent/Ascend"})
    assert proc.returncode == 0, proc.stderr
    assert "no NPU driver found" in proc.stdout
    assert "npu-smi" in proc.stdout and "fix:" in proc.stdout
    assert "CPU" in proc.stdout  # host part still filled in


def test_node_json_on_this_machine_has_the_fixed_shape() -> None:
    proc = npuops("node", "--json", env={"NPUOPS_ASCEND_ROOT": "/nonexistent/Ascend"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert {"npu_smi", "chips", "processes", "driver", "firmware", "cann", "python_stack", "host"} <= set(data)
    assert set(data["npu_smi"]) >= {"version", "driver_version", "error"}
    assert set(data["npu_smi"]["error"]) == {"code", "message", "remediation"}
    assert data["chips"] == [] and data["processes"] == []
    assert data["host"]["cpu_count"] >= 1


@pytest.mark.parametrize(
    ("fixture", "chips", "processes"),
    [
        ("npu-smi-info_910b1_8dev_busy_elided_1.txt", 2, 3),
        ("npu-smi-info_910b2c_4dev_proc_1.txt", 4, 1),
        ("npu-smi-info_910prob_1dev_proc_v23rc1_1.txt", 1, 1),
        ("npu-smi-info_910b4_1dev_v26_truncated_1.txt", 1, 0),
    ],
)
def test_node_with_a_fake_npu_smi_on_path(tmp_path: Path, fixture: str, chips: int, processes: int) -> None:
    write_fake_tool(tmp_path / "bin", "npu-smi", capture(fixture))
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "NPUOPS_ASCEND_ROOT": str(tmp_path / "none")}
    proc = npuops("node", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["npu_smi"]["error"] is None
    assert len(data["chips"]) == chips
    assert len(data["processes"]) == processes
    human = npuops("node", env=env)
    assert human.returncode == 0 and "Health" in human.stdout


def test_node_with_minus_8005_from_a_fake_npu_smi(tmp_path: Path) -> None:
    write_fake_tool(tmp_path / "bin", "npu-smi", capture("npu-smi-info_error-8005_container_1.txt"), rc=255)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    proc = npuops("node", env=env)
    assert proc.returncode == 0
    assert "-8005" in proc.stdout and "reboot" in proc.stdout.lower()


def test_node_of_the_fleet_over_ansible(tmp_path: Path) -> None:
    proc = npuops("node", "--host", "localhost", "--artifacts", str(tmp_path / "a"), "--json", timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["hosts"]["localhost"]["node"]["host"]["cpu_count"] >= 1
    bad = npuops("node", "-i", str(tmp_path / "missing.ini"))
    assert bad.returncode == 3 and "inventory" in bad.stderr and "Traceback" not in bad.stderr
    both = npuops("node", "-i", str(tmp_path / "x"), "--host", "localhost")
    assert both.returncode == 2


def test_doctor_on_this_machine_says_once_why_the_npu_checks_skip() -> None:
    text = npuops("doctor", env={"COLUMNS": "200"}).stdout  # wider than 100 asks for: still 100
    assert all(len(line) <= 100 for line in text.splitlines()), max(text.splitlines(), key=len)
    assert text.startswith("no NPU on this node (no `npu-smi` on PATH;")
    assert text.count("no `npu-smi` on PATH") == 1 and "no NPU visible" not in text
    report = json.loads(npuops("doctor", "--json").stdout)
    skipped = [c["id"] for c in report["checks"] if c["status"] == "skip" and "no_npu" in c.get("evidence", {})]
    assert {"chip-health", "hbm-free", "alloc-conf"} <= set(skipped)
    for check_id in skipped:  # each named once, on its area's one "no NPU" line
        assert len(re.findall(rf"(?<![\w-]){check_id}(?![\w-])", text)) == 1, check_id
    assert f"the {len(skipped)} checks that need one are skipped" in " ".join(text.split())
    # The CPU engine's thread advice, not the NPU host's OMP_NUM_THREADS=1.
    assert "export OMP_NUM_THREADS=1" not in text
