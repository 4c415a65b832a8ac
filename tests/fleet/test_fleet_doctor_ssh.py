"""`npuops doctor -i INVENTORY` for real: three SSH test hosts (sshd in network namespaces, each with its own overlay
over /usr, /etc, ...; tests/support/ssh_hosts.py), each with an Ascend install made of recorded files.

Every host gets, in its own /usr/local/Ascend: the driver 25.0.rc1.1 and firmware version.info captures, the CANN
8.2.RC2 version.cfg (the kernels) and NNAL 8.2.RC2 version.info, and a CANN toolkit install-info capture; an
`npu-smi` in /usr/local/sbin that replays the recorded `npu-smi info` of an 8 x 910B3 server, and an `hccn_tool` in
/usr/local/Ascend/driver/tools that replays recorded `-ip -g`, `-link -g`, `-net_health -g` and `-ping` outputs.
The odd host's toolkit capture is another one: CANN 8.2.RC1 where the others have 8.3.RC2. npuops itself is this
checkout's venv (/work is shared with the hosts), named by npuops_command in the inventory.
"""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from npuops.errors import NpuopsError
from npuops.fleet.facts import FIX_UNREACHABLE
from tests.support.captures import capture
from tests.support.paths import REPO
from tests.support.ssh_hosts import TestFleet, cut_off

pytestmark = pytest.mark.slow

StartFleet = Callable[..., TestFleet]
NPUOPS = Path(sys.executable).parent / "npuops"
ARCH = platform.machine()
ASCEND = "/usr/local/Ascend"
TOOLKIT_INFO = f"{ASCEND}/ascend-toolkit/latest/{ARCH}-linux/ascend_toolkit_install.info"
TOOLKIT_83RC2 = "ascend_toolkit_install-info_x86_1.txt"
TOOLKIT_82RC1 = "ascend_toolkit_install-info_2.txt"
NIC_IP = "29.1.112.213"  # what hccn_tool-ip_910b_1.txt says

# Replays the recorded output of the hccn_tool query it is asked (files beside it); anything else is not answered.
FAKE_HCCN_TOOL = """#!/bin/sh
here=$(dirname "$0")
case "$*" in
    *" -ip -g") cat "$here/.hccn-ip.out" ;;
    *" -link -g") cat "$here/.hccn-link.out" ;;
    *" -net_health -g") cat "$here/.hccn-net-health.out" ;;
    *" -ping -g address "*) cat "$here/.hccn-ping.out" ;;
    *) exit 1 ;;
esac
"""


def put_on_host(fleet: TestFleet, name: str, path: str, text: str, mode: str = "644") -> None:
    fleet.run(name, f"mkdir -p {shlex.quote(str(Path(path).parent))} && cat > {shlex.quote(path)} && "
                    f"chmod {mode} {shlex.quote(path)}", input_text=text, check=True)


def install_ascend(fleet: TestFleet, name: str, toolkit: str) -> None:
    """The host's Ascend install and vendor tools, from recorded files only."""
    put_on_host(fleet, name, f"{ASCEND}/driver/version.info", capture("driver-version-info_25.0.rc1.1_1.txt"))
    put_on_host(fleet, name, f"{ASCEND}/firmware/version.info", capture("firmware-version-info_doc_1.txt"))
    put_on_host(fleet, name, TOOLKIT_INFO, capture(toolkit))
    put_on_host(fleet, name, f"{ASCEND}/ascend-toolkit/latest/version.cfg",
                capture("ascend-toolkit-version-cfg_8.2.RC2_1.txt"))
    put_on_host(fleet, name, f"{ASCEND}/nnal/atb/latest/version.info", capture("nnal-atb-version-info_8.2.RC2_1.txt"))
    put_on_host(fleet, name, "/usr/local/sbin/.npu-smi.out", capture("npu-smi-info_910b3_1.txt"))
    put_on_host(fleet, name, "/usr/local/sbin/npu-smi", "#!/bin/sh\ncat /usr/local/sbin/.npu-smi.out\n", "755")
    tools = f"{ASCEND}/driver/tools"
    for query, fixture in (("ip", "hccn_tool-ip_910b_1.txt"), ("link", "hccn_tool-link_doc_1.txt"),
                           ("net-health", "hccn_tool-net_health_doc_1.txt"), ("ping", "hccn_tool-ping_910b1_1.txt")):
        put_on_host(fleet, name, f"{tools}/.hccn-{query}.out", capture(fixture))
    put_on_host(fleet, name, f"{tools}/hccn_tool", FAKE_HCCN_TOOL, "755")


