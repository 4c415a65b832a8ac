"""The fleet doctor's pure parts: differences between node models, clock skew, the serving group's --peers,
the per-host entries from recorded ansible-runner events, the table and the JSON.

Node models come from the real node-model code (`discover_node`) run on trees of real captures (version files
and `npu-smi info` outputs from tests/fixtures/ascend) through a fake runner, and travel as a host sends them:
`npuops node --json`, read back with `Node.from_json`. Clock numbers are synthetic. Runs come from recordings
(fixtures/README.md).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from npuops.doctor.context import parse_peers
from npuops.doctor.model import Status
from npuops.fleet.doctor import (
    CLOCK_FAIL_S,
    CLOCK_TASK,
    CLOCK_WARN_S,
    FIX_DOCTOR_FAILED,
    FLEET_DOCTOR_PLAYBOOK,
    build_peers,
    chip_nic_ips,
    clock_skew,
    clock_status,
    clock_windows,
    compare_values,
    fleet_differences,
    fleet_doctor_report,
    local_interface_for,
    parse_clock_reading,
    peer_address,
)
from npuops.fleet.doctor_text import render_fleet_doctor_text
from npuops.fleet.facts import FIX_UNREACHABLE, FleetFacts, HostNode, fleet_facts_from_run
from npuops.fleet.host_results import PlaybookRun
from npuops.fleet.inventory import InventoryHost, read_inventory_group
from npuops.hardware.node import Node, discover_node
from npuops.hardware.probe import Probe
from npuops.resources import shipped_dir
from npuops.settings import Settings
from tests.support.captures import capture
from tests.support.fake_commands import FakeRunner
from tests.support.host_tree import put
from tests.support.paths import FLEET_RECORDINGS
from tests.support.playbook_runs import replay

ASCEND = "/usr/local/Ascend"
TOOLKIT_83 = "ascend_toolkit_install-info_aarch64_3.txt"  # CANN 8.3.RC1
TOOLKIT_82 = "ascend_toolkit_install-info_2.txt"  # CANN 8.2.RC1
SMI_910B3 = "npu-smi-info_910b3_1.txt"  # 8 x 910B3
SMI_910B2C = "npu-smi-info_910b2c_4dev_proc_1.txt"  # 4 x 910B2C


def node_model(root: Path, *, toolkit: str = TOOLKIT_83, smi: str = SMI_910B3, nnal: bool = True,
               driver: str = "driver-version-info_25.0.rc1.1_1.txt") -> Node:
    """The node model of an A2 node whose files are real captures, as the controller reads its `npuops node --json`."""
    put(root, f"{ASCEND}/driver/version.info", capture(driver))
    put(root, f"{ASCEND}/firmware/version.info", capture("firmware-version-info_doc_1.txt"))
    put(root, f"{ASCEND}/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info", capture(toolkit))
    put(root, f"{ASCEND}/ascend-toolkit/latest/version.cfg", capture("ascend-toolkit-version-cfg_8.2.RC2_1.txt"))
    if nnal:
        put(root, f"{ASCEND}/nnal/atb/latest/version.info", capture("nnal-atb-version-info_8.2.RC2_1.txt"))
    probe = Probe(Settings(root=root), runner=FakeRunner({("npu-smi", "info"): (0, capture(smi), "")}),
                  machine=lambda: "aarch64")
    return Node.from_json(json.loads(json.dumps(discover_node(probe).to_json())))


def minimal_node(**parts: Any) -> Node:
    """The smallest node model there is, with the given parts (JSON as `npuops node --json` has them)."""
    return Node.from_json({"npu": {}, "host": {}, **parts})


@pytest.fixture
def fleet_nodes(tmp_path: Path) -> dict[str, Node]:
    """Three hosts from the same captures."""
    return {name: node_model(tmp_path / name) for name in ("h1", "h2", "h3")}


# --- differences --------------------------------------------------------------------------------------------------


def test_identical_hosts_have_no_differences(fleet_nodes: dict[str, Node]) -> None:
    assert fleet_nodes["h1"].cann.toolkit.version == "8.3.RC1"  # the capture's
    assert len(fleet_nodes["h1"].chips) == 8
    assert fleet_differences(fleet_nodes, {"h1": "0.1.0", "h2": "0.1.0", "h3": "0.1.0"}) == []


def test_another_cann_on_one_host_is_named(tmp_path: Path, fleet_nodes: dict[str, Node]) -> None:
    fleet_nodes["h3"] = node_model(tmp_path / "odd", toolkit=TOOLKIT_82)
    (difference,) = fleet_differences(fleet_nodes)
    assert difference.key == "cann" and difference.what == "CANN toolkit"
    assert difference.has_majority and difference.majority == "8.3.RC1"
    assert difference.odd_hosts == ("h3",)
    assert difference.values == (("8.3.RC1", ("h1", "h2")), ("8.2.RC1", ("h3",)))
    assert difference.value_of("h3") == "8.2.RC1"
    assert difference.to_json() == {"key": "cann", "what": "CANN toolkit", "majority": "8.3.RC1", "has_majority": True,
                                    "odd_hosts": ["h3"], "values": [{"value": "8.3.RC1", "hosts": ["h1", "h2"]},
                                                                    {"value": "8.2.RC1", "hosts": ["h3"]}]}


def test_missing_nnal_is_a_difference_with_no_value(tmp_path: Path, fleet_nodes: dict[str, Node]) -> None:
    fleet_nodes["h2"] = node_model(tmp_path / "odd", nnal=False)
    (difference,) = fleet_differences(fleet_nodes)
    assert difference.key == "nnal" and difference.majority == "8.2.RC2" and difference.odd_hosts == ("h2",)
    assert difference.value_of("h2") is None


def test_other_chips_differ_in_model_and_count(tmp_path: Path, fleet_nodes: dict[str, Node]) -> None:
    fleet_nodes["h1"] = node_model(tmp_path / "odd", smi=SMI_910B2C)
    found = {d.key: d for d in fleet_differences(fleet_nodes)}
    assert set(found) == {"chip_model", "chip_count"}
    assert found["chip_count"].majority == "8" and found["chip_count"].odd_hosts == ("h1",)
    assert found["chip_model"].value_of("h1") == "910B2C" and found["chip_model"].majority == "910B3"


def test_every_compared_version_is_read_from_the_node_model(fleet_nodes: dict[str, Node]) -> None:
    sent = {host: node.to_json() for host, node in fleet_nodes.items()}
    odd = sent["h3"]
    odd["driver"]["version"] = "24.1.rc2.2"
    odd["firmware"]["version"] = "7.1.0.11.221"
    odd["cann"]["kernels"]["version"] = "8.3.RC1"
    odd["python_stack"]["python"] = "3.10.12"
    odd["python_stack"]["packages"].update(torch="2.5.1", torch_npu="2.5.1.post1", vllm="0.9.1",
                                           vllm_ascend="0.9.1", triton_ascend="3.2.0")
    odd["host"]["arch"] = "x86_64"
    nodes = {host: Node.from_json(data) for host, data in sent.items()}
    found = fleet_differences(nodes, {"h1": "0.1.0", "h2": "0.1.0", "h3": "0.2.0"})
    assert [d.key for d in found] == ["driver", "firmware", "kernels", "python", "torch", "torch_npu", "vllm",
                                      "vllm_ascend", "triton_ascend", "arch", "npuops"]
    assert all(d.odd_hosts == ("h3",) for d in found)


def test_a_tie_names_every_value_and_no_majority() -> None:
    difference = compare_values("cann", "CANN toolkit",
                                {"a": "8.3.RC1", "b": "8.2.RC1", "c": "8.2.RC1", "d": "8.3.RC1"})
    assert difference is not None
    assert not difference.has_majority and difference.majority is None
    assert difference.odd_hosts == ("a", "b", "c", "d")
    assert dict(difference.values) == {"8.2.RC1": ("b", "c"), "8.3.RC1": ("a", "d")}
    assert difference.to_json()["majority"] is None
    assert compare_values("x", "x", {"a": "1", "b": "1"}) is None
    assert compare_values("x", "x", {}) is None


def test_hosts_without_a_value_everywhere_agree() -> None:
    assert fleet_differences({"a": minimal_node(), "b": minimal_node(chips=[], cann=None)}) == []
    assert fleet_differences({"a": minimal_node(), "b": minimal_node()}) == []


# --- clocks -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reading", "sent", "received", "skew", "least", "status"), [
    (100.5, 100.0, 101.0, 0.0, 0.0, Status.PASS),  # read in the middle of the window
    (100.9, 100.0, 101.0, 0.4, 0.0, Status.PASS),  # anywhere inside the window allows no skew
    (103.0, 100.0, 101.0, 2.5, 2.0, Status.WARN),
    (94.0, 100.0, 101.0, -6.5, 6.0, Status.FAIL),  # behind counts as well as ahead
    (105.0, 100.0, 108.0, 1.0, 0.0, Status.PASS),  # a slow connection widens the window, it makes no skew
    (101.0 + CLOCK_WARN_S, 101.0, 101.0, CLOCK_WARN_S, CLOCK_WARN_S, Status.PASS),  # bounds are exclusive
    (101.0 + CLOCK_FAIL_S, 101.0, 101.0, CLOCK_FAIL_S, CLOCK_FAIL_S, Status.WARN),
])
def test_clock_skew(reading: float, sent: float, received: float, skew: float, least: float, status: Status) -> None:
    found = clock_skew(reading, sent, received)
    assert found is not None
    assert found.skew_s == pytest.approx(skew) and found.least_s == pytest.approx(least)
    assert found.status is status
    assert found.to_json()["status"] == status.value


def test_clock_thresholds() -> None:
    assert CLOCK_WARN_S == 1.0 and CLOCK_FAIL_S == 5.0
    assert clock_status(0.0) is Status.PASS and clock_status(1.01) is Status.WARN and clock_status(-5.01) is Status.FAIL
    assert clock_status(2.0, warn_s=3.0, fail_s=10.0) is Status.PASS
    assert clock_skew(None, 1.0, 2.0) is None and clock_skew(1.0, None, 2.0) is None


@pytest.mark.parametrize(("text", "value"), [
    ("1795961791.864177261\n", 1795961791.864177261), ("1795961791", 1795961791.0),
    ("1795961791.N", 1795961791.0), ("1795961791.%N", 1795961791.0), (1795961791.5, 1795961791.5),
    ("", None), ("Sun Nov 29", None), (None, None), (True, None), ("-5.0", None),
])
def test_parse_clock_reading(text: Any, value: float | None) -> None:
    assert parse_clock_reading(text) == value


# --- the serving group ----------------------------------------------------------------------------------------------


def test_peers_of_a_serving_group_read_from_a_real_inventory() -> None:
    """fixtures/serving-group-inventory.yml through ansible-inventory (npuops.fleet.inventory): inventory order,
    ansible_host and ansible_port, a templated address replaced by the host's name."""
    members = read_inventory_group(FLEET_RECORDINGS / "serving-group-inventory.yml", "serve")
    assert [m.name for m in members] == ["node-b", "node-a", "node-c"]
    peers = build_peers(members, {})
    assert peers["node-a"] == {"peers": [{"name": "node-b", "address": "10.213.0.12", "port": 2222, "npu_ips": {}},
                                         {"name": "node-c", "address": "node-c", "port": 22, "npu_ips": {}}]}
    assert [p["name"] for p in peers["node-b"]["peers"]] == ["node-a", "node-c"]
    assert peer_address(members[2]) == "node-c"
    # What the hosts' doctors accept.
    for value in peers.values():
        group = parse_peers(json.dumps(value))
        assert len(group.peers) == 2


