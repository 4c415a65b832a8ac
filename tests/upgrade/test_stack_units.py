"""A stack rollout's decisions without hosts: the verdict on a host from its drain and its provisioning run (the
doctor before and after), the provisioning run each step makes, the report, and what the command line refuses.
The rollout itself runs over two SSH hosts under their own systemd (tests/systemd/test_group_launch.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from npuops.errors import BadInputError
from npuops.launch.group import GroupChoices
from npuops.launch.group_rollout import GroupRolloutAsk, GroupRolloutResult, HostOutcome, render_group_rollout_text
from npuops.launch.rollout import RolloutRequest
from npuops.provision.run import choose_row
from npuops.upgrade.stack import INVENTORY_ROW, StackChoice, provisioning_options, stack_verdict
from tests.support.paths import REPO


def _drained(failed: list[str] | None, status: str = "ok", message: str = "") -> dict[str, Any]:
    doctor = ({"ok": not failed, "failed": failed} if failed is not None else
              {"ok": None, "skipped": "npuops is not installed on the host (run the python role)"})
    return {"status": status, "message": message, "data": {"npuops_provision": {"doctor": doctor}}}


def _provisioned(failed: list[str] | None, status: str = "ok", **extra: Any) -> dict[str, Any]:
    doctor = ({"ok": not failed, "failed": failed, "total": 26} if failed is not None else
              {"ok": None, "skipped": "npuops is not installed on the host (run the python role)"})
    return {"status": status, "message": extra.pop("message", ""), "doctor": doctor, **extra}


def test_a_host_serves_on_the_new_stack_only_when_the_doctor_fails_nothing_new() -> None:
    chips = ["driver-installed", "npu-smi-runs"]  # what a node without its NPUs fails before and after
    assert stack_verdict("h1", _drained(chips), _provisioned(chips)) == ""
    assert stack_verdict("h1", _drained(chips), _provisioned(["npu-smi-runs"])) == ""  # one fixed: fine
    worse = stack_verdict("h1", _drained(chips), _provisioned([*chips, "torch-npu-cann", "stack-row"]))
    assert worse == "the doctor fails stack-row, torch-npu-cann after the new stack (not before)"
    # No verdict before (npuops was not there): every failure after counts.
    assert stack_verdict("h1", _drained(None), _provisioned(["stack-row"])) == (
        "the doctor fails stack-row after the new stack")
    assert stack_verdict("h1", _drained(None), _provisioned([])) == ""


def test_a_host_that_was_not_drained_or_not_provisioned_says_which_and_why() -> None:
    assert stack_verdict("h1", None, None) == "not drained: not reached"
    assert stack_verdict("h1", _drained([], "unreachable", "ssh: connect refused"), None) == (
        "not drained: ssh: connect refused")
    assert stack_verdict("h1", _drained([]), None) == "not provisioned: not reached"
    failed = _provisioned(None, "failed", message="non-zero return code",
                          failed_task={"role": "python", "task": "Python | pip check", "rc": 1})
    assert stack_verdict("h1", _drained([]), failed) == (
        "provisioning failed (python: Python | pip check): non-zero return code")
    assert stack_verdict("h1", _drained([]), _provisioned(None)) == (
        "the doctor did not run after provisioning: npuops is not installed on the host (run the python role)")


def _ask(tmp_path: Path) -> GroupRolloutAsk:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  children:\n    fleet:\n      hosts:\n        h1: {}\n")
    return GroupRolloutAsk(RolloutRequest(name="m"), GroupChoices(inventory, "fleet", tmp_path / "artifacts",
                                                                   forks=3))


def test_each_step_provisions_the_row_into_the_venv_the_replicas_run_from(tmp_path: Path) -> None:
    ask = _ask(tmp_path)
    options = provisioning_options(ask, StackChoice("0.9.1", hardware_check=False), "/opt/engine/venv")
    assert (options.stack, options.tags, options.hardware_check, options.forks) == ("0.9.1", ("python", "verify"),
                                                                                     False, 3)
    assert options.extravars == {"npuops_venv": "/opt/engine/venv"} and options.limit is None
    own = provisioning_options(ask, StackChoice(INVENTORY_ROW), None)
    assert own.stack is None and own.extravars == {} and own.hardware_check  # the inventory's pins and venv
    with pytest.raises(BadInputError) as unknown:
        provisioning_options(ask, StackChoice("0.0.1"), None)
    assert unknown.value.problem == "no stack row '0.0.1'" and "0.9.1" in unknown.value.fix


def test_the_report_names_the_row_and_what_changed_on_each_host() -> None:
    row = choose_row("0.9.1", None)
    assert StackChoice("0.9.1").describe(row) == (
        f"stack: row {row['name']} (vllm-ascend 0.9.1, CANN {row['cann']})")  # type: ignore[index]
    assert StackChoice(INVENTORY_ROW).describe(None) == "stack: each host's npuops_stack_pins from the inventory"
    versions = {"python_stack": {"before": {"vllm": "0.9.0", "npuops": "0.1.0"},
                                 "after": {"vllm": "0.9.1", "npuops": "0.1.0", "vllm-ascend": "0.9.1"}}}
    result = GroupRolloutResult("m", "fleet", 2, 3, ("stack: row x",), hosts=[
        HostOutcome("h1", True, "", {"ok": True}, {"versions": versions, "doctor": {"ok": True}}),
        HostOutcome("h2", False, "provisioning failed (python: Python | pip check): rc 1; its replicas stay "
                    "stopped, out of the router", None, {"versions": None, "doctor": None})],
        untouched=("h3",), reason="h2: provisioning failed")
    text = render_group_rollout_text(result)
    assert "  h1        serves revision 3" in text
    assert "stack vllm 0.9.0 -> 0.9.1, vllm-ascend - -> 0.9.1" in text
    assert text.count(" stack ") == 1 and "untouched h3" in text  # h2 was not provisioned: no stack line
    assert max(len(line) for line in text.splitlines()) <= 100
    assert result.to_json()["hosts"][0]["stack"]["versions"] == versions


def _npuops(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npuops", "rollout", "m", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={"PATH": "/usr/bin:/bin", "NPUOPS_STATE_DIR": str(tmp_path)})


@pytest.mark.parametrize(("args", "said"), [
    (("--stack", "0.9.1"), "--stack (and its --packages, --no-hardware-check) is for a group rollout"),
    (("-i", "inv", "--group", "g", "--packages", "/p"), "--packages and --no-hardware-check go with --stack ROW"),
    (("-i", "inv", "--group", "g", "--stack", "0.9.1", "--model", "/m"), "--stack 0.9.1 changes the stack alone"),
    (("-i", "inv", "--group", "g", "--stack", "0.9.1", "--venv", "/v"), "--stack 0.9.1 changes the stack alone"),
])
def test_the_command_line_refuses_a_stack_mixed_with_other_changes_in_one_line(args: tuple[str, ...], said: str,
                                                                               tmp_path: Path) -> None:
    done = _npuops(*args, tmp_path=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr and said in done.stderr, done.stderr
