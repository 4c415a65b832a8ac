"""The node model from real captures: a fake runner and a prepared root tree, no NPU needed."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from npuops.hardware.node import NIC_IP_TIMEOUT_S, discover_node, interpret_hccn_ip, interpret_npu_smi
from npuops.hardware.probe import RC_NOT_FOUND, RC_TIMEOUT, CommandResult, Probe
from npuops.settings import Settings
from tests.support.captures import capture
from tests.support.fake_commands import FakeRunner
from tests.support.host_tree import install_a2_node, put

NODE_KEYS = {"npu_smi", "chips", "processes", "driver", "firmware", "cann", "python_stack", "host"}
CHIP_KEYS = {"npu_id", "chip_id", "logical_id", "name", "family", "health", "bus_id", "power_w", "temperature_c",
             "aicore_percent", "memory_used_mb", "memory_total_mb", "hbm_used_mb", "hbm_total_mb"}
PROCESS_KEYS = {"npu_id", "chip_id", "pid", "name", "memory_mb"}


def _result(out: str, rc: int = 0) -> CommandResult:
    return CommandResult(("npu-smi", "info"), rc, out, "", 0.01)


def _probe(root: Path, smi_out: str | None, rc: int = 0, machine: str = "aarch64") -> Probe:
    answers = {} if smi_out is None else {("npu-smi", "info"): (rc, smi_out, "")}
    return Probe(Settings(root=root), runner=FakeRunner(answers), machine=lambda: machine)


def test_a2_node_from_real_captures(fake_root: Path) -> None:
    install_a2_node(fake_root)
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
    install_a2_node(fake_root, layout="cann")
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


# --- NPU NIC addresses and host interfaces (the multi-node preflight's inputs) ------------------------------------

IP_CAPTURES = ("hccn_tool-ip_910b_1.txt", "hccn_tool-ip_910-32g_1.txt", "hccn_tool-ip_doc_1.txt")


def _hccn_ip(device: int) -> tuple[str, ...]:
    return ("hccn_tool", "-i", str(device), "-ip", "-g")


def test_nic_ip_of_every_chip_from_hccn_tool(fake_root: Path) -> None:
    answers: dict[tuple[str, ...], tuple[int, str, str]] = {
        ("npu-smi", "info"): (0, capture("npu-smi-info_910b3_1.txt"), "")}
    for device, name in enumerate(IP_CAPTURES):
        answers[_hccn_ip(device)] = (0, capture(name), "")
    answers[_hccn_ip(3)] = (0, capture("hccn_tool-link_doc_1.txt"), "")  # an answer that is not an address
    for device in range(4, 8):
        answers[_hccn_ip(device)] = (1, "", "")  # the query failed on this NIC
    runner = FakeRunner(answers)
    data = discover_node(Probe(Settings(root=fake_root), runner=runner, machine=lambda: "aarch64")).to_json()
    # The vendor doc's redacted "10.xx.xx.10" is no address to ping: null, like an answer that does not parse.
    assert [c["nic_ip"] for c in data["chips"]] == ["29.1.112.213", "10.20.11.24"] + [None] * 6
    assert [c["device_id"] for c in data["chips"]] == list(range(8))
    assert len([c for c in runner.calls if c[0] == "hccn_tool"]) == 8
    json.dumps(data)


def test_nic_ip_is_null_without_hccn_tool_and_asked_once(fake_root: Path) -> None:
    runner = FakeRunner({("npu-smi", "info"): (0, capture("npu-smi-info_910b3_1.txt"), "")})
    data = discover_node(Probe(Settings(root=fake_root), runner=runner, machine=lambda: "aarch64")).to_json()
    assert [c["nic_ip"] for c in data["chips"]] == [None] * 8
    assert [c for c in runner.calls if c[0] == "hccn_tool"] == [_hccn_ip(0)]


def test_310p_chips_have_no_nic_and_hccn_tool_is_not_asked(fake_root: Path) -> None:
    runner = FakeRunner({("npu-smi", "info"): (0, capture("npu-smi-info_310p3-300iduo_1.txt"), ""),
                         ("hccn_tool",): (0, capture("hccn_tool-ip_910b_1.txt"), "")})
    data = discover_node(Probe(Settings(root=fake_root), runner=runner, machine=lambda: "aarch64")).to_json()
    assert [c["nic_ip"] for c in data["chips"]] == [None] * 8
    assert not [c for c in runner.calls if c[0] == "hccn_tool"]


class _HungHccnTool(FakeRunner):
    """npu-smi answers; hccn_tool times out (rc 124 with an error, as SubprocessRunner reports a hang)."""

    def __init__(self, answers: Mapping[tuple[str, ...], tuple[int, str, str]]) -> None:
        super().__init__(answers)
        self.timeouts: list[float] = []

    def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> CommandResult:
        if argv[0] == "hccn_tool":
            self.calls.append(tuple(argv))
            self.timeouts.append(timeout)
            return CommandResult(tuple(argv), RC_TIMEOUT, "", "", timeout, f"timed out after {timeout:g} s")
        return super().run(argv, timeout=timeout, env=env)


def test_a_hung_hccn_tool_is_asked_once_with_a_short_timeout(fake_root: Path) -> None:
    runner = _HungHccnTool({("npu-smi", "info"): (0, capture("npu-smi-info_a3-ascend910-2chip_1.txt"), "")})
    node = discover_node(Probe(Settings(root=fake_root), runner=runner, machine=lambda: "aarch64"))
    assert len(node.chips) == 16 and all(c.nic_ip is None for c in node.chips)
    assert runner.calls.count(_hccn_ip(0)) == 1 and len([c for c in runner.calls if c[0] == "hccn_tool"]) == 1
    assert runner.timeouts == [NIC_IP_TIMEOUT_S]


def test_interpret_hccn_ip_never_raises() -> None:
    ip = capture("hccn_tool-ip_910b_1.txt")
    assert interpret_hccn_ip(CommandResult(_hccn_ip(0), 0, ip, "", 0.0)) == "29.1.112.213"
    assert interpret_hccn_ip(CommandResult(_hccn_ip(0), 0, "\x00garbage", "", 0.0)) is None
    assert interpret_hccn_ip(CommandResult(_hccn_ip(0), 0, "ipaddr:\nnetmask:\n", "", 0.0)) is None
    assert interpret_hccn_ip(CommandResult(_hccn_ip(0), 0, capture("hccn_tool-ip_doc_1.txt"), "", 0.0)) is None
    assert interpret_hccn_ip(CommandResult(_hccn_ip(0), 255, ip, "", 0.0)) is None


def test_host_interfaces_are_in_the_node_json(fake_root: Path) -> None:
    data = discover_node(_probe(fake_root, None)).to_json()
    interfaces = data["host"]["interfaces"]
    assert isinstance(interfaces, list)
    for interface in interfaces:
        assert set(interface) == {"name", "ipv4", "up"}
        assert isinstance(interface["ipv4"], list) and isinstance(interface["up"], bool)
    assert "lo" not in {i["name"] for i in interfaces}
    json.dumps(data)