def three_hosts(ssh_fleet: StartFleet) -> tuple[TestFleet, Path]:
    """Three hosts, the third with another CANN, and their inventory (group `fleet`)."""
    fleet = ssh_fleet(3)
    h1, h2, h3 = fleet.names
    for name in (h1, h2):
        install_ascend(fleet, name, TOOLKIT_83RC2)
    install_ascend(fleet, h3, TOOLKIT_82RC1)
    # Each host has its own install, and none of it is on this machine.
    assert "version=8.2.RC1" in fleet.run(h3, f"cat {TOOLKIT_INFO}").stdout
    assert "version=8.3.RC2" in fleet.run(h1, f"cat {TOOLKIT_INFO}").stdout
    assert not Path(TOOLKIT_INFO).exists() and not Path("/usr/local/sbin/.npu-smi.out").exists()
    return fleet, fleet.inventory_path(group_vars={"npuops_command": str(NPUOPS)})


def fleet_doctor(inventory: Path, artifacts: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npuops", "doctor", "-i", str(inventory), "--forks", "3",
                           "--artifacts", str(artifacts), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=600, check=False)


def checks_by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in report["checks"]}


def test_serving_group_with_one_host_on_another_cann(ssh_fleet: StartFleet, tmp_path: Path) -> None:
    fleet, inventory = three_hosts(ssh_fleet)
    h1, h2, h3 = fleet.names
    proc = fleet_doctor(inventory, tmp_path / "artifacts", "--group", "fleet", "--level", "2", "--json")
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON (rc {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-3000:]}") from None
    assert proc.returncode == 1 and data["ok"] is False, proc.stderr[-3000:]
    hosts = data["hosts"]
    assert set(hosts) == {h1, h2, h3} and data["group"] == "fleet" and data["level"] == 2

    # Exactly the odd host, in exactly the odd fact.
    assert data["differences"] == [{
        "key": "cann", "what": "CANN toolkit", "majority": "8.3.RC2", "has_majority": True, "odd_hosts": [h3],
        "values": [{"value": "8.3.RC2", "hosts": [h1, h2]}, {"value": "8.2.RC1", "hosts": [h3]}]}]
    for name, host in hosts.items():
        # Every host gave its node model and its full doctor report, from its own files and tools.
        node, report = host["node"], host["report"]
        assert host["status"] in ("ok", "checks-failed") and report is not None, (name, host["message"])
        assert node["host"]["hostname"] == name
        assert node["cann"]["toolkit"]["version"] == ("8.2.RC1" if name == h3 else "8.3.RC2")
        assert [c["name"] for c in node["chips"]] == ["910B3"] * 8
        assert {c["nic_ip"] for c in node["chips"]} == {NIC_IP}
        checks = checks_by_id(report)
        assert checks["npu-smi-runs"]["status"] == "pass" and "8 chip(s)" in checks["npu-smi-runs"]["message"]
        assert checks["cann-toolkit"]["evidence"]
        assert host["npuops_version"] and host["clock_skew_s"] is not None
        # The same kernel clock everywhere: every reading falls inside the controller's window.
        assert data["clock"]["hosts"][name]["status"] == "pass"

        # The network preflight: the other two hosts, by inventory address and port, with their NPU NICs from
        # their node models; the interface that reaches them from this host's node model.
        others = [n for n in fleet.names if n != name]
        assert host["peers"] == {"ifname": "eth0", "peers": [
            {"name": o, "address": fleet.host(o).address, "port": 22, "npu_ips": {str(d): NIC_IP for d in range(8)}}
            for o in others]}
        reach = checks["host-peer-reach"]
        assert reach["status"] == "pass", reach
        assert all(o in reach["message"] for o in others), reach
        ping = checks["npu-peer-ping"]
        assert ping["status"] == "pass", ping
        pairs = ping["evidence"]["pairs"]
        assert {(p["peer"], p["device"], p["address"]) for p in pairs} == {
            (o, d, NIC_IP) for o in others for d in range(8)}
    assert len({h["npuops_version"] for h in hosts.values()}) == 1
    assert data["clock"]["status"] == "pass"
    # Both runs left their artifacts.
    assert [Path(a).name.split("-", 1)[1].rsplit("-", 1)[0] for a in data["artifacts"]] == ["node-facts",
                                                                                           "fleet-doctor"]


