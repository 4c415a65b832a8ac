"""Rendering: golden files for every template, strict undefined, quoting, systemd-analyze on every unit."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from npuops.envfile import parse_env_file
from npuops.errors import BadInputError
from npuops.inputfiles import read_api_key_file
from npuops.launch.instance_files import LaunchSpec, render_instances, write_instance_files
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target, parse_hardware_spec
from npuops.templating import env_quote, render_template, systemd_quote
from tests.support.paths import REPO

GOLDEN = REPO / "tests" / "golden" / "render"
MODELS = REPO / "tests" / "fixtures" / "models"
REFRESH = os.environ.get("NPUOPS_REFRESH_GOLDEN") == "1"

CASES = {
    # name: (model dir, hardware, workload, options)
    "qwen3-8b-910b3x8": ("qwen3-8b", "910B3x8", Workload(512, 128), PlanOptions()),
    "qwen3-32b-910b4x4-latency": ("qwen3-32b", "910B4x4", Workload(2048, 256, objective="latency"), PlanOptions()),
    "qwen3-8b-310p3x2": ("qwen3-8b", "310P3x2", Workload(512, 128), PlanOptions()),
    "tiny-cpu": ("tiny-llama", "cpu", Workload(128, 32), PlanOptions(kv_cache_memory_bytes=256 * 2**20,
                                                                         dtype="float32", enforce_eager=True)),
}


def _tiny_model_dir(root: Path) -> Path:
    """config.json of the tiny test model (tests/engine/README.md): enough for planning and rendering."""
    d = root / "tiny-llama"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 2048,
        "vocab_size": 1024, "torch_dtype": "float32", "tie_word_embeddings": False, "rms_norm_eps": 1e-6}))
    return d


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A fixed-looking location inside tmp so the rendered paths can be normalised for the golden files.
    root = tmp_path_factory.mktemp("models")
    for name in ("qwen3-8b", "qwen3-32b"):
        shutil.copytree(MODELS / name, root / name)
    _tiny_model_dir(root)
    return root


def _plan(models: Path, case: str):  # type: ignore[no-untyped-def]
    model, hardware, workload, options = CASES[case]
    if hardware == "cpu":
        target = cpu_target(16 * 2**30, 2, 1)
    else:
        target = parse_hardware_spec(hardware)
    return make_plan(load_model(str(models / model)), target, workload, options)


def _spec(**overrides: object) -> LaunchSpec:
    values: dict[str, object] = {"name": "demo", "api_key": "sk-golden-key",
                                 "ascend_env": {"ASCEND_HOME_PATH": "/usr/local/Ascend/ascend-toolkit/latest",
                                                "LD_LIBRARY_PATH": "/usr/local/Ascend/driver/lib64/driver"}}
    values.update(overrides)
    return LaunchSpec(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_files(models: Path, case: str) -> None:
    instances = render_instances(_plan(models, case), _spec())
    first = instances[0]
    for f in first.files:
        text = re.sub(r'"created_at": [\d.]+', '"created_at": "<TIME>"', f.text.replace(str(models), "<MODELS>"))
        golden = GOLDEN / case / f"{f.name}.expected"
        if REFRESH:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text)
        assert golden.is_file(), f"missing golden {golden}: run with NPUOPS_REFRESH_GOLDEN=1 and review"
        assert text == golden.read_text(), f"{case}/{f.name} differs from its golden file"


def test_replicas_get_their_own_devices_ports_and_units(models: Path) -> None:
    instances = render_instances(_plan(models, "qwen3-8b-910b3x8"), _spec(port=9000, host="0.0.0.0"))
    # Eight replicas on loopback, the router in front of them on the instance's address and port.
    assert [i.name for i in instances] == [*(f"demo-r{n}" for n in range(8)), "demo"]
    for n, inst in enumerate(instances[:8]):
        env = parse_env_file(inst.file("env").text)
        assert env["ASCEND_RT_VISIBLE_DEVICES"] == str(n)
        assert f"port: {9001 + n}" in inst.file("vllm.yaml").text and 'host: "127.0.0.1"' in inst.file("vllm.yaml").text
        unit = inst.file(f"npuops-demo-r{n}.service").text
        assert f"DeviceAllow=/dev/davinci{n} rw" in unit
        assert len(re.findall(r"DeviceAllow=/dev/davinci\d+ ", unit)) == 1


def test_undefined_variable_fails_every_template() -> None:
    for template in ("vllm-config.yaml.j2", "service.env.j2", "vllm.service.j2"):
        with pytest.raises(RuntimeError, match="undefined"):
            render_template(template, {})


def test_env_file_mode_0600_and_key_not_on_command_line(models: Path, tmp_path: Path) -> None:
    (inst,) = render_instances(_plan(models, "tiny-cpu"), _spec(api_key="sk-secret-123"))
    written = write_instance_files(tmp_path / "out", inst)
    env_path = next(p for p in written if p.name == "env")
    assert stat.S_IMODE(env_path.stat().st_mode) == 0o600
    assert parse_env_file(env_path.read_text())["VLLM_API_KEY"] == "sk-secret-123"
    for p in written:
        if p.name != "env":
            assert "sk-secret-123" not in p.read_text()


def test_hostile_values_stay_quoted(tmp_path: Path) -> None:
    assert systemd_quote("/models/my model") == '"/models/my model"'
    assert systemd_quote("a$b%c") == '"a$$b%%c"'
    assert systemd_quote('x"; rm -rf /') == '"x\\"; rm -rf /"'
    assert parse_env_file("K=" + env_quote('va"l $x \\ y') + "\n")["K"] == 'va"l $x \\ y'
    with pytest.raises(BadInputError, match="control character"):
        systemd_quote("line\nbreak")


def test_bad_launch_inputs(models: Path, tmp_path: Path) -> None:
    plan = _plan(models, "tiny-cpu")
    with pytest.raises(BadInputError, match="instance name"):
        render_instances(plan, _spec(name="Bad Name;"))
    key = tmp_path / "key"
    key.write_text("sk-1\n")
    key.chmod(0o644)
    with pytest.raises(BadInputError, match="chmod 600"):
        read_api_key_file(key)
    key.chmod(0o600)
    assert read_api_key_file(key) == "sk-1"
    catalog_plan = make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x8"), Workload(512, 128), PlanOptions())
    with pytest.raises(BadInputError, match="catalog name"):
        render_instances(catalog_plan, _spec())


def _systemd_root(tmp_path: Path, unit_text: str, unit_name: str, exec_path: str) -> Path:
    root = tmp_path / "sysroot"
    (root / "usr/lib/systemd").mkdir(parents=True, exist_ok=True)
    if not (root / "usr/lib/systemd/system").exists():
        shutil.copytree("/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    exe = root / exec_path.lstrip("/")
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    unit = root / "etc/systemd/system" / unit_name
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(unit_text)
    return unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (apt systemd)")
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_unit_verifies_and_scores_at_most_2(models: Path, tmp_path: Path, case: str) -> None:
    for inst in render_instances(_plan(models, case), _spec())[:2]:
        unit_file = inst.file(inst.unit_name)
        unit = _systemd_root(tmp_path, unit_file.text, inst.unit_name, "/opt/npuops/venv/bin/npuops")
        verify = subprocess.run(["systemd-analyze", "verify", "--recursive-errors=yes",
                                 f"--root={tmp_path / 'sysroot'}", str(unit)], capture_output=True, text=True,
                                check=False)
        assert verify.returncode == 0, verify.stderr
        assert "Unknown key" not in verify.stderr
        security = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)],
                                  capture_output=True, text=True, check=False)
        score = re.search(r"Overall exposure level for .*: (\d+\.\d+)", security.stdout)
        assert score, security.stdout[-500:]
        assert float(score.group(1)) <= 2.0, f"{case}: exposure {score.group(1)}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (apt systemd)")
def test_verify_catches_a_broken_unit(models: Path, tmp_path: Path) -> None:
    """The verification above can fail: a typo'd key is caught."""
    inst = render_instances(_plan(models, "tiny-cpu"), _spec())[0]
    broken = inst.file(inst.unit_name).text.replace("NoNewPrivileges=", "NoNewPrivilegs=")
    unit = _systemd_root(tmp_path, broken, "broken.service", "/opt/npuops/venv/bin/npuops")
    verify = subprocess.run(["systemd-analyze", "verify", "--recursive-errors=yes", f"--root={tmp_path / 'sysroot'}",
                             str(unit)], capture_output=True, text=True, check=False)
    assert verify.returncode != 0 and "NoNewPrivilegs" in verify.stderr