def _with_network(node: Node, interfaces: list[dict[str, Any]], nic_ips: Mapping[int, str]) -> Node:
    """The node model with the keys `npuops node --json` gives for networking: host.interfaces, per chip nic_ip."""
    data = copy.deepcopy(node.to_json())
    data["host"]["interfaces"] = interfaces
    for chip in data["chips"]:
        chip["nic_ip"] = nic_ips.get(chip["device_id"])
    return Node.from_json(data)


def test_peers_name_the_other_hosts_with_their_npu_nics(fleet_nodes: dict[str, Node]) -> None:
    members = [InventoryHost("h2", "10.213.0.12", 22), InventoryHost("h1", "10.213.0.11", 2222),
               InventoryHost("h3", "10.213.0.13", 22)]
    nodes: dict[str, Node | None] = {
        "h1": _with_network(fleet_nodes["h1"], [{"name": "docker0", "ipv4": ["172.17.0.1/16"], "up": False},
                                                {"name": "eth0", "ipv4": ["10.213.0.11/24"], "up": True}],
                            {0: "29.1.112.211", 1: "29.1.112.212"}),
        "h2": _with_network(fleet_nodes["h2"], [{"name": "bond0", "ipv4": ["10.213.0.12/24"], "up": True}],
                            {0: "29.1.113.211"}),
        "h3": None,  # no node model (unreachable): still a peer the others must reach, with no NPU NICs known
    }
    peers = build_peers(members, nodes)
    assert list(peers) == ["h2", "h1", "h3"]
    assert peers["h1"] == {"ifname": "eth0", "peers": [
        {"name": "h2", "address": "10.213.0.12", "port": 22, "npu_ips": {"0": "29.1.113.211"}},
        {"name": "h3", "address": "10.213.0.13", "port": 22, "npu_ips": {}}]}
    assert peers["h2"]["ifname"] == "bond0"
    assert peers["h2"]["peers"][0] == {"name": "h1", "address": "10.213.0.11", "port": 2222,
                                       "npu_ips": {"0": "29.1.112.211", "1": "29.1.112.212"}}
    assert "ifname" not in peers["h3"] and [p["name"] for p in peers["h3"]["peers"]] == ["h2", "h1"]
    parsed = parse_peers(json.dumps(peers["h1"]))  # the doctor's own reader takes it
    assert parsed.ifname == "eth0" and parsed.peers[0].npu_ips == {0: "29.1.113.211"}


