"""`npuops provision -i INVENTORY --tags npu-network` over two real SSH test hosts (tests/support/ssh_hosts.py), each
with its own hccn_tool stand-in at the driver's path and its own /etc/hccn.conf (the hosts' overlays).

An address given to both hosts is refused before either is touched -> with distinct addresses, a host whose NPU 2
stays down fails with that NPU named while the other converges -> its link is back: both pass, nothing changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.hccn_standin import knobs_json, standin_script
from tests.support.npuops_cli import npuops
from tests.support.ssh_hosts import TestFleet

pytestmark = pytest.mark.slow

HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
CONF = "/etc/hccn.conf"


def _install(fleet: TestFleet, name: str, down: tuple[int, ...] = ()) -> None:
    fleet.run(name, f"mkdir -p {Path(HCCN_TOOL).parent} && cat > {HCCN_TOOL} && chmod 755 {HCCN_TOOL}",
              input_text=standin_script(CONF), check=True)
    _knobs(fleet, name, down)


def _knobs(fleet: TestFleet, name: str, down: tuple[int, ...] = ()) -> None:
    fleet.run(name, f"cat > {CONF}.standin.json", input_text=knobs_json(8, down), check=True)


def _calls(fleet: TestFleet, name: str) -> list[str]:
    done = fleet.run(name, f"cat {CONF}.calls")
    return done.stdout.splitlines() if done.returncode == 0 else []


def _provision(inventory: Path, artifacts: Path) -> tuple[int, dict[str, Any], str]:
    proc = npuops("provision", "-i", str(inventory), "--no-hardware-check", "--tags", "npu-network", "--forks", "2",
                  "--artifacts", str(artifacts), "--json")
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except ValueError:
        return proc.returncode, {}, proc.stdout + proc.stderr


def test_two_hosts_refused_together_then_one_port_down_fails_only_its_host(
        ssh_fleet: Callable[..., TestFleet], tmp_path: Path) -> None:
    fleet = ssh_fleet(2)
    h1, h2 = fleet.names
    for name in fleet.names:
        _install(fleet, name, down=(2,) if name == h2 else ())
    group = {"npuops_npu_netmask": "255.255.255.0", "npuops_npu_gateways": "10.20.0.1",
             "npuops_npu_network_wait_s": 4, "npuops_npu_network_poll_s": 1}
    artifacts = tmp_path / "artifacts"

    clash = fleet.inventory_path(group_vars=group, host_vars={h1: {"npuops_npu_ip_base": "10.20.0.2"},
                                                              h2: {"npuops_npu_ip_base": "10.20.0.9"}})
    rc, _, said = _provision(clash, artifacts)
    assert rc == 3 and "NPU port address 10.20.0.9 is given to" in said and "Traceback" not in said, said
    assert _calls(fleet, h1) == _calls(fleet, h2) == [] and not artifacts.exists()

    inventory = fleet.inventory_path(group_vars=group, host_vars={h1: {"npuops_npu_ip_base": "10.20.0.2"},
                                                                  h2: {"npuops_npu_ip_base": "10.20.0.12"}})
    rc, report, said = _provision(inventory, artifacts)
    hosts = report["hosts"]
    assert rc == 1 and hosts[h1]["status"] == "ok" and hosts[h2]["status"] == "failed", said
    assert hosts[h2]["message"].startswith("NPU 2: link DOWN"), hosts[h2]["message"]
    assert [p["device"] for p in hosts[h2]["npu_network"]["ports"] if p["problem"]] == [2]
    assert "address_7=10.20.0.9" in fleet.run(h1, f"cat {CONF}").stdout.splitlines()
    assert "address_0=10.20.0.12" in fleet.run(h2, f"cat {CONF}").stdout.splitlines()

    _knobs(fleet, h2)
    rc, report, said = _provision(inventory, artifacts)
    assert rc == 0, said
    for name in (h1, h2):
        host = report["hosts"][name]
        assert host["status"] == "ok" and host["changed"] == 0 and host["npu_network"]["changed"] == 0, host
        assert len([c for c in _calls(fleet, name) if " -s " in f" {c} "]) == 24, name