def test_unreachable_host_is_a_row_with_the_fix(ssh_fleet: StartFleet, tmp_path: Path) -> None:
    fleet, inventory = three_hosts(ssh_fleet)
    h1, h2, h3 = fleet.names
    fleet.kill_sshd(h2)
    proc = fleet_doctor(inventory, tmp_path / "artifacts", "--level", "1")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["HOST", "DOCTOR"] and "CANN" in lines[0].split()
    rows = {line.split()[0]: line.split() for line in lines[2:5]}
    assert next(iter(rows)) == h2 and set(rows) == {h1, h2, h3}, lines[:5]  # the host without a report first
    assert rows[h2][1] == "unreachable" and set(rows[h2][2:-1]) == {"-"}
    assert rows[h1][1] == "checks-failed" and rows[h3][1] == "checks-failed"
    text = proc.stdout
    # Two hosts left, one on each CANN: no majority, both named with their values.
    assert f"CANN toolkit: no majority: 8.2.RC1 on {h3}; 8.3.RC2 on {h1}" in text
    assert "Hosts without a report:" in text
    dead = next(line for line in lines if line.startswith(f"  {h2}: unreachable: "))
    assert cut_off(dead) and fleet.host(h2).address in dead
    assert lines[lines.index(dead) + 1].strip() == f"fix: {FIX_UNREACHABLE}"
    assert "FAIL device-nodes on all 2 hosts: missing device nodes" in text  # reported hosts, with fixes
    assert "FAILED: 3 host(s) at level 1 (2 checks-failed, 1 unreachable)" in text
    # Progress went to stderr while it ran, per host.
    assert f"  {h2}: unreachable" in proc.stderr and f"  {h1}: ok" in proc.stderr


# --- local connections only (no sshd): this machine as the fleet -------------------------------------------------


def test_localhost_on_this_machine_says_what_fails(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "npuops", "doctor", "--host", "localhost", "--level", "1", "--json",
                           "--artifacts", str(tmp_path / "artifacts")],
                          capture_output=True, text=True, cwd=REPO, timeout=600, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]  # no NPU here: checks fail
    data = json.loads(proc.stdout)
    host = data["hosts"]["localhost"]
    assert host["status"] == "checks-failed" and host["node"]["npu"]["found"] is False
    failed = {c["id"]: c for c in host["report"]["checks"] if c["status"] == "fail"}
    assert "driver-installed" in failed and failed["driver-installed"]["remediation"]
    assert data["differences"] == [] and data["clock"]["status"] == "pass"


def test_group_within_limit(tmp_path: Path) -> None:
    from npuops.fleet.doctor import run_fleet_doctor

    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"all": {
        "vars": {"npuops_command": str(NPUOPS)},
        "children": {"serve": {"hosts": {"node-b": {**local, "ansible_host": "127.0.0.1", "ansible_port": 2222},
                                         "node-a": {**local, "ansible_host": "127.0.0.1", "ansible_port": 1},
                                         "node-c": local}},
                     "other": {"hosts": {"node-z": local}}}}}))
    report = run_fleet_doctor(inventory=inventory, artifacts_dir=tmp_path / "artifacts", level=2, group="serve",
                              limit="node-b,node-a,node-z")
    # node-z is outside the group and node-c outside the limit: node-b and node-a, each the other's peer.
    assert set(report.hosts) == {"node-a", "node-b"} and report.group == "serve"
    assert report.hosts["node-a"].peers == {"peers": [
        {"name": "node-b", "address": "127.0.0.1", "port": 2222, "npu_ips": {}}]}
    assert report.hosts["node-b"].peers == {"peers": [{"name": "node-a", "address": "127.0.0.1", "port": 1,
                                                       "npu_ips": {}}]}
    reach = {name: next(c for c in host.checks() if c["id"] == "host-peer-reach")
             for name, host in report.hosts.items()}
    # Each doctor got its peer, at the inventory's address and port (closed ports on loopback: the host is up).
    assert reach["node-a"]["status"] == "pass" and "node-b (port closed, host up)" in reach["node-a"]["message"]
    assert reach["node-b"]["status"] == "pass" and "node-a (port closed, host up)" in reach["node-b"]["message"]
    with pytest.raises(NpuopsError, match="no host of group serve matches --limit node-z"):
        run_fleet_doctor(inventory=inventory, artifacts_dir=tmp_path / "artifacts", group="serve", limit="node-z")