def test_the_inventorys_npu_addresses_are_what_every_host_is_told(fleet_nodes: dict[str, Node]) -> None:
    """One source: where the inventory gives NPU port addresses (what `provision --tags npu-network` sets), the
    peers are told those, and each host gets its own to compare its NICs with; else the node models' readings."""
    network = {"npuops_npu_ips": "29.1.112.221,29.1.112.222", "npuops_npu_netmask": "255.255.0.0",
               "npuops_npu_detect_ips": "29.1.0.1"}
    members = [InventoryHost("h1", "10.213.0.11", 22, network), InventoryHost("h2", "10.213.0.12", 22)]
    nodes: dict[str, Node | None] = {
        "h1": _with_network(fleet_nodes["h1"], [], {0: "29.1.112.211", 1: "29.1.112.212"}),
        "h2": _with_network(fleet_nodes["h2"], [], {0: "29.1.113.211"})}
    peers = build_peers(members, nodes)
    assert peers["h2"]["peers"][0]["npu_ips"] == {"0": "29.1.112.221", "1": "29.1.112.222"}
    assert peers["h1"]["npu_ips"] == {"0": "29.1.112.221", "1": "29.1.112.222"}
    assert peers["h1"]["peers"][0]["npu_ips"] == {"0": "29.1.113.211"} and "npu_ips" not in peers["h2"]
    assert parse_peers(json.dumps(peers["h1"])).npu_ips == {0: "29.1.112.221", 1: "29.1.112.222"}


