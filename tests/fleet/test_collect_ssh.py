"""`npuops collect -i INVENTORY --group G` for real: two SSH test hosts (tests/support/ssh_hosts.py), each with an
Ascend install made of recorded files (npu-smi and hccn_tool replaying recorded outputs) and a CANN plog holding a
planted API key; one bundle comes back with both hosts' parts and their manifests, and the key in none of it."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.fleet.test_fleet_doctor_ssh import NPUOPS, TOOLKIT_83RC2, StartFleet, install_ascend, put_on_host
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

PLOG = "/root/ascend/log/debug/plog/plog-7_20261205.log"


def test_one_bundle_holds_every_hosts_part_and_no_secret(ssh_fleet: StartFleet, tmp_path: Path) -> None:
    fleet = ssh_fleet(2)
    key = "sk-npuops-" + secrets.token_hex(16)
    for name in fleet.names:
        install_ascend(fleet, name, TOOLKIT_83RC2)
        put_on_host(fleet, name, PLOG, f"[ERROR] HCCL(7) on {name}: VLLM_API_KEY={key}\n"
                                       f"[INFO] request header Authorization: Bearer {key}\n")
    inventory = fleet.inventory_path(group_vars={"npuops_command": str(NPUOPS)})
    out = tmp_path / "fleet.tar.gz"
    proc = subprocess.run([sys.executable, "-m", "npuops", "collect", "-i", str(inventory), "--group", "fleet",
                           "--artifacts", str(tmp_path / "artifacts"), "--since", "1h", "--output", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=900, check=False)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    # The human summary, and each host's progress on stderr as the playbook ran.
    assert f"bundle: {out}" in proc.stdout
    for name in fleet.names:
        assert f"{name}: ok" in proc.stdout and name in proc.stderr, (proc.stdout, proc.stderr[-3000:])

    with tarfile.open(out) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    manifest = json.loads(members.pop("manifest.json"))
    listed = {f["path"]: f for f in manifest["files"]}
    assert set(listed) == set(members)
    assert all(listed[p]["sha256"] == hashlib.sha256(d).hexdigest() for p, d in members.items())
    assert [h["host"] for h in manifest["hosts"]] == sorted(fleet.names)
    for name in fleet.names:
        part = f"hosts/{name}"
        assert json.loads(members[f"{part}/node.json"])["host"]["hostname"] == name
        host_manifest = json.loads(members[f"{part}/manifest.json"])
        assert host_manifest["host"] == name and host_manifest["files"]
        # Its vendor tools' outputs (the recorded ones the host's tools replay) and its CANN log, redacted there.
        assert b"910B3" in members[f"{part}/npu-smi/info.txt"]
        assert f"{part}/hccn_tool/link-0.txt" in members and f"{part}/doctor.json" in members
        plog = members[f"{part}/ascend-logs/root/debug/plog/plog-7_20261205.log"]
        assert b"VLLM_API_KEY=[REDACTED]" in plog and b"Bearer [REDACTED]" in plog
    leaks = [p for p, d in {**members, "manifest.json": json.dumps(manifest).encode()}.items() if key.encode() in d]
    assert not leaks, leaks
