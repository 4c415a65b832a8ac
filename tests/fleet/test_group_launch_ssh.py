"""`npuops launch -i INVENTORY --group G` refuses a group whose hosts cannot reach each other, before any unit starts:
the network check (the doctor's host-peer-reach and npu-peer-ping with each host's peers) runs right after the files
are copied, and its failure names the host and the unreachable peer. Real sshd test hosts in network namespaces; the
broken path is a `prohibit` route inside one host's namespace (nothing outside the test's namespaces is touched).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.ssh_hosts import TestFleet

pytestmark = [pytest.mark.slow]

StartFleet = Callable[..., TestFleet]
NPUOPS = Path(sys.executable).parent / "npuops"
SYSTEMCTL = Path(sys.executable).parent / "systemctl3.py"
# A real published config (tests/fixtures/models/SOURCE.md); the plan needs no weights and no NPU with --hardware.
MODEL = REPO / "tests" / "fixtures" / "models" / "qwen3-8b"


def test_launch_stops_at_a_network_the_cluster_cannot_use(ssh_fleet: StartFleet, tmp_path: Path) -> None:
    fleet = ssh_fleet(2)
    first, second = fleet.names
    wrapper = tmp_path / "npuops-on-host"
    wrapper.write_text(f"#!/bin/sh\nexec env NPUOPS_SYSTEMCTL='{SYSTEMCTL}' '{NPUOPS}' \"$@\"\n")
    wrapper.chmod(0o755)
    inventory = fleet.inventory_path(group_vars={"npuops_command": str(wrapper), "npuops_systemctl": [str(SYSTEMCTL)]})
    # The second host loses its route to the first: its Gloo/HCCL connections to the leader would time out.
    blocked = fleet.run(second, f"ip route add prohibit {fleet.host(first).address}/32")
    assert blocked.returncode == 0, blocked

    done = subprocess.run([str(NPUOPS), "launch", str(MODEL), "--hardware", "910B3x8", "--name", "net",
                           "-i", str(inventory), "--group", "fleet", "--service-user", "root", "--allow-root",
                           "--artifacts", str(tmp_path / "artifacts"), "--json"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["strategy"] == "dp"
    hosts = report["hosts"]
    assert hosts[second]["status"] == "failed", hosts
    message = hosts[second]["message"]
    assert first in message and fleet.host(first).address in message, message
    assert "fix:" in message, message
    # The first host's network is fine; and nothing was started anywhere: the run stopped before the start plays.
    for later in ("Start the Ray head unit", "Start this host's units", "Start the engine unit"):
        assert later not in done.stderr, done.stderr[-3000:]
    for name in fleet.names:
        state = fleet.run(name, f"{SYSTEMCTL} is-active npuops-net.service")
        assert state.stdout.strip() != "active", (name, state)
    # The files are in place for a re-run once the network is fixed.
    assert fleet.run(second, "test -f /etc/npuops/net/instance.json").returncode == 0