def test_local_interface_and_nic_ips_tolerate_odd_models() -> None:
    """Odd but well-formed models: addresses that are no CIDR, an interface without `up`, chips of an older npuops
    without device_id (what is not a node model at all is refused by Node.from_json, tests/test_node_wire.py)."""
    assert local_interface_for(None, ["10.0.0.1"]) is None
    assert local_interface_for(minimal_node(host={"interfaces": [{"name": "eth0", "ipv4": ["garbage"], "up": True}]}),
                               ["10.0.0.1", "not-an-ip"]) is None
    assert local_interface_for(minimal_node(host={"interfaces": [{"name": "eth1", "ipv4": ["10.0.0.5/8"]}]}),
                               ["node-b", "10.9.9.9"]) == "eth1"
    assert local_interface_for(minimal_node(host={"interfaces": [{"name": "eth1", "ipv4": ["10.0.0.5/8"],
                                                                  "up": False}]}), ["10.9.9.9"]) is None
    assert chip_nic_ips(minimal_node(chips=[{"npu_id": 4, "chip_id": 0, "logical_id": None, "nic_ip": "1.2.3.4"},
                                            {"npu_id": 0, "chip_id": 1, "logical_id": 1, "nic_ip": "1.2.3.5"},
                                            {"npu_id": 5, "chip_id": 0, "nic_ip": None}])) == {
        "4": "1.2.3.4", "1": "1.2.3.5"}
    assert chip_nic_ips(None) == {} and chip_nic_ips(minimal_node(chips=[])) == {}


