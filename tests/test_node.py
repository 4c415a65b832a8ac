"""The node model from real captures: a fake runner and a prepared root tree, no NPU needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npuops.hardware.node import discover_node, interpret_npu_smi
from npuops.hardware.probe import RC_NOT_FOUND, RC_TIMEOUT, CommandResult, Probe
from npuops.settings import Settings
from tests.conftest import FakeRunner, capture, put

NODE_KEYS = {"npu_smi", "chips", "processes", "driver", "firmware", "cann", "python_stack", "host"}
CHIP_KEYS = {"npu_id", "chip_id", "logical_id", "name", "family", "health", "bus_id", "power_w", "temperature_c",
             "aicore_percent", "memory_used_mb", "memory_total_mb", "hbm_used_mb", "hbm_total_mb"}
PROCESS_KEYS = {"npu_id", "chip_id", "pid", "name", "memory_mb"}


def _result(out: str, rc: int = 0) -> CommandResult:
    return CommandResult(("npu-smi", "info"), rc, out, "", 0.01)


def _probe(root: Path, smi_out: str | None, rc: int = 0, machine: str = "aarch64") -> Probe:
    answers = {} if smi_out is None else {("npu-smi", "info"): (rc, smi_out, "")}
    return Probe(Settings(root=root), runner=FakeRunner(answers), machine=lambda: machine)


def _install_a2_node(root: Path, layout: str = "ascend-toolkit") -> None:
    put(root, "/usr/local/Ascend/driver/version.info", capture("driver-version-info_25.0.rc1.1_1.txt"))
    put(root, "/usr/local/Ascend/firmware/version.info", capture("firmware-version-info_doc_1.txt"))
    if layout == "ascend-toolkit":
        put(root, "/usr/local/Ascend/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info",
            capture("ascend_toolkit_install-info_aarch64_3.txt"))
        put(root, "/usr/local/Ascend/ascend-toolkit/latest/version.cfg",
            capture("ascend-toolkit-version-cfg_8.2.RC2_1.txt"))
        put(root, "/usr/local/Ascend/ascend-toolkit/set_env.sh", "# vendor script\n")
    else:
        put(root, "/usr/local/Ascend/cann/aarch64-linux/ascend_toolkit_install.info",
            capture("ascend_toolkit_install-info_doc_1.txt"))
        put(root, "/usr/local/Ascend/cann/set_env.sh", "# vendor script\n")
    put(root, "/usr/local/Ascend/nnal/atb/latest/version.info", capture("nnal-atb-version-info_8.2.RC2_1.txt"))
    put(root, "/usr/local/Ascend/nnal/atb/set_env.sh", "# vendor script\n")
    for n in range(8):
        put(root, f"/dev/davinci{n}", "")
    for name in ("davinci_manager", "devmm_svm", "hisi_hdc"):
        put(root, f"/dev/{name}", "")


def test_a2_node_from_real_captures(fake_root: Path) -> None:
    _install_a2_node(fake_root)
    node = discover_node(_probe(fake_root, capture("npu-smi-info_910b3_1.txt")))
    data = node.to_json()
    assert NODE_KEYS <= set(data)
    assert data["npu_smi"]["error"] is None
    assert data["npu_smi"]["version"] == "23.0.7"
    assert len(data["chips"]) == 8
    assert all(CHIP_KEYS <= set(c) for c in data["chips"])
    assert {c["family"] for c in data["chips"]} == {"A2"}
    assert all(c["hbm_total_mb"] == 65536 for c in data["chips"])
    assert data["driver"]["version"] == "25.0.rc1.1"
    assert data["firmware"]["version"] == "7.1.0.11.220"
    assert data["cann"]["layout"] == "ascend-toolkit"
    assert data["cann"]["version"] == "8.3.RC1"
    assert data["cann"]["kernels"]["version"] == "8.2.RC2"
    assert data["cann"]["nnal"]["version"] == "8.2.RC2"
    assert node.has_npus and data["npu"] == {"found": True, "reasons": []}
    json.dumps(data)  # serialisable as it is


def test_cann_85_layout(fake_root: Path) -> None:
    _install_a2_node(fake_root, layout="cann")
    data = discover_node(_probe(fake_root, capture("npu-smi-info_910b3_1.txt"))).to_json()
    assert data["cann"]["layout"] == "cann"
    assert data["cann"]["version"] == "8.5.0"
    assert data["cann"]["kernels"]["installed"] is False  # no ops info file in this tree


def test_driver_installed_elsewhere_is_found_through_ascend_install_info(fake_root: Path) -> None:
    put(fake_root, "/etc/ascend_install.info", "Driver_Install_Path_Param=/opt/Ascend\n")
    put(fake_root, "/opt/Ascend/driver/version.info", capture("driver-version-info_doc_1.txt"))
    data = discover_node(_probe(fake_root, None)).to_json()
    assert data["driver"]["version"] == "24.1.rc1"
    assert data["driver"]["install_path"] == "/opt/Ascend"


def test_310p_duo_chips_have_no_hbm_and_carry_device_memory(fake_root: Path) -> None:
    data = discover_node(_probe(fake_root, capture("npu-smi-info_310p3-300iduo_1.txt"))).to_json()
    chips = data["chips"]
    assert len(chips) == 8
    assert {c["npu_id"] for c in chips} == {0, 96, 32768, 32896}
    assert all(c["hbm_total_mb"] is None and c["memory_total_mb"] in (44278, 43693) for c in chips)
    assert all(c["family"] == "310P" and c["power_w"] is None for c in chips)
    assert [p["pid"] for p in data["processes"]] == [326429, 326430, 326430]
    assert all(PROCESS_KEYS <= set(p) and p["name"] == "" for p in data["processes"])


def test_a3_two_dies_per_npu(fake_root: Path) -> None:
    node = discover_node(_probe(fake_root, capture("npu-smi-info_a3-ascend910-2chip_1.txt")))
    assert len(node.chips) == 16
    assert {c.family for c in node.chips} == {"A3"}
    assert [c.device_id for c in node.chips] == list(range(16))


def test_minus_8005_is_a_typed_error_with_the_fix(fake_root: Path) -> None:
    data = discover_node(_probe(fake_root, capture("npu-smi-info_error-8005_container_1.txt"), rc=1)).to_json()
    error = data["npu_smi"]["error"]
    assert error["code"] == "-8005"
    assert "-8005" in error["message"]
    assert "reboot" in error["remediation"].lower()
    assert data["chips"] == [] and data["npu"]["found"] is False


def test_missing_npu_smi_says_so_and_why(fake_root: Path) -> None:
    data = discover_node(_probe(fake_root, None)).to_json()
    assert data["npu_smi"]["error"]["code"] == "npu-smi-missing"
    reasons = data["npu"]["reasons"]
    assert any("npu-smi" in r for r in reasons)
    assert any("/dev/davinci" in r for r in reasons)
    assert data["host"]["cpu_count"] >= 0


@pytest.mark.parametrize(
    ("result", "code"),
    [
        (CommandResult(("npu-smi", "info"), RC_TIMEOUT, "", "", 15.0, "timed out after 15 s"), "npu-smi-not-run"),
        (CommandResult(("npu-smi", "info"), RC_NOT_FOUND, "", "", 0.0, "npu-smi: command not found"),
         "npu-smi-missing"),
        (_result("Segmentation fault\n", 139), "npu-smi-unparseable"),
        (_result("\x00\x01garbage|||\n+---+\n"), "npu-smi-unparseable"),
    ],
)
def test_npu_smi_failures_never_raise(result: CommandResult, code: str) -> None:
    status, chips, processes = interpret_npu_smi(result)
    assert status.error_code == code and status.remediation
    assert chips == () and processes == ()


def test_garbage_version_files_do_not_break_the_node(fake_root: Path) -> None:
    put(fake_root, "/usr/local/Ascend/driver/version.info", "\x00\x00 not a version file")
    put(fake_root, "/usr/local/Ascend/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info", "garbage")
    data = discover_node(_probe(fake_root, None)).to_json()
    assert data["driver"]["installed"] is False and data["driver"]["error"]
    assert data["cann"]["installed"] is False and data["cann"]["toolkit"]["error"]


def test_python_stack_is_read_by_metadata_without_importing_torch(fake_root: Path) -> None:
    data = discover_node(_probe(fake_root, None)).to_json()
    stack = data["python_stack"]
    assert stack["error"] is None
    assert set(stack["packages"]) == {"torch", "torch_npu", "vllm", "vllm_ascend", "triton_ascend"}
    assert stack["python"].count(".") == 2


def test_version_cfg_of_a_node_with_two_toolkits() -> None:
    """Derived from the 8.2.RC2 capture: a second install appends its [inner:release] to the same line (the only
    edit); the last one is the current."""
    from npuops.hardware.versions import parse_version_cfg

    text = capture("ascend-toolkit-version-cfg_8.2.RC2_1.txt").replace(
        "opp_kernel_installed_version=[8.2.0.2.220:8.2.RC2]",
        "opp_kernel_installed_version=[8.1.0.1.220:8.1.RC1][8.2.0.2.220:8.2.RC2]")
    assert "[8.1.0.1.220:8.1.RC1][8.2.0.2.220:8.2.RC2]" in text
    assert parse_version_cfg(text).installed["opp_kernel"] == "8.2.RC2"
