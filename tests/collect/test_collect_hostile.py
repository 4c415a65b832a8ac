"""`npuops collect` runs as root over what the engine's service user can write (its state dir, engine.log, CANN's
logs): a link to another file, a FIFO, a sparse log of hundreds of MiB, and a record whose paths name other places
must neither leak, nor block, nor blow up memory, nor traceback (issue 45, finding 2). Every file of every instance
teaches the redactor its secrets, kept revisions included."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.instance.record import write_record
from npuops.safefiles import ConfinedPath, printable
from npuops.settings import Settings
from npuops.support.bundle import Bundle, read_bundle
from npuops.support.collect import CollectRequest, NodeCollector, collect_node, parse_since
from tests.support.instance_records import make_record
from tests.support.npuops_cli import npuops_argv

MIB = 2**20


class Node:
    """A node tree for collect: the state dir, the service data root (/var/lib), the host root and unit dir."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.root, self.state, self.var = tmp_path / "root", tmp_path / "state", tmp_path / "var-lib"
        self.units = tmp_path / "units"
        for d in (self.root, self.state, self.var, self.units):
            d.mkdir()
        # What only root may read: the target of every planted link.
        self.shadow = tmp_path / "shadow"
        self.shadow_text = "root:$6$" + secrets.token_hex(16) + ":19000:0:99999:7:::\n"
        self.shadow.write_text(self.shadow_text)
        self.shadow.chmod(0o600)

    def settings(self) -> Settings:
        return Settings(root=self.root, state_dir=self.state, service_data_root=self.var, unit_dir=self.units,
                        stack_python=sys.executable)

    def env(self) -> dict[str, str]:
        return {"NPUOPS_ROOT": str(self.root), "NPUOPS_STATE_DIR": str(self.state),
                "NPUOPS_SERVICE_DATA_ROOT": str(self.var), "NPUOPS_UNIT_DIR": str(self.units),
                "NPUOPS_STACK_PYTHON": sys.executable, "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(self.tmp)}

    def instance(self, name: str = "demo", **overrides: Any) -> Path:
        """A systemd instance as launch installs it; returns its status dir (the service's StateDirectory)."""
        status_dir = self.var / f"npuops-{name}"
        status_dir.mkdir(parents=True, exist_ok=True)
        record = make_record(self.state, name, status_file=str(status_dir / "supervisor.json"), **overrides)
        write_record(record)
        (self.state / name / "env").write_text('HF_HUB_OFFLINE="1"\n')
        (self.state / name / "vllm.yaml").write_text('model: "/models/tiny"\n')
        (status_dir / "supervisor.json").write_text(json.dumps({"supervisor_pid": 1, "stage": "healthy"}))
        (self.units / f"npuops-{name}.service").write_text("[Service]\nExecStart=/bin/true\n")
        return status_dir

    def collect(self, *names: str) -> Bundle:
        return collect_node(self.settings(), CollectRequest(names, parse_since("2h")))


def everything(bundle: Bundle) -> bytes:
    return b"\n".join([json.dumps(bundle.manifest()).encode(), *(bundle.data(f.path) for f in bundle.files)])


def skipped(bundle: Bundle) -> dict[str, str]:
    return {s.what: s.why for s in bundle.skipped}


def test_links_to_another_file_are_left_out_with_why(tmp_path: Path) -> None:
    node = Node(tmp_path)
    status_dir = node.instance()
    (status_dir / "engine.log").symlink_to(node.shadow)
    plog = node.root / "root/ascend/log/debug/plog"
    plog.mkdir(parents=True)
    (plog / "plog-1_1.log").symlink_to(node.shadow)
    (plog / "plog-2_1.log").write_text("[ERROR] a real plog line\n")
    # A directory link inside a log tree and inside the instance dir: never entered.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "copy").write_text(node.shadow_text)
    (node.root / "root/ascend/log/run").mkdir()
    (node.root / "root/ascend/log/run/plog").symlink_to(elsewhere)
    (node.state / "demo" / "bench").symlink_to(elsewhere)

    bundle = node.collect("demo")
    assert node.shadow_text.split(":")[1].encode() not in everything(bundle)
    why = skipped(bundle)
    assert "symbolic link" in why["instances/demo/engine.log"]
    assert "symbolic link" in why["ascend-logs/root/debug/plog/plog-1_1.log"]
    assert "symbolic link" in why["ascend-logs/root/run/plog"]
    assert "symbolic link" in why["instances/demo/files/bench"]
    paths = {f.path for f in bundle.files}
    assert {"ascend-logs/root/debug/plog/plog-2_1.log", "instances/demo/status.json",
            "instances/demo/files/instance.json"} <= paths


def test_a_fifo_named_engine_log_does_not_block_collect(tmp_path: Path) -> None:
    node = Node(tmp_path)
    status_dir = node.instance()
    os.mkfifo(status_dir / "engine.log")
    os.mkfifo(status_dir / "supervisor.json.tmp")
    (node.root / "root/ascend/log/debug/plog").mkdir(parents=True)
    os.mkfifo(node.root / "root/ascend/log/debug/plog/plog-9_9.log")
    output = tmp_path / "bundle.tar.gz"
    try:
        done = subprocess.run(npuops_argv("collect", "demo", "--output", str(output), "--json"), env=node.env(),
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("collect blocked on a FIFO")
    assert done.returncode == 0, done.stderr[-3000:]
    manifest, _files = read_bundle(output)
    why = {s["what"]: s["why"] for s in manifest["skipped"]}
    assert "FIFO" in why["instances/demo/engine.log"]
    assert "FIFO" in why["ascend-logs/root/debug/plog/plog-9_9.log"]


def test_a_512_mib_log_keeps_its_last_8_mib_in_bounded_memory(tmp_path: Path) -> None:
    node = Node(tmp_path)
    status_dir = node.instance()
    log = status_dir / "engine.log"
    tail = b"".join(b"INFO line %08d of the log's end\n" % i for i in range(400_000))  # ~12 MiB of lines
    with open(log, "wb") as handle:
        handle.truncate(512 * MIB - len(tail))  # sparse: no disk, and no memory unless someone reads it whole
        handle.seek(0, os.SEEK_END)
        handle.write(tail)
    assert log.stat().st_size == 512 * MIB
    output = tmp_path / "bundle.tar.gz"
    # The peak RSS of collect (and of what it runs) alone: a child that runs it and reports its children's usage.
    measure = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True); "
               "sys.stderr.buffer.write(done.stderr); "
               "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", measure,
                           *npuops_argv("collect", "demo", "--output", str(output), "--json")],
                          env=node.env(), capture_output=True, text=True, timeout=600)
    rc, peak_kib = (int(v) for v in done.stdout.split())
    assert rc == 0, done.stderr[-3000:]
    assert peak_kib < 200 * 1024, f"collect's peak RSS was {peak_kib // 1024} MiB"
    manifest, files = read_bundle(output)
    kept = files["instances/demo/engine.log"]
    assert kept.startswith(b"[... cut by npuops collect") and kept.endswith(tail[-MIB:])
    assert len(kept) <= 8 * MIB + 200
    # The kept part begins with a whole line.
    assert kept.split(b"\n", 2)[1].startswith(b"INFO line ")
    entry = next(f for f in manifest["files"] if f["path"] == "instances/demo/engine.log")
    assert entry["truncated"] is True