# --- the report from recorded runs -------------------------------------------------------------------------------


def facts_and_doctor() -> tuple[FleetFacts, PlaybookRun]:
    facts = fleet_facts_from_run(replay("node-facts-local-and-unreachable", rc=4, status="failed"))
    return facts, replay("fleet-doctor-local-and-unreachable", rc=4, status="failed")


def test_the_clock_task_is_the_playbooks() -> None:
    import yaml

    (play,) = yaml.safe_load((shipped_dir("playbooks") / FLEET_DOCTOR_PLAYBOOK).read_text())
    assert CLOCK_TASK in [task["name"] for task in play["tasks"]]


def test_report_from_recorded_runs() -> None:
    facts, doctor_run = facts_and_doctor()
    windows = clock_windows(doctor_run.events)
    assert list(windows) == ["localhost"]
    sent, received = windows["localhost"]
    assert 0 < received - sent < 60
    report = fleet_doctor_report(facts, doctor_run, level=1)
    local, dead = report.hosts["localhost"], report.hosts["unreachable"]
    # This recording machine has no NPUs: the doctor failed checks (exit 1), which is a report.
    assert local.status == "checks-failed" and local.report is not None and local.report["ok"] is False
    assert local.node is not None and local.npuops_version and local.npuops_version[0].isdigit()
    assert {"driver-installed", "cann-toolkit"} <= {c["id"] for c in local.failed_checks()}
    assert local.area_status()["driver"] is Status.FAIL
    # Same machine, same clock: the reading lies inside the controller's window.
    assert local.clock is not None and local.clock.least_s == 0 and local.clock.status is Status.PASS
    assert dead.status == "unreachable" and dead.report is None and dead.fix == FIX_UNREACHABLE
    assert "Connection refused" in dead.message
    assert report.differences == () and not report.ok
    assert [h.host for h in report.sorted_hosts()] == ["unreachable", "localhost"]
    assert report.areas()[:3] == ["driver", "chips", "cann"]

    data = report.to_json()
    assert json.loads(json.dumps(data)) == data
    assert list(data) == ["ok", "level", "group", "hosts", "differences", "clock", "artifacts", "errors"]
    assert list(data["hosts"]) == ["unreachable", "localhost"]
    entry = data["hosts"]["localhost"]
    assert set(entry) == {"status", "message", "fix", "npuops_version", "clock_skew_s", "report", "node"}
    assert entry["report"]["checks"] and entry["node"]["npu"]["found"] is False
    assert isinstance(entry["clock_skew_s"], float)
    assert data["hosts"]["unreachable"]["report"] is None and data["hosts"]["unreachable"]["fix"] == FIX_UNREACHABLE
    assert data["clock"]["status"] == "pass" and set(data["clock"]["hosts"]) == {"localhost"}
    assert data["clock"]["warn_s"] == CLOCK_WARN_S and data["clock"]["fail_s"] == CLOCK_FAIL_S


def test_text_table_worst_host_first_with_failures_and_fixes() -> None:
    facts, doctor_run = facts_and_doctor()
    text = render_fleet_doctor_text(fleet_doctor_report(facts, doctor_run, level=1))
    lines = text.splitlines()
    header = lines[0].split()
    assert header[:2] == ["HOST", "DOCTOR"] and header[2:5] == ["DRIVER", "CHIPS", "CANN"]
    assert header[-2:] == ["CLOCK", "ODD"]
    assert lines[2].split()[:2] == ["unreachable", "unreachable"]
    assert lines[3].split()[:3] == ["localhost", "checks-failed", "FAIL"]
    assert "Failed checks:" in text and "FAIL driver-installed on localhost:" in text
    assert "Hosts without a report:" in text and f"fix: {FIX_UNREACHABLE}" in text
    assert lines[-2].startswith("FAILED: 2 host(s) at level 1 (1 checks-failed, 1 unreachable); 0 difference(s)")


