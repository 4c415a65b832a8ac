"""Multi-node serving across real SSH test hosts (network namespaces, tests/support/ssh_hosts.py), launched with
`npuops launch -i INVENTORY --group G`: the units npuops renders, installed and started on each host by
launch-group.yml (docker-systemctl-replacement stands in for systemd, which is not init here).

- Pipeline parallel 2 over Ray: a Ray cluster of the two hosts from the rendered Ray units, `ray status` and
  `npuops status -i ... --group` show both nodes, a completion crosses both stages; the worker's Ray unit stopped is
  noticed by the head, named by the group status and by the fleet doctor; `npuops stop -i ... --group` stops it all.
Native data parallel runs under real systemd on each host instead (tests/systemd/test_group_launch.py). PP over Ray
stays here: under real systemd its hardened Ray units come up and join, but the two stages stop after loading their
weights (not yet understood), so the stand-in remains its proof.

The hosts share this machine's /tmp and /work and see /root through an overlay, so npuops (this checkout's venv)
and the engine venv with Ray run inside them; each host has its own /etc, /var and /run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from npuops.instance.ray import RAY_NODES_SCRIPT
from tests.support.engine import COMPLETION_SCRIPT
from tests.support.ssh_hosts import TestFleet
from tests.support.workspace import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.engine]

StartFleet = Callable[..., TestFleet]
NPUOPS = Path(sys.executable).parent / "npuops"
SYSTEMCTL = Path(sys.executable).parent / "systemctl3.py"
# The tiny model has two layers: two pipeline stages, one per host.
PLAN_FLAGS = ("--hardware", "cpu", "--multinode", "ray", "--dtype", "float32", "--max-model-len", "512",
              "--input-len", "256", "--output-len", "64", "--enforce-eager",
              "--kv-cache-memory-bytes", str(256 * 2**20))


def host_npuops(tmp_path: Path) -> Path:
    """The npuops the hosts run: this checkout's, with the stand-in service manager as its systemctl."""
    wrapper = tmp_path / "npuops-on-host"
    wrapper.write_text(f"#!/bin/sh\nexec env NPUOPS_SYSTEMCTL='{SYSTEMCTL}' '{NPUOPS}' \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def npuops(*args: str, timeout: float = 300) -> tuple[int, str, str]:
    done = subprocess.run([str(NPUOPS), *args], capture_output=True, text=True, timeout=timeout, check=False)
    return done.returncode, done.stdout, done.stderr


def active_ray_nodes(ray_status_output: str) -> int:
    """Lines under `Active:` of `ray status` (tests/fixtures/ray/ray-status_*.txt shows the format)."""
    section = ray_status_output.split("Active:", 1)[1].split("Pending:", 1)[0]
    return sum(1 for line in section.splitlines() if line.strip().startswith("1 node_"))





def test_launch_pipeline_stages_over_ray_on_two_hosts(ssh_fleet: StartFleet, engine_python: Path,
                                                      tiny_model: Path, tmp_path: Path) -> None:
    """`npuops launch -i INVENTORY --group G` end to end: launch-group.yml installs the units on both hosts, starts
    the Ray head, the worker, waits for both nodes, starts the engine (vllm serve, PP=2 over Ray: one stage per host)
    and waits for /health. A completion is served; then the worker's Ray node is stopped and the head says so."""
    fleet = ssh_fleet(2)
    head, worker = fleet.names
    inventory = fleet.inventory_path(group_vars={"npuops_command": str(host_npuops(tmp_path)),
                                                 "npuops_systemctl": [str(SYSTEMCTL)]})
    artifacts = tmp_path / "artifacts"
    name = "pp"
    # vLLM's CPU platform has no Ray device key: the test-only plugin (tests/engine/cpu_ray_platform, installed in the
    # engine venv, inert unless asked) gives it vllm-ascend's "NPU", and each Ray node offers one such resource.
    flags = [f for f in PLAN_FLAGS if f != "--enforce-eager"]
    # A cluster wait for a busy 2-core machine: run P waited 120 s for the Ray worker's node while the other worker
    # ran a group of engines, and timed out (the wait is a limit, not what this test is about).
    rc, out, err = npuops("launch", str(tiny_model), *flags, "--name", name, "-i", str(inventory), "--group", "fleet",
                          "--vllm", str(engine_python.parent / "vllm"), "--service-user", "root", "--allow-root",
                          "--env", "NPUOPS_CPU_RAY_PLATFORM=1", "--ray-node-resources", '{"NPU": 1}',
                          "--artifacts", str(artifacts), "--cluster-wait", "600", "--json", timeout=1500)
    try:
        assert out.strip(), err
        report = json.loads(out)
        assert rc == 0 and report["ok"], (report.get("hosts"), report.get("endpoint"), err[-3000:])
        assert report["plan"]["config"]["pipeline_parallel_size"] == 2
        assert report["plan"]["config"]["enforce_eager"] is False  # the CPU engine's stages need the warm-up
        assert {h: report["hosts"][h]["status"] for h in (head, worker)} == {head: "ok", worker: "ok"}
        endpoint = report["endpoint"]
        assert endpoint["healthy"] and endpoint["cluster"]["ray"]["alive"] == [head, worker], endpoint
        # Progress per host and task went to stderr while it ran.
        assert "Start the Ray head unit" in err and f"{worker}: changed" in err, err[-2000:]
        assert "Check the network between the group's hosts" in err, err[-2000:]

        # Served, with the second stage on the other host.
        done = fleet.run(head, [str(engine_python), "-c", COMPLETION_SCRIPT, endpoint["url"], endpoint["model"]],
                         timeout=180)
        assert done.returncode == 0, done
        assert json.loads(done.stdout)["tokens"] == 8
        # Ray itself: both nodes joined, and the engine's placement group holds both nodes' NPU resource. The cluster
        # takes the launch's token (token authentication): with it from the 0600 env file `ray status` answers ...
        address = f"{fleet.host(head).address}:6379"
        ray_status = fleet.run(head, f"set -a; . /etc/npuops/{name}/ray.env; set +a; "
                                     f"{engine_python.parent / 'ray'} status --address {address}", timeout=120)
        assert active_ray_nodes(ray_status.stdout) == 2, ray_status.stdout
        assert "2.0/2.0 NPU" in ray_status.stdout, ray_status.stdout
        rc, view = group_status_of(inventory, artifacts, name)
        assert rc == 0 and view["ok"] and view["down"] == [], view
        # ... and a driver without it is turned away.
        stranger = fleet.run(head, [str(engine_python), "-c", RAY_NODES_SCRIPT, address], timeout=120)
        assert stranger.returncode != 0 and "ConnectionError" in stranger.stderr, stranger

        # The worker's node goes: the head's engine loses its second stage, and the group status names the host.
        done = fleet.run(worker, f"{SYSTEMCTL} stop npuops-{name}-ray.service", timeout=120)
        assert done.returncode == 0, done

        def lost() -> dict[str, Any] | None:
            rc, view = group_status_of(inventory, artifacts, name)
            ray_view = view.get("ray") or {}
            return view if rc == 1 and ray_view.get("missing") == [worker] else None

        view = wait_for(lost, 180, "the head to name the lost worker", poll=3)
        assert head in view["down"] and worker in view["down"], view
        assert view["ray"]["lost"] == [worker] and view["ray"]["alive"] == [head], view
        # The fleet doctor says which node: the head's instances check names the worker.
        rc, out, err = npuops("doctor", "-i", str(inventory), "--group", "fleet", "--artifacts", str(artifacts),
                              "--json")
        assert rc == 1 and out.strip(), err
        checks = {c["id"]: c for c in json.loads(out)["hosts"][head]["report"]["checks"]}
        assert checks["instances-healthy"]["status"] == "fail", checks["instances-healthy"]
        assert f"no live Ray node on {worker}" in checks["instances-healthy"]["message"]
    finally:
        rc, out, err = npuops("stop", name, "-i", str(inventory), "--group", "fleet", "--artifacts", str(artifacts),
                              "--json")
    stopped = json.loads(out)
    assert rc == 0 and all(stopped["stopped"].values()), (stopped, err)


def group_status_of(inventory: Path, artifacts: Path, name: str) -> tuple[int, dict[str, Any]]:
    rc, out, err = npuops("status", name, "-i", str(inventory), "--group", "fleet", "--artifacts", str(artifacts),
                          "--json")
    assert out.strip(), err
    return rc, json.loads(out)
