"""`npuops provision --tags npu-network` through ansible-runner on this machine: the npu_network role sets each NPU
port with the stateful hccn_tool stand-in (tests/support/hccn_standin.py, recorded answer formats), verifies it,
and reports every port before and after.

One story on one host: --check --diff shows what would be set and sets nothing -> the first run sets all 8 ports
-> a re-run changes nothing -> one changed address changes one port -> a port whose link stays down fails the host
with its NPU named; an address outside its netmask is refused before the host is touched, and a host without
hccn_tool is told to install the driver.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.hccn_standin import install_hccn_standin, set_knobs
from tests.support.npuops_cli import npuops
from tests.support.provision_target import Target

pytestmark = pytest.mark.slow

NETWORK = {"npuops_npu_ip_base": "10.20.0.2", "npuops_npu_netmask": "255.255.255.0",
           "npuops_npu_gateways": "10.20.0.1", "npuops_npu_network_wait_s": 4, "npuops_npu_network_poll_s": 1}


def _provision(target: Target, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = npuops("provision", "-i", str(target.inventory), "--no-hardware-check", "--tags", "npu-network",
                  "--artifacts", str(target.artifacts), *args)
    if "--json" not in args:
        return proc.returncode, {}, proc.stdout + proc.stderr
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON (rc {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-3000:]}") from None
    return proc.returncode, report, proc.stderr


def _sets(conf: Path) -> list[str]:
    calls = conf.with_name("hccn.conf.calls")
    return [c for c in calls.read_text().splitlines() if " -s " in f" {c} "] if calls.exists() else []


def test_ports_set_once_verified_and_reported(tmp_path: Path) -> None:
    target = Target(tmp_path / "host")
    conf = target.root / "etc/hccn.conf"
    install_hccn_standin(target.install_path / "driver/tools/hccn_tool", str(conf))
    target.write_inventory(**NETWORK)

    rc, _, out = _provision(target, "--check", "--diff")
    assert rc == 0, out
    assert "localhost: NPU 0 would set none -> 10.20.0.2/255.255.255.0 gw 10.20.0.1 detect 10.20.0.1" in out
    assert "+address_7=10.20.0.9" in out and "--- /etc/hccn.conf" in out
    assert _sets(conf) == [] and not conf.exists()

    rc, report, err = _provision(target, "--json")
    host = report["hosts"]["localhost"]
    assert rc == 0 and host["status"] == "ok", (host, err[-2000:])
    ports = host["npu_network"]["ports"]
    assert [p["after"]["address"] for p in ports] == [f"10.20.0.{i}" for i in range(2, 10)]
    assert all(p["before"]["address"] is None and p["changed"] for p in ports)
    assert all((p["link"], p["health"], p["reaches_detect"]) == ("UP", "Success", True) for p in ports)
    assert len(_sets(conf)) == 24 and "address_7=10.20.0.9" in conf.read_text().splitlines()

    rc, report, _ = _provision(target, "--json")
    host = report["hosts"]["localhost"]
    assert rc == 0 and host["changed"] == 0 and host["npu_network"]["changed"] == 0, host
    assert len(_sets(conf)) == 24

    target.write_inventory(**{**NETWORK, "npuops_npu_ip_base": None,
                              "npuops_npu_ips": [*(f"10.20.0.{i}" for i in range(2, 5)), "10.20.0.50",
                                                 *(f"10.20.0.{i}" for i in range(6, 10))]})
    rc, report, _ = _provision(target, "--json")
    ports = report["hosts"]["localhost"]["npu_network"]["ports"]
    assert rc == 0 and [p["device"] for p in ports if p["changed"]] == [3]
    assert (ports[3]["before"]["address"], ports[3]["after"]["address"]) == ("10.20.0.5", "10.20.0.50")
    assert _sets(conf)[24:] == ["-i 3 -ip -s address 10.20.0.50 netmask 255.255.255.0",
                                "-i 3 -gateway -s gateway 10.20.0.1"]

    set_knobs(str(conf), devices=8, down=(6,))
    rc, report, _ = _provision(target, "--json")
    host = report["hosts"]["localhost"]
    assert rc == 1 and host["status"] == "failed"
    assert host["message"].startswith("NPU 6: link DOWN") and "-link_stat -g" in host["message"]
    assert [p["device"] for p in host["npu_network"]["ports"] if p["problem"]] == [6]


def test_an_address_outside_its_netmask_is_refused_before_the_host_is_touched(tmp_path: Path) -> None:
    target = Target(tmp_path / "host")
    conf = target.root / "etc/hccn.conf"
    install_hccn_standin(target.install_path / "driver/tools/hccn_tool", str(conf))
    target.write_inventory(**{**NETWORK, "npuops_npu_netmask": "255.255.255.252"})
    proc = npuops("provision", "-i", str(target.inventory), "--no-hardware-check", "--artifacts",
                  str(target.artifacts))
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "localhost: device 1 10.20.0.3/30 is the subnet's broadcast address" in lines[0]
    assert not conf.with_name("hccn.conf.calls").exists() and not target.artifacts.exists()
    # Asking for the role without any addresses says what to set.
    target.write_inventory()
    proc = npuops("provision", "-i", str(target.inventory), "--no-hardware-check", "--tags", "npu-network",
                  "--artifacts", str(target.artifacts))
    assert proc.returncode == 3 and "no host of the inventory gives NPU port addresses" in proc.stderr
    # A host without the driver's hccn_tool fails with what to install.
    (target.install_path / "driver/tools/hccn_tool").unlink()
    target.write_inventory(**NETWORK)
    rc, report, _ = _provision(target, "--json")
    host = report["hosts"]["localhost"]
    assert rc == 1 and "hccn_tool not found" in host["message"] and "--tags driver" in host["message"], host