def test_paths_in_a_record_pull_nothing_from_elsewhere(tmp_path: Path) -> None:
    node = Node(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "supervisor.json").write_text(node.shadow_text)
    (elsewhere / "engine.log").write_text(node.shadow_text)
    (elsewhere / "env").write_text(node.shadow_text)
    (elsewhere / "evil.service").write_text(node.shadow_text)
    climbing = "../" * 12 + str(elsewhere).lstrip("/")
    node.instance()
    data = json.loads((node.state / "demo" / "instance.json").read_text())
    data.update(instance_dir=str(elsewhere), status_file=f"/var/lib/{climbing}/supervisor.json",
                unit=f"{climbing}/evil.service", name="../../../" + str(elsewhere).lstrip("/"))
    (node.state / "demo" / "instance.json").write_text(json.dumps(data))
    (node.state / "demo" / "revisions").mkdir()

    bundle = node.collect()
    assert node.shadow_text.split(":")[1].encode() not in everything(bundle)
    paths = {f.path for f in bundle.files}
    assert all(p.startswith(("instances/demo/", "ascend-logs/", "system/", "node.json", "doctor.json", "kernel"))
               or "/" not in p for p in paths), sorted(paths)
    # Its own files, where npuops put them, are in.
    assert {"instances/demo/status.json", "instances/demo/files/instance.json",
            "instances/demo/units/npuops-demo.service"} <= paths
    assert bundle.meta["instances"] == ["demo"]


def test_every_kept_revision_and_record_teaches_the_redactor(tmp_path: Path) -> None:
    node = Node(tmp_path)
    status_dir = node.instance()
    old_token, new_token = "hf_" + secrets.token_hex(12), "hf_" + secrets.token_hex(12)
    other_key = "sk-other-" + secrets.token_hex(8)
    (node.state / "demo" / "env").write_text(f'HF_TOKEN="{new_token}"\n')
    # The token before a rollout rotated it: revision 1's env file and its launch.json (the --env it was given).
    rev = node.state / "demo" / "revisions" / "1"
    (rev / "demo").mkdir(parents=True)
    (rev / "demo" / "env").write_text(f'HF_TOKEN="{old_token}"\n')
    (rev / "launch.json").write_text(json.dumps({"choices": {"extra_env": {"HF_TOKEN": old_token}}}))
    # Another instance, not asked for: its key may still be in the node-wide journal.
    node.instance("other")
    (node.state / "other" / "env").write_text(f"VLLM_API_KEY={other_key}\n")
    (status_dir / "engine.log").write_text(f"loaded with {old_token} then {new_token}; peer {other_key}\n")

    bundle = node.collect("demo")
    blob = everything(bundle)
    for secret in (old_token, new_token, other_key):
        assert secret.encode() not in blob, secret
    assert bundle.data("instances/demo/engine.log").count(b"[REDACTED]") == 3


names = st.binary(min_size=1, max_size=40).filter(lambda b: b"/" not in b and b"\0" not in b
                                                  and b not in (b".", b".."))


@given(name=names)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_file_name_the_service_user_can_make_lands_escaped_inside_the_bundle(tmp_path: Path, name: bytes) -> None:
    top = tmp_path / "tree"
    shutil.rmtree(top, ignore_errors=True)
    top.mkdir()
    os.close(os.open(os.fsencode(top) + b"/" + name, os.O_WRONLY | os.O_CREAT, 0o644))
    os.symlink(b"/etc/hostname", os.fsencode(top) + b"/" + name + b".link")
    collector = NodeCollector(Settings(state_dir=tmp_path / "no-state"), CollectRequest())
    collector._tree("ascend-logs/root", ConfinedPath(top))
    written = collector.bundle.write(tmp_path / "b.tar.gz")
    manifest, files = read_bundle(written)
    shown = {path.removeprefix("ascend-logs/root/") for path in files}
    assert shown == {printable(os.fsdecode(name))}
    assert all(p.isprintable() for p in [*files, *(s["what"] for s in manifest["skipped"])])
    assert [s["what"] for s in manifest["skipped"]] == [f"ascend-logs/root/{printable(os.fsdecode(name + b'.link'))}"]
