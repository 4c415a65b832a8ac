"""`npuops collect` on a serving node under real systemd (tests/support/systemd.py): a bundle of a healthy instance
and of the same instance after its engine crashed (SIGSEGV, restarted by systemd), each with the instance's journal
lines, its diagnosis, its rendered files and unit, a manifest that matches the archive, and none of the secrets
planted in every place one could leak from: the env file (the API key and an --env token), a unit's command line (a
drop-in's ExecStartPost= with --api-key), a journal line about the unit, the engine log and a CANN plog."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tarfile
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_server import free_port
from tests.support.systemd import ServingNode
from tests.systemd.test_lifecycle import status, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.systemd]

NAME = "co"
UNIT = f"npuops-{NAME}.service"
WORK = Path("/srv/npuops-test")


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        assert all(m.isfile() and not m.name.startswith(("/", "..")) for m in tar.getmembers())
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def collect(node: ServingNode, label: str) -> tuple[dict[str, Any], dict[str, bytes], dict[str, Any]]:
    """`npuops collect NAME` inside the node: its summary, the manifest and the files of the bundle."""
    inside = WORK / f"{label}.tar.gz"
    done = node.npuops("collect", NAME, "--since", "1h", "--output", str(inside), "--json", timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    summary = json.loads(done.stdout)
    bundle = node.systemd.root / inside.relative_to("/")
    assert summary["bundle"] == str(inside) and oct(os.stat(bundle).st_mode & 0o777) == "0o600"
    members = _members(bundle)
    manifest = json.loads(members.pop("manifest.json"))
    return summary, members, manifest


def assert_manifest_matches(manifest: dict[str, Any], members: dict[str, bytes]) -> None:
    listed = {f["path"]: f for f in manifest["files"]}
    assert set(listed) == set(members)
    for path, data in members.items():
        assert listed[path]["sha256"] == hashlib.sha256(data).hexdigest() and listed[path]["size"] == len(data)
        assert listed[path]["source"]
    assert all(s["why"] for s in manifest["skipped"])


def assert_no_secret(secret_list: list[str], manifest: dict[str, Any], members: dict[str, bytes]) -> None:
    everything = {"manifest.json": json.dumps(manifest).encode(), **members}
    for secret in secret_list:
        for form in (secret, json.dumps(secret)[1:-1], urllib.parse.quote(secret, safe="")):
            leaks = [path for path, data in everything.items() if form.encode() in data]
            assert not leaks, f"{secret!r} in {leaks}"


def test_a_bundle_of_a_healthy_and_a_crashed_instance_holds_its_evidence_and_no_secret(serving_node: ServingNode
                                                                                       ) -> None:
    node = serving_node
    root = node.systemd.root
    key, token = "sk-npuops-" + secrets.token_hex(16), "hf_" + secrets.token_hex(12)
    key_file = root / WORK.relative_to("/") / "collect.key"
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    dropin = root / f"etc/systemd/system/{UNIT}.d/zz-collect-test.conf"
    port = free_port()
    try:
        done = node.launch(NAME, port, "--api-key-file", str(WORK / "collect.key"), "--env", f"HF_TOKEN={token}",
                           "--json")
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
        # The secrets where they could leak from, beside the env file that holds them.
        dropin.parent.mkdir(parents=True, exist_ok=True)
        dropin.write_text(f"[Service]\nExecStartPost=/bin/true --api-key {key}\n")
        node.systemd.check(["systemctl", "daemon-reload"])
        assert key in node.systemd.check(["systemctl", "show", UNIT, "--property=ExecStartPost"])
        node.systemd.check(["logger", "--journald"], input_text=(
            f"MESSAGE=a client sent Authorization: Bearer {key} with {token}\nOBJECT_SYSTEMD_UNIT={UNIT}\n"))
        wait_for("the planted journal line", lambda: key in node.systemd.check(
            ["journalctl", "--unit", UNIT, "--no-pager", "--output", "cat"]), 30)
        state_dir = root / f"var/lib/npuops-{NAME}"
        with open(state_dir / "engine.log", "a") as log:
            log.write(f"INFO request from a client with key {key}\n")
        plog = root / "root/ascend/log/debug/plog/plog-4242_20261205.log"
        plog.parent.mkdir(parents=True, exist_ok=True)
        plog.write_text(f"[INFO] RUNTIME(4242) token={token} api key {key}\n")

        summary, members, manifest = collect(node, "healthy")
        assert_manifest_matches(manifest, members)
        assert_no_secret([key, token], manifest, members)
        assert summary["files"] == len(members) and manifest["instances"] == [NAME]
        base = f"instances/{NAME}"
        for part in ("node.json", "doctor.json", f"{base}/status.json", f"{base}/units/{UNIT}",
                     f"{base}/files/vllm.yaml", f"{base}/files/env", f"{base}/status-report.json",
                     f"{base}/journal-{UNIT}.log", f"{base}/systemctl-show-{UNIT}.txt", f"{base}/engine.log",
                     "ascend-logs/root/debug/plog/plog-4242_20261205.log", "system/pip-freeze.txt"):
            assert part in members, (part, sorted(members))
        # The secrets' places are in the bundle, redacted where the secret stood.
        assert b'VLLM_API_KEY="[REDACTED]"' in members[f"{base}/files/env"]
        assert b'HF_TOKEN="[REDACTED]"' in members[f"{base}/files/env"]
        assert b"--api-key [REDACTED]" in members[f"{base}/systemctl-show-{UNIT}.txt"]
        journal = members[f"{base}/journal-{UNIT}.log"].decode()
        assert "Authorization: Bearer [REDACTED]" in journal and "Started" in journal
        assert b"api key [REDACTED]" in members["ascend-logs/root/debug/plog/plog-4242_20261205.log"]
        assert UNIT.encode() in members["system/journal-npuops-units.log"]
        assert json.loads(members["node.json"])["host"]["hostname"]
        assert json.loads(members[f"{base}/status-report.json"])["state"] == "healthy"
        # npu-smi is not on this node: said, not silently left out.
        assert any(s["what"] == "npu-smi/info.txt" and "not installed" in s["why"] for s in manifest["skipped"])

        # The engine crashes; systemd restarts it; the next bundle holds the crash and its diagnosis.
        before = int(node.systemd.unit_property(UNIT, "NRestarts"))
        engine = json.loads((state_dir / "supervisor.json").read_text())["engine_pid"]
        node.systemd.check(["kill", "-SEGV", str(engine)])
        wait_for("the restart", lambda: int(node.systemd.unit_property(UNIT, "NRestarts")) > before, 120)
        wait_for("the crash's diagnosis", lambda: ((status(node, NAME).get("previous_exit") or {})
                                                   .get("diagnosis") or {}).get("id"), 120, poll=2)
        _summary, members, manifest = collect(node, "crashed")
        assert_manifest_matches(manifest, members)
        assert_no_secret([key, token], manifest, members)
        crashed = json.loads(members[f"{base}/status.json"])  # the supervisor's own file
        assert crashed["previous_exit"]["diagnosis"]["id"] == "signal-sigsegv", crashed["previous_exit"]
        report = json.loads(members[f"{base}/status-report.json"])
        assert report["previous_exit"]["diagnosis"]["id"] == "signal-sigsegv"
        journal = members[f"{base}/journal-{UNIT}.log"].decode()
        assert "SIGSEGV" in journal or "signal-sigsegv" in journal, journal[-3000:]
    finally:
        dropin.unlink(missing_ok=True)
        node.systemd.run(["systemctl", "daemon-reload"])
        node.npuops("remove", NAME, "--force", timeout=300)
