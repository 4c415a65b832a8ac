"""A launch or a rollout into a read-only state or unit directory: one line naming the directory and the fix,
refused before the running instance or any replica is stopped, and nothing written.

The directories are made read-only for real (EROFS): the command runs in a mount namespace of its own where they
are read-only bind mounts (`unshare -m`, as root). Root passes permission bits, so a chmod would prove nothing.
The service manager is a stand-in named like docker-systemctl-replacement (npuops then needs no booted systemd)
that says every unit is active and logs every call: a stop in its log is an instance stopped for nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npuops.instance.revisions import read_history
from tests.launch.test_rollout_units import _installed
from tests.support.model_dirs import write_tiny_model
from tests.support.paths import REPO

# Mount each directory given read-only in a private mount namespace, then run the command there.
_READ_ONLY = ('set -e; n=$1; shift; while [ "$n" -gt 0 ]; do mount --bind "$1" "$1"; '
              'mount -o remount,bind,ro "$1"; shift; n=$((n-1)); done; exec "$@"')


def _read_only_unavailable() -> str | None:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("mount") is None:
        return "read-only bind mounts need root and util-linux (unshare, mount)"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, check=False)
    return None if probe.returncode == 0 else f"unshare -m is not permitted here: {probe.stderr.decode()[:200]}"


@pytest.fixture()
def node(tmp_path: Path) -> dict[str, Path]:
    """Instance m installed and kept as revision 1 (one engine; `_installed`), a stand-in systemctl that says it
    runs, and the executables its unit would run."""
    reason = _read_only_unavailable()
    if reason:
        pytest.skip(reason)
    tiny = write_tiny_model(tmp_path / "tiny-llama")
    settings, _, _ = _installed(tiny, tmp_path, replicas=1)
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("vllm", "npuops"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    calls = tmp_path / "systemctl.calls"
    systemctl = tmp_path / "systemctl3.py"
    systemctl.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = show ] && echo ActiveState=active\nexit 0\n')
    systemctl.chmod(0o755)
    return {"model": tiny, "state": settings.state_dir, "units": settings.unit_dir, "venv": bin_dir.parent,
            "systemctl": systemctl, "calls": calls}


def _run_read_only(node: dict[str, Path], read_only: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NPUOPS_STATE_DIR": str(node["state"]), "NPUOPS_UNIT_DIR": str(node["units"]),
           "NPUOPS_SYSTEMCTL": str(node["systemctl"]), "NPUOPS_VENV": str(node["venv"])}
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", _READ_ONLY, "sh", "1", str(read_only),
            sys.executable, "-m", "npuops", *args]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=300, check=False)


def _files(*roots: Path) -> dict[str, bytes]:
    """Every file but the locks (kept beside the instances by design) and calibration.json (where planning keeps
    this host's measured memory bandwidth, before any launch step)."""
    return {str(p): p.read_bytes() for root in roots for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock") and p.name != "calibration.json"}


def _stops(node: dict[str, Path]) -> list[str]:
    calls = node["calls"].read_text().splitlines() if node["calls"].exists() else []
    return [c for c in calls if c.split()[:1] in (["stop"], ["kill"], ["disable"])]


@pytest.mark.parametrize(("which", "fix"), [("state", "state directory"), ("units", "unit directory")])
def test_a_relaunch_into_a_read_only_dir_leaves_the_running_instance_alone(node: dict[str, Path], which: str,
                                                                           fix: str) -> None:
    before = _files(node["state"], node["units"])
    done = _run_read_only(node, node[which], "launch", str(node["model"]), "--hardware", "cpu", "--name", "m",
                          "--port", "9100", "--max-model-len", "2048", "--kv-cache-memory-bytes", str(256 * 2**20),
                          "--dtype", "float32", "--service-user", "root", "--allow-root",
                          "--vllm", str(node["venv"] / "bin" / "vllm"))
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    (line,) = [e for e in done.stderr.splitlines() if e.startswith("npuops: error:")]
    assert f"cannot write {node[which]}" in line and "read-only file system" in line.lower() and fix in line, line
    assert _stops(node) == []  # the instance running there was not stopped for files that could not land
    assert _files(node["state"], node["units"]) == before


@pytest.mark.parametrize(("which", "fix"), [("state", "state directory"), ("units", "unit directory")])
def test_a_rollout_into_a_read_only_dir_refuses_before_a_replica_stops(node: dict[str, Path], which: str,
                                                                       fix: str) -> None:
    before = _files(node["state"], node["units"])
    done = _run_read_only(node, node[which], "rollout", "m", "--allow-downtime", "--max-num-seqs", "4")
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    (line,) = [e for e in done.stderr.splitlines() if e.startswith("npuops: error:")]
    assert f"cannot write {node[which]}" in line and "read-only file system" in line.lower() and fix in line, line
    assert _stops(node) == []
    assert _files(node["state"], node["units"]) == before
    assert [r.number for r in read_history(node["state"], "m")] == [1]