def test_a_doctor_that_refuses_its_arguments_fails_the_host_with_npuops_message() -> None:
    facts = FleetFacts({"localhost": HostNode("localhost", "ok", minimal_node())},
                       replay("node-facts-local-and-unreachable"))
    report = fleet_doctor_report(facts, replay("fleet-doctor-usage-error", rc=2, status="failed"), level=3)
    host = report.hosts["localhost"]
    assert host.status == "failed" and host.report is None
    assert "Invalid value for '--level': 7" in host.message and host.fix == FIX_DOCTOR_FAILED
    # Read before the doctor ran: a host whose doctor fails still shows its clock and npuops version.
    assert host.clock is not None and host.npuops_version is not None
    assert not report.ok


def doctor_run_of(reports: Mapping[str, Mapping[str, Any]]) -> PlaybookRun:
    """A fleet-doctor run in which each host answered as the recorded localhost did, with the given report."""
    recorded_run = replay("fleet-doctor-local-and-unreachable", rc=4, status="failed")
    local = recorded_run.hosts["localhost"]
    results = {}
    events = []
    for host, report in reports.items():
        data = {**local.data, "npuops_fleet_doctor": {**local.data["npuops_fleet_doctor"], "report": report}}
        results[host] = dataclasses.replace(local, name=host, data=data)
        events += [dataclasses.replace(e, host=host) for e in recorded_run.events if e.host == "localhost"]
    return PlaybookRun(recorded_run.playbook, 0, "successful", results, recorded_run.artifacts, 0.0,
                       events=tuple(events))


def test_odd_host_is_flagged_in_the_table_and_the_json(tmp_path: Path, fleet_nodes: dict[str, Node]) -> None:
    passing = {"ok": True, "summary": {}, "checks": [
        {"id": "cann-toolkit", "area": "cann", "status": "pass", "message": "ok", "remediation": None},
        {"id": "thread-limits", "area": "environment", "status": "warn", "message": "unset", "remediation": "set"}]}
    fleet_nodes["h3"] = node_model(tmp_path / "odd", toolkit=TOOLKIT_82)
    base_facts, _ = facts_and_doctor()
    facts = FleetFacts({h: HostNode(h, "ok", node) for h, node in fleet_nodes.items()}, base_facts.run)
    run = doctor_run_of({h: passing for h in ("h1", "h2", "h3")})
    report = fleet_doctor_report(facts, run, level=2, order=["h1", "h2", "h3"])
    assert set(report.hosts) == {"h1", "h2", "h3"}
    assert {h: report.hosts[h].status for h in ("h1", "h2", "h3")} == {"h1": "ok", "h2": "ok", "h3": "ok"}
    assert [d.key for d in report.differences] == ["cann"] and report.odd_hosts() == {"h3"}
    assert not report.ok  # the hosts differ
    assert [h.host for h in report.sorted_hosts()] == ["h3", "h1", "h2"]  # the odd one first, then inventory order
    reordered = fleet_doctor_report(facts, run, level=2, order=["h2", "h1", "h3"])
    assert [h.host for h in reordered.sorted_hosts()] == ["h3", "h2", "h1"]
    data = report.to_json()
    assert data["differences"][0]["odd_hosts"] == ["h3"] and data["differences"][0]["majority"] == "8.3.RC1"
    text = render_fleet_doctor_text(report)
    assert "CANN toolkit: 8.3.RC1 on 2 host(s); odd: h3 8.2.RC1" in text
    h3_row = next(line for line in text.splitlines() if line.startswith("h3 "))
    assert h3_row.split()[-1] == "yes"
    assert all(line.split()[-1] != "yes" for line in text.splitlines() if line.startswith(("h1 ", "h2 ")))
    # Without the odd host, the fleet is fine.
    fine = fleet_doctor_report(FleetFacts({h: facts.hosts[h] for h in ("h1", "h2")}, facts.run),
                               doctor_run_of({h: passing for h in ("h1", "h2")}), level=2)
    assert fine.ok and fine.differences == ()
    assert render_fleet_doctor_text(fine).splitlines()[-2].startswith("OK: 2 host(s)")


