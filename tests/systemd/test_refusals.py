"""What must not start, under real systemd as PID 1 (tests/support/systemd.py), with the real vLLM CPU engine:
launch refuses what the service user cannot reach under the sandbox before installing anything; the start gate
checks the same as the service user (not as root, who runs it); a diagnosis a restart cannot help exits 78 and
systemd does not restart it; a chip busy in recorded npu-smi output refuses the start.

Runs after test_lifecycle.py on the same booted systemd; each test removes what it made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.captures import capture
from tests.support.http_server import free_port
from tests.support.paths import REPO
from tests.support.systemd import MODELS, SERVICE_USER, TINY_FLAGS, ServingNode
from tests.systemd.test_lifecycle import _json, status, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.systemd]

# A 910B2C node where another process holds 29 GB of NPU 4 (tests/fixtures/ascend/INDEX.md).
BUSY_CAPTURE = "npu-smi-info_910b2c_4dev_proc_1.txt"


def model_copy(node: ServingNode, name: str, where: Path = MODELS) -> Path:
    """A copy of the tiny model inside the namespace, root-owned as an operator's copy would be."""
    target = where / name
    node.systemd.check(["cp", "-a", str(node.model), str(target)])
    return target


def unit_file(node: ServingNode, name: str) -> Path:
    return node.systemd.root / f"etc/systemd/system/npuops-{name}.service"