def _cli(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, check=False, env={**os.environ, **(env or {})})


def test_launch_dry_run_writes_the_files(models: Path, tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    proc = _cli("launch", str(models / "tiny-llama"), "--hardware", "cpu", "--dtype", "float32", "--enforce-eager",
                "--kv-cache-memory-bytes", str(256 * 2**20), "--name", "tiny", "--port", "8123", "--dry-run",
                "--output", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["dry_run"] is True
    names = sorted(p.name for p in out.iterdir())
    assert names == ["env", "instance.json", "npuops-tiny.service", "vllm.yaml"]
    assert "port: 8123" in (out / "vllm.yaml").read_text()
    assert 'host: "127.0.0.1"' in (out / "vllm.yaml").read_text()
    # The model lives under /tmp (pytest's): installed as rendered, the unit's PrivateTmp= would hide it.
    model = models / "tiny-llama"
    assert (f"the unit's sandbox would hide the model {model} (PrivateTmp=yes gives the service a /tmp of its "
            f"own, at {model}): move it under /opt, /srv or /var/lib before installing the unit") in data["notes"]
    text = _cli("launch", str(model), "--hardware", "cpu", "--dtype", "float32", "--enforce-eager",
                "--kv-cache-memory-bytes", str(256 * 2**20), "--name", "tiny", "--port", "8123", "--dry-run",
                "--output", str(out), env={"COLUMNS": "200"})
    assert text.returncode == 0, text.stderr
    # Wrapped at 100 columns; only a single path longer than that (pytest's own) stays whole on its line.
    assert all(len(line) <= 100 or len(line.split()) == 1 for line in text.stdout.splitlines()), text.stdout
    flat = " ".join(text.stdout.split())
    assert "note: the unit's sandbox would hide the model" in flat and "<name>" not in flat
    assert "`systemctl daemon-reload && systemctl enable --now npuops-tiny.service`" in flat


def test_launch_without_dry_run_and_bad_flags_are_clean_errors(models: Path, tmp_path: Path) -> None:
    if not Path("/run/systemd/system").is_dir():
        # No systemd as init here: launch says so and names --foreground.
        proc = _cli("launch", str(models / "tiny-llama"), "--hardware", "cpu")
        assert proc.returncode == 4 and "--foreground" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli("launch", str(models / "tiny-llama"), "--hardware", "cpu", "--output", str(tmp_path / "o"))
    assert proc.returncode == 2 and "--dry-run" in proc.stderr
    proc = _cli("launch", str(models / "tiny-llama"), "--hardware", "cpu", "--dry-run")
    assert proc.returncode == 2 and "--output" in proc.stderr
    proc = _cli("plan", str(tmp_path / "nope"), "--hardware", "910B3x8")
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1
    proc = _cli("plan", "qwen3-8b", "--hardware", "H100x8")
    assert proc.returncode == 3 and "known chips" in proc.stderr


def test_plan_seed_scenario_json(tmp_path: Path) -> None:
    proc = _cli("plan", "llama-2-13b-chat", "--hardware", "910B3x8", "--input-len", "512", "--output-len", "128",
                "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) >= {"model", "hardware", "workload", "config", "env", "memory", "prediction", "explanations",
                         "warnings"}
    assert data["config"]["block_size"] == 128
    assert any("tensor_parallel_size=8" in (e.get("seed") or "") for e in data["explanations"])
    human = _cli("plan", "llama-2-13b-chat", "--hardware", "910B3x8")
    assert human.returncode == 0 and "docs/claims.md" in human.stdout and "Predicted" in human.stdout


def test_plan_auto_without_npu_says_so() -> None:
    proc = _cli("plan", "qwen3-8b", "--hardware", "auto")
    assert proc.returncode == 4 and "--hardware" in proc.stderr and "Traceback" not in proc.stderr


def test_a_relative_model_path_becomes_absolute_in_the_unit(models: Path, tmp_path: Path) -> None:
    out = tmp_path / "rel"
    proc = _cli("launch", "tiny-llama", "--hardware", "cpu", "--dtype", "float32", "--enforce-eager",
                "--kv-cache-memory-bytes", str(256 * 2**20), "--name", "rel", "--dry-run", "--output", str(out),
                cwd=models)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "instance.json").read_text())
    assert record["model_path"] == str(models / "tiny-llama")
    exec_start = next(line for line in (out / "npuops-rel.service").read_text().splitlines()
                      if line.startswith("ExecStart="))
    assert exec_start.endswith(" run --state-dir /etc/npuops rel")


def test_a_plan_with_an_assumed_draft_cannot_be_launched(models: Path, tmp_path: Path) -> None:
    """`plan --speculative eagle3` without --draft-model plans with the usual head; `launch` needs the draft vLLM
    loads: a one-line refusal naming --draft-model, before anything is written."""
    planned = _cli("plan", str(models / "tiny-llama"), "--hardware", "910B3x8", "--speculative", "eagle3", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["speculative"]["draft"]["assumed"] is True
    out = tmp_path / "never"
    proc = _cli("launch", str(models / "tiny-llama"), "--hardware", "910B3x8", "--speculative", "eagle3",
                "--dry-run", "--output", str(out))
    assert proc.returncode == 3 and "--draft-model DIR" in proc.stderr, proc.stderr  # bad input: exit 3
    assert proc.stderr.count("\n") <= 2 and "Traceback" not in proc.stderr and not out.exists()
