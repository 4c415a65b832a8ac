"""collect_node_models for real: ansible-runner, node-facts.yml and `npuops node --json` on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from npuops.fleet.events import PlaybookEvent
from npuops.fleet.facts import FIX_NOT_FOUND, FIX_UNREACHABLE, collect_node_models
from npuops.hardware.node import Node
from tests.support.paths import FLEET_INVENTORIES, NPUOPS

pytestmark = pytest.mark.slow


def test_localhost_node_model(artifacts: Path) -> None:
    seen: list[PlaybookEvent] = []
    facts = collect_node_models(inventory=["localhost"], artifacts_dir=artifacts, npuops_command=NPUOPS,
                                on_event=seen.append)
    assert facts.ok and list(facts.hosts) == ["localhost"]
    node = facts.hosts["localhost"].node
    assert node is not None
    assert node.has_npus is False and node.no_npu_reasons()
    host = node.host
    assert host.hostname == socket.gethostname()
    assert host.cpu_count >= 1 and (host.memory_total_bytes or 0) > 0 and host.kernel
    # The same model `npuops node --json` prints here.
    local = json.loads(subprocess.run([NPUOPS, "node", "--json"], capture_output=True, text=True, check=True).stdout)
    assert host.hostname == local["host"]["hostname"] and node.to_json()["cann"] == local["cann"]
    assert node.cann == Node.from_json(local).cann
    assert [e.kind for e in seen] == ["task_start", "ok", "task_start", "ok", "stats"]
    assert (facts.run.artifacts / "job_events").is_dir()
    assert facts.to_json()["hosts"]["localhost"]["status"] == "ok"


def test_unreachable_host_beside_localhost(artifacts: Path) -> None:
    started = time.monotonic()
    facts = collect_node_models(inventory=FLEET_INVENTORIES / "local-and-unreachable.yml", artifacts_dir=artifacts,
                                npuops_command=NPUOPS)
    assert time.monotonic() - started < 30  # refused at once, not an ssh timeout
    assert not facts.ok
    assert facts.hosts["localhost"].status == "ok" and facts.hosts["localhost"].node is not None
    dead = facts.hosts["unreachable"]
    assert dead.status == "unreachable" and dead.node is None
    assert "Connection refused" in dead.message and dead.fix == FIX_UNREACHABLE
    assert facts.run.rc != 0 and list(facts.nodes()) == ["localhost"]


def test_limit_selects_hosts(artifacts: Path) -> None:
    facts = collect_node_models(inventory=FLEET_INVENTORIES / "local-and-unreachable.yml", artifacts_dir=artifacts,
                                npuops_command=NPUOPS, limit="localhost")
    assert facts.ok and list(facts.hosts) == ["localhost"]


def test_check_mode_still_reads_the_model(artifacts: Path) -> None:
    facts = collect_node_models(inventory=["localhost"], artifacts_dir=artifacts, npuops_command=NPUOPS, check=True)
    assert facts.ok and facts.hosts["localhost"].node is not None


def test_ascend_root_reaches_the_host(artifacts: Path, tmp_path: Path) -> None:
    ascend = tmp_path / "Ascend"
    facts = collect_node_models(inventory=["localhost"], artifacts_dir=artifacts, npuops_command=NPUOPS,
                                ascend_root=ascend)
    node = facts.hosts["localhost"].node
    assert node is not None and str(node.cann.toolkit.path).startswith(str(ascend))


def test_npuops_missing_on_the_host(artifacts: Path) -> None:
    facts = collect_node_models(inventory=["localhost"], artifacts_dir=artifacts, npuops_command="/nonexistent/npuops")
    host = facts.hosts["localhost"]
    assert host.status == "failed" and host.node is None
    assert "/nonexistent/npuops" in host.message and host.fix == FIX_NOT_FOUND