def refused(node: ServingNode, name: str, *args: str) -> str:
    """A launch that must fail before installing anything: its one-line error."""
    done = node.npuops("launch", *args, *TINY_FLAGS, "--name", name, "--port", str(free_port()), timeout=300)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not unit_file(node, name).exists() and not (node.systemd.root / f"etc/npuops/{name}").exists()
    errors = [line for line in done.stderr.splitlines() if line.startswith("npuops: error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_launch_refuses_what_the_service_user_cannot_reach_before_installing(serving_node: ServingNode) -> None:
    node = serving_node
    vllm = str(node.venv / "bin" / "vllm")
    locked = model_copy(node, "locked")
    node.systemd.check(["chmod", "0600", str(locked / "model.safetensors")])
    line = refused(node, "locked", str(locked), "--vllm", vllm)
    assert f"{locked}/model.safetensors" in line and f"{SERVICE_USER} may not read it (mode 0600, owner root)" in line
    assert "chmod -R a+rX" in line

    in_tmp = model_copy(node, "tiny-in-tmp", Path("/tmp"))
    line = refused(node, "intmp", str(in_tmp), "--vllm", vllm)
    assert str(in_tmp) in line and "PrivateTmp=yes" in line

    # A vllm script under /root (a venv from pyenv): its interpreter would be fine, the script is hidden.
    node.systemd.check(["cp", "-p", vllm, "/root/vllm"])
    line = refused(node, "underroot", str(node.model), "--vllm", "/root/vllm")
    assert "/root/vllm" in line and "ProtectHome=yes hides /root" in line
    for path in (str(locked), str(in_tmp), "/root/vllm"):
        node.systemd.check(["rm", "-rf", path])


def test_the_start_gate_checks_as_the_service_user_not_as_root(serving_node: ServingNode) -> None:
    """Launched healthy, then the weights made 0600 (a re-download as root) and npuops itself moved behind a symlink
    into /root: root, who runs the gate, could use both; the gate refuses each as the unit's user would meet it."""
    node = serving_node
    name, model = "late", model_copy(node, "late")
    done = node.npuops("launch", str(model), *TINY_FLAGS, "--name", name, "--port", str(free_port()), "--vllm",
                       str(node.venv / "bin" / "vllm"), "--json")
    assert done.returncode == 0 and _json(done)["ok"], done.stderr[-3000:]
    unit = f"npuops-{name}.service"
    weights = model / "model.safetensors"
    npuops = node.venv / "bin" / "npuops"
    try:
        node.systemd.check(["chmod", "0600", str(weights)])
        node.systemd.check(["systemctl", "restart", "--no-block", unit])
        now = wait_for("the gate's refusal", lambda: (s := status(node, name))["exit"] and
                       s["exit"]["reason"] == "gate-refused" and s, 120, poll=2)
        assert now["diagnosis"]["id"] == "gate:model-directory", now["diagnosis"]
        assert str(weights) in now["diagnosis"]["cause"] and SERVICE_USER in now["diagnosis"]["cause"]
        assert now["state"] == "restarting (after gate-refused)" or now["state"] == "failed", now["state"]
        journal = node.systemd.check(["journalctl", "--unit", unit, "--no-pager", "--output", "cat"])
        assert "refused [model-directory]" in journal, journal[-2000:]
        node.systemd.check(["systemctl", "stop", unit])
        node.systemd.check(["chmod", "0644", str(weights)])

        node.systemd.check(["cp", "-p", str(npuops), "/root/npuops-moved"])
        node.systemd.check(["ln", "-sf", "/root/npuops-moved", str(npuops)])
        node.systemd.check(["systemctl", "reset-failed", unit])
        node.systemd.check(["systemctl", "start", "--no-block", unit])
        now = wait_for("the gate's refusal", lambda: (s := status(node, name))["diagnosis"] and
                       s["diagnosis"]["id"] == "gate:engine-executable" and s, 120, poll=2)
        assert "/root/npuops-moved" in now["diagnosis"]["cause"] and "ProtectHome" in now["diagnosis"]["cause"]
    finally:
        node.systemd.run(["cp", "-p", "--remove-destination", "/root/npuops-moved", str(npuops)])
        node.systemd.run(["systemctl", "stop", unit])
        node.npuops("stop", name)
        node.systemd.run(["systemctl", "reset-failed", unit])


def test_a_failure_a_restart_cannot_help_exits_78_and_is_not_restarted(serving_node: ServingNode) -> None:
    """A model of an architecture this vLLM does not implement: the supervisor diagnoses the engine's log as
    permanent and exits 78, which the unit's RestartPreventExitStatus= keeps systemd from restarting."""
    node = serving_node
    name, model = "imaginary", model_copy(node, "imaginary")
    config = node.systemd.root / model.relative_to("/") / "config.json"
    data = json.loads(config.read_text(encoding="utf-8"))
    data["architectures"] = ["NpuopsImaginaryForCausalLM"]
    config.write_text(json.dumps(data), encoding="utf-8")
    unit = f"npuops-{name}.service"
    try:
        done = node.npuops("launch", str(model), *TINY_FLAGS, "--name", name, "--port", str(free_port()), "--vllm",
                           str(node.venv / "bin" / "vllm"))
        assert done.returncode != 0, done.stdout + done.stderr
        assert "diagnosis [unsupported-architecture]" in done.stderr, done.stderr[-3000:]
        assert node.systemd.unit_property(unit, "ExecMainStatus") == "78"
        # No restart loop, in systemd's own words rather than by waiting RestartSec= out: systemd decides at the
        # main process's exit; a restart it will make is pending from then on (ActiveState "activating", SubState
        # "auto-restart" until RestartSec= has passed), while RestartPreventExitStatus= leaves the unit "failed".
        settled = wait_for("the unit to settle", lambda: (state := node.systemd.unit_property(unit, "ActiveState"))
                           != "deactivating" and state, 30, poll=0.5)
        assert (settled, node.systemd.unit_property(unit, "SubState")) == ("failed", "failed")
        assert node.systemd.unit_property(unit, "NRestarts") == "0"
        now = status(node, name)
        assert now["state"] == "failed" and now["exit"]["code"] == 78
        assert now["diagnosis"]["id"] == "unsupported-architecture" and now["diagnosis"]["permanent"]
        assert "NpuopsImaginaryForCausalLM" in now["diagnosis"]["cause"]
        text = node.npuops("status", name).stdout
        assert "diagnosis [unsupported-architecture]" in text and "fix" in text, text
    finally:
        node.npuops("stop", name)
        node.systemd.run(["systemctl", "reset-failed", unit])


def test_the_start_gate_refuses_a_busy_chip_from_recorded_npu_smi(serving_node: ServingNode) -> None:
    """An NPU instance on chips 4-7 of a 910B2C node whose npu-smi (the recorded output, replayed by a script in
    the namespace's /usr/local/bin) shows another process holding 29 GB of NPU 4. This machine has no Ascend
    stack, so the driver and CANN checks refuse too; the busy chip is among the refusals, named with the pid."""
    node = serving_node
    root = node.systemd.root
    replay = root / "usr/local/lib/npuops-test" / BUSY_CAPTURE
    replay.parent.mkdir(parents=True, exist_ok=True)
    replay.write_text(capture(BUSY_CAPTURE), encoding="utf-8")
    fake = root / "usr/local/bin/npu-smi"
    fake.write_text(f"#!/bin/sh\n# Replays tests/fixtures/ascend/{BUSY_CAPTURE}.\ncat /{replay.relative_to(root)}\n",
                    encoding="utf-8")
    fake.chmod(0o755)
    model = MODELS / "qwen3-8b"
    # The model's config only (tests/fixtures/models/qwen3-8b): the gate refuses before any weights are read.
    (root / model.relative_to("/")).mkdir(parents=True)
    for item in (REPO / "tests/fixtures/models/qwen3-8b").iterdir():
        (root / model.relative_to("/") / item.name).write_bytes(item.read_bytes())
    name, unit = "busy", "npuops-busy.service"
    try:
        launch = ("launch", str(model), "--hardware", "910B2Cx8", "--devices", "4-7", "--tp", "4", "--name", name,
                  "--port", str(free_port()), "--vllm", str(node.venv / "bin" / "vllm"))
        # The unit's SupplementaryGroups=HwHiAiUser (the device nodes' group) must exist: launch says so first.
        missing = node.npuops(*launch)
        assert missing.returncode != 0 and "groupadd --system HwHiAiUser" in missing.stderr, missing.stderr
        assert not unit_file(node, name).exists()
        node.systemd.check(["groupadd", "--system", "HwHiAiUser"])

        done = node.npuops(*launch)
        assert done.returncode != 0, done.stdout + done.stderr
        assert "refused [hbm-free] NPU 4 chip 0" in done.stderr and "pid 154983" in done.stderr, done.stderr
        journal = node.systemd.check(["journalctl", "--unit", unit, "--no-pager", "--output", "cat"])
        refusal = next(line for line in journal.splitlines() if line.startswith("refused [hbm-free]"))
        fix = journal.splitlines()[journal.splitlines().index(refusal) + 1]
        assert fix.startswith("  fix: ") and "kill 154983" in fix, fix
        now: dict[str, Any] = wait_for("the refusal in npuops status", lambda: (s := status(node, name))["exit"]
                                       and s["exit"]["reason"] == "gate-refused" and s, 60, poll=1)
        assert "hbm-free" in now["exit"].get("blocking", []), now
        assert now["diagnosis"]["id"].startswith("gate:") and now["diagnosis"]["fix"]
        text = node.npuops("status", name).stdout
        assert "hbm-free" in text and "fix" in text, text
    finally:
        node.npuops("stop", name)
        node.systemd.run(["systemctl", "reset-failed", unit])
        fake.unlink()