def test_a_clock_far_off_fails_the_fleet() -> None:
    facts, doctor_run = facts_and_doctor()
    events = tuple(dataclasses.replace(e, started_at=(e.started_at or 0) - 60, ended_at=(e.ended_at or 0) - 60)
                   if e.task == CLOCK_TASK and e.host == "localhost" else e for e in doctor_run.events)
    shifted = PlaybookRun(doctor_run.playbook, doctor_run.rc, doctor_run.status, doctor_run.hosts,
                          doctor_run.artifacts, 0.0, events=events)
    report = fleet_doctor_report(facts, shifted, level=1)
    clock = report.hosts["localhost"].clock
    assert clock is not None and clock.skew_s == pytest.approx(60, abs=1) and clock.status is Status.FAIL
    assert report.clock_status is Status.FAIL
    text = render_fleet_doctor_text(report)
    assert "FAIL localhost: +60." in text and "chronyc tracking" in text


def test_no_doctor_run_when_no_host_answered() -> None:
    facts = fleet_facts_from_run(replay("node-facts-missing-command", rc=2, status="failed"))
    report = fleet_doctor_report(facts, None, level=2)
    (host,) = report.hosts.values()
    assert host.status == "failed" and "cannot execute" in host.message and host.report is None
    assert not report.ok and report.clock_status is Status.SKIP and report.areas() == []
    assert "Hosts without a report:" in render_fleet_doctor_text(report)


# --- the CLI's refusals (no Ansible run gets that far) --------------------------------------------------------------


@pytest.mark.parametrize(("args", "rc", "message"), [
    (["--group", "serve"], 2, "--limit and --group work on an inventory"),
    (["--host", "localhost", "--group", "serve"], 2, "--group needs an inventory file"),
    (["--host", "localhost", "-i", "x.yml"], 2, "do not go together"),
    (["--host", "localhost", "--only", "chip-health"], 2, "--only does not go with -i/--host"),
    (["-i", "@FIXTURES@/serving-group-inventory.yml", "--group", "servers"], 3, "the inventory has no group 'servers'"),
    (["-i", "@FIXTURES@/serving-group-inventory.yml", "--group", "serve", "--peers", "[]"], 2,
     "--peers does not go with -i/--host"),
    (["-i", "@FIXTURES@/does-not-exist.yml"], 3, "does not exist"),
])
def test_cli_refusals_are_one_line(args: list[str], rc: int, message: str, tmp_path: Path) -> None:
    argv = [a.replace("@FIXTURES@", str(FLEET_RECORDINGS)) for a in args]
    proc = subprocess.run([sys.executable, "-m", "npuops", "doctor", *argv, "--artifacts", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == rc, proc.stderr
    assert message in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_failure_shared_by_hosts_is_listed_once_with_its_fix(fleet_nodes: dict[str, Node]) -> None:
    def report(*failing: str) -> dict[str, Any]:
        return {"ok": not failing, "summary": {}, "checks": [
            {"id": check, "area": "driver", "status": "fail", "message": f"{check} is broken",
             "remediation": f"repair {check}"} for check in failing]}

    base_facts, _ = facts_and_doctor()
    facts = FleetFacts({h: HostNode(h, "ok", node) for h, node in fleet_nodes.items()}, base_facts.run)
    run = doctor_run_of({"h1": report("device-nodes"), "h2": report("device-nodes", "chip-count"), "h3": report()})
    text = render_fleet_doctor_text(fleet_doctor_report(facts, run, level=1))
    assert "FAIL device-nodes on h2, h1: device-nodes is broken\n      fix: repair device-nodes" in text
    assert "FAIL chip-count on h2: chip-count is broken" in text
    assert text.count("device-nodes is broken") == 1
    run = doctor_run_of({h: report("device-nodes") for h in ("h1", "h2", "h3")})
    assert "FAIL device-nodes on all 3 hosts: " in render_fleet_doctor_text(fleet_doctor_report(facts, run, level=1))
