"""Multi-node serving across real SSH test hosts (network namespaces, tests/provision/ssh_hosts.py).

- A Ray cluster formed from the units `npuops launch -i INVENTORY --group G --dry-run` renders: the test installs each
  host's files at their paths on that host and starts the Ray units itself (docker-systemctl-replacement stands in for
  systemd, which is not init here); `npuops status NAME -i INVENTORY --group G` and Ray's own `ray status` show every
  node; stopping a worker's unit is noticed by the head and named; `npuops stop -i ... --group` stops every part.

The hosts share this machine's /tmp and /work and see /root through an overlay, so npuops (this checkout's venv)
and the engine venv with Ray run inside them; each host has its own /etc, /var and /run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.provision.ssh_hosts import TestFleet, ssh_fleet  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow, pytest.mark.engine]

StartFleet = Callable[..., TestFleet]
NPUOPS = Path(sys.executable).parent / "npuops"
SYSTEMCTL = Path(sys.executable).parent / "systemctl3.py"
NAME = "raytest"
RAY_UNIT = f"npuops-{NAME}-ray.service"
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


def group_status(inventory: Path, artifacts: Path) -> tuple[int, dict[str, Any]]:
    rc, out, err = npuops("status", NAME, "-i", str(inventory), "--group", "fleet", "--artifacts", str(artifacts),
                          "--json")
    assert out.strip(), err
    return rc, json.loads(out)


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 120, every: float = 2) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}; last: {last}")


def install_rendered(fleet: TestFleet, rendered: Path) -> dict[str, dict[str, Any]]:
    """Put every host's files where its manifest says, with their modes, as the launch playbook would."""
    manifests = {}
    for name in fleet.names:
        manifest = json.loads((rendered / name / "manifest.json").read_text())
        for file_name, dest in manifest["files"].items():
            source = rendered / name / file_name
            mode = f"{source.stat().st_mode & 0o777:04o}"
            done = fleet.run(name, f"install -D -m {mode} {source} {dest}")
            assert done.returncode == 0, done
        manifests[name] = manifest
    return manifests


def active_ray_nodes(ray_status_output: str) -> int:
    """Lines under `Active:` of `ray status` (tests/fixtures/ray/ray-status_*.txt shows the format)."""
    section = ray_status_output.split("Active:", 1)[1].split("Pending:", 1)[0]
    return sum(1 for line in section.splitlines() if line.strip().startswith("1 node_"))


def test_ray_cluster_from_rendered_units(ssh_fleet: StartFleet, engine_python: Path, tiny_model: Path,  # noqa: F811
                                         tmp_path: Path) -> None:
    fleet = ssh_fleet(2)
    head, worker = fleet.names
    inventory = fleet.inventory_path(group_vars={"npuops_command": str(host_npuops(tmp_path)),
                                                 "npuops_systemctl": [str(SYSTEMCTL)]})
    artifacts = tmp_path / "artifacts"
    rendered = tmp_path / "rendered"
    ray = engine_python.parent / "ray"

    # Render for the group: each host's node model gives its address and interface.
    rc, out, err = npuops("launch", str(tiny_model), *PLAN_FLAGS, "--name", NAME, "-i", str(inventory),
                          "--group", "fleet", "--vllm", str(engine_python.parent / "vllm"), "--service-user", "root",
                          "--artifacts", str(artifacts), "--dry-run", "--output", str(rendered), "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["strategy"] == "ray"
    roles = {name: host["role"] for name, host in report["hosts"].items()}
    assert roles == {head: "head", worker: "worker"}
    manifests = install_rendered(fleet, rendered)
    assert manifests[head]["units"] == [RAY_UNIT, f"npuops-{NAME}.service"]
    assert manifests[worker]["units"] == [RAY_UNIT]
    worker_env = (rendered / worker / "ray.env").read_text()
    # Each host's own address and interface, and Ray kept off the NPU device mask.
    assert f'HCCL_IF_IP="{fleet.host(worker).address}"' in worker_env
    assert 'GLOO_SOCKET_IFNAME="eth0"' in worker_env or "GLOO_SOCKET_IFNAME=" in worker_env
    assert 'RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES="1"' in worker_env
    assert "VLLM_API_KEY" not in worker_env

    # Start the Ray units as a service manager would: the head first, then the worker.
    for name in (head, worker):
        done = fleet.run(name, f"{SYSTEMCTL} start {RAY_UNIT}", timeout=120)
        assert done.returncode == 0, done
    try:
        def joined() -> dict[str, Any] | None:
            _, view = group_status(inventory, artifacts)
            ray_view = view.get("ray") or {}
            return view if ray_view.get("complete") else None

        view = wait_for("every Ray node to join", joined, timeout=180, every=3)
        assert view["ray"]["alive"] == [head, worker] and view["ray"]["missing"] == []
        # The worker's part is its Ray unit, running; the head's engine unit was never started here.
        assert view["hosts"][worker]["instance"]["state"] == "healthy"
        assert view["hosts"][worker]["instance"]["role"] == "ray-worker"
        assert view["ok"] is False and head in view["down"]
        # Ray itself agrees: two active nodes.
        status = fleet.run(head, f"{ray} status --address {fleet.host(head).address}:6379", timeout=120)
        assert status.returncode == 0, status
        assert active_ray_nodes(status.stdout) == 2, status.stdout

        # Stop the worker's unit: the head notices, and names the host.
        done = fleet.run(worker, f"{SYSTEMCTL} stop {RAY_UNIT}", timeout=120)
        assert done.returncode == 0, done

        def noticed() -> dict[str, Any] | None:
            rc, view = group_status(inventory, artifacts)
            ray_view = view.get("ray") or {}
            return view if rc == 1 and ray_view.get("missing") == [worker] else None

        view = wait_for("the head to notice the lost worker", noticed, timeout=180, every=3)
        assert view["ray"]["lost"] == [worker] and view["ray"]["alive"] == [head]
        assert worker in view["down"]
        rc, text, _ = npuops("status", NAME, "-i", str(inventory), "--group", "fleet", "--artifacts", str(artifacts))
        assert rc == 1 and f"missing: {worker}" in text, text
        # The fleet doctor says which node: the head's instances check names the worker.
        rc, out, err = npuops("doctor", "-i", str(inventory), "--group", "fleet", "--artifacts", str(artifacts),
                              "--json")
        assert rc == 1 and out.strip(), err
        checks = {c["id"]: c for c in json.loads(out)["hosts"][head]["report"]["checks"]}
        assert checks["instances-healthy"]["status"] == "fail", checks["instances-healthy"]
        assert f"no live Ray node on {worker}" in checks["instances-healthy"]["message"]
    finally:
        rc, out, err = npuops("stop", NAME, "-i", str(inventory), "--group", "fleet", "--artifacts", str(artifacts),
                              "--json")
    stopped = json.loads(out)
    assert rc == 0 and stopped["stopped"] == {head: True, worker: True}, (stopped, err)
    for name in (head, worker):
        state = fleet.run(name, f"{SYSTEMCTL} is-active {RAY_UNIT}")
        assert state.stdout.strip() in ("inactive", "failed"), (name, state)
