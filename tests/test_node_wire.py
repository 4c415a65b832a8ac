"""The node model over the wire: `Node.from_json` reads what `npuops node --json` prints, here or on another host.

Nodes come from the real node-model code on every recorded `npu-smi info` that parses (the captures behind
tests/golden/npu_smi/), with and without NPU NIC addresses and installed components, from npu-smi failures, and from
the node models inside the recorded node-facts runs (tests/fleet/fixtures: written by an npuops older than the host
interfaces and the NIC addresses).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from npuops.errors import BadInputError
from npuops.fleet.facts import NODE_STATS_KEY
from npuops.hardware.node import Chip, Node, discover_node
from npuops.hardware.probe import Probe
from npuops.settings import Settings
from npuops.wire import WireFormatError
from tests.support.captures import capture
from tests.support.fake_commands import FakeRunner
from tests.support.host_tree import install_a2_node
from tests.support.paths import REPO
from tests.support.playbook_runs import replay

SMI_CAPTURES = sorted(p.stem for p in (REPO / "tests" / "golden" / "npu_smi").glob("*.json"))
IP_CAPTURE = "hccn_tool-ip_910b_1.txt"


def _node(root: Path, smi: str | None, *, rc: int = 0, installed: bool = False, nic_ips: bool = False) -> Node:
    answers: dict[tuple[str, ...], tuple[int, str, str]] = {}
    if smi is not None:
        answers[("npu-smi", "info")] = (rc, capture(f"{smi}.txt"), "")
    if nic_ips:
        answers[("hccn_tool",)] = (0, capture(IP_CAPTURE), "")
    if installed:
        install_a2_node(root)
    return discover_node(Probe(Settings(root=root), runner=FakeRunner(answers), machine=lambda: "aarch64"))


def _over_the_wire(node: Node) -> dict[str, Any]:
    """The JSON as another host receives it: printed, then parsed."""
    data: dict[str, Any] = json.loads(json.dumps(node.to_json()))
    return data


def _recorded_nodes() -> list[dict[str, Any]]:
    """The node models the hosts handed back in the recorded node-facts runs, as ansible-runner delivered them."""
    run = replay("node-facts-local-and-unreachable", rc=4, status="failed")
    return [result.data[NODE_STATS_KEY] for result in run.hosts.values() if NODE_STATS_KEY in result.data]


@pytest.mark.parametrize("smi", SMI_CAPTURES)
@pytest.mark.parametrize(("installed", "nic_ips"), [(False, False), (True, True)], ids=["bare", "installed"])
def test_every_recorded_node_round_trips(smi: str, installed: bool, nic_ips: bool, fake_root: Path) -> None:
    node = _node(fake_root, smi, rc=1 if "error" in smi else 0, installed=installed, nic_ips=nic_ips)
    data = _over_the_wire(node)
    again = Node.from_json(data)
    assert again == node
    assert again.to_json() == data


def test_the_round_trip_keeps_what_the_json_only_implies(fake_root: Path) -> None:
    node = _node(fake_root, "npu-smi-info_910b1_8dev_elided_v23rc2_1", installed=True, nic_ips=True)
    again = Node.from_json(_over_the_wire(node))
    assert again.npu_smi.elided and again.npu_smi.ran
    assert [c.family for c in again.chips] == [c.family for c in node.chips] and again.chips[0].spec is not None
    assert again.chips[0].nic_ip == "29.1.112.213"
    assert again.driver_install_path == node.driver_install_path and again.cann.layout == "ascend-toolkit"
    truncated = _node(fake_root, "npu-smi-info_910b4_1dev_v26_truncated_1")
    assert Node.from_json(_over_the_wire(truncated)).processes == truncated.processes


@pytest.mark.parametrize("smi", [None, "npu-smi-info_error-8005_container_1"], ids=["missing", "-8005"])
def test_an_npu_smi_failure_round_trips(smi: str | None, fake_root: Path) -> None:
    node = _node(fake_root, smi, rc=1)
    again = Node.from_json(_over_the_wire(node))
    assert again == node and again.no_npu_reasons() == node.no_npu_reasons()
    assert again.npu_smi.ran is (smi is not None)


def test_a_recorded_node_of_an_older_npuops_reads_with_defaults() -> None:
    (data,) = _recorded_nodes()
    assert "interfaces" not in data["host"]  # recorded before npuops reported them
    node = Node.from_json(data)
    assert node.host.interfaces == () and node.host.hostname == data["host"]["hostname"]
    assert node.npu_smi.error_code == "npu-smi-missing" and not node.npu_smi.ran
    assert not node.has_npus and node.no_npu_reasons() == data["npu"]["reasons"]
    written = node.to_json()
    # What the older npuops sent comes back unchanged, with the newer keys at their defaults.
    assert written["host"].pop("interfaces") == [] and written["npu_smi"].pop("elided") is False
    assert written["host"].pop("cpu") is None  # recorded before npuops read the CPU's flags
    assert written == data


def test_chips_of_an_older_npuops_get_their_device_id_and_no_nic(fake_root: Path) -> None:
    data = _over_the_wire(_node(fake_root, "npu-smi-info_a3-ascend910-2chip_1", nic_ips=True))
    old = copy.deepcopy(data)
    for chip in old["chips"]:
        del chip["device_id"], chip["nic_ip"]
    del old["host"]["interfaces"], old["npu_smi"]["elided"]
    for process in old["processes"]:
        del process["container_pid"]
    node = Node.from_json(old)
    assert [c.device_id for c in node.chips] == [c["device_id"] for c in data["chips"]] == list(range(16))
    assert all(c.nic_ip is None for c in node.chips) and node.host.interfaces == ()


def test_a_minimal_node_model_is_an_empty_node() -> None:
    node = Node.from_json({"npu": {}, "host": {}})
    assert node.chips == () and node.host.cpu_count == 0 and not node.driver.installed
    assert node.python_stack.versions == {} and node.cann.toolkit.installed is False


@pytest.mark.parametrize(("data", "where"), [
    ([], "the document"),
    ("npuops node", "the document"),
    ({"ok": True, "instances": []}, "lacks npu, host"),
    ({"npu": {}}, "lacks host"),
    ({"npu": {}, "host": []}, "host is a list"),
    ({"npu": {}, "host": {}, "chips": "garbage"}, "chips is a string"),
    ({"npu": {}, "host": {}, "chips": ["garbage"]}, "chips[0] is a string"),
    ({"npu": {}, "host": {}, "chips": [{"chip_id": 0}]}, "chips[0].npu_id is missing"),
    ({"npu": {}, "host": {}, "chips": [{"npu_id": "0", "chip_id": 0}]}, "chips[0].npu_id is a string"),
    ({"npu": {}, "host": {}, "chips": [{"npu_id": True, "chip_id": 0}]}, "chips[0].npu_id is a boolean"),
    ({"npu": {}, "host": {"interfaces": [{"name": "eth0", "ipv4": [10]}]}}, "host.interfaces[0].ipv4[0] is a number"),
    ({"npu": {}, "host": {"cpu_count": 2.5}}, "host.cpu_count is a number"),
    ({"npu": {}, "host": {}, "npu_smi": {"error": {"message": "x"}}}, "npu_smi.error.code is missing"),
    ({"npu": {}, "host": {}, "python_stack": {"packages": {"torch": 2}}}, "python_stack.packages.torch is a number"),
])
def test_what_is_not_a_node_model_is_one_line(data: Any, where: str) -> None:
    with pytest.raises(WireFormatError) as caught:
        Node.from_json(data)
    error = caught.value
    assert isinstance(error, BadInputError) and error.what == "node model"
    assert where in error.problem and error.fix
    assert "\n" not in error.one_line()


def test_a_chip_of_an_unknown_model_keeps_its_columns() -> None:
    chip = Chip.from_json({"npu_id": 3, "chip_id": 0, "name": "910Z9", "health": "OK", "nic_ip": "10.0.0.3"})
    assert chip.spec is None and chip.family is None and chip.device_id == 3 and chip.nic_ip == "10.0.0.3"
    assert chip.smi.hbm_total_mb is None and chip.device_memory_total_mb is None
