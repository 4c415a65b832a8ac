"""A group rollout's pieces without hosts: which files a host switches and the URLs the router knows them by, the
weights manifest, the controller's revision store, what `rollout -i/--group` refuses, and the host-side switch
from staged files. The host-by-host rollout itself runs over two SSH hosts under their own systemd
(tests/systemd/test_group_launch.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from npuops.errors import BadInputError
from npuops.instance.revisions import LaunchOrigin, read_history, stored_launch
from npuops.launch.group_rollout import replica_files, replica_urls, weights_manifest
from npuops.launch.instance_files import LaunchSpec
from npuops.launch.multinode import ClusterHost, render_replica_group
from npuops.launch.revision_store import group_store, keep_group_revision
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.router import RouterOptions
from npuops.plan.target import cpu_target
from tests.support.model_dirs import write_tiny_model
from tests.support.paths import REPO


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny-llama")


def _parts(tiny: Path) -> list:  # type: ignore[type-arg]
    plan = make_plan(load_model(str(tiny)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", replicas=2))
    hosts = [ClusterHost("a", "10.0.0.1", "eth0"), ClusterHost("b", "10.0.0.2", "eth0")]
    return render_replica_group(plan, RouterOptions(policy="round_robin"), LaunchSpec(name="g", port=9200), hosts,
                                unit_dir=Path("/etc/systemd/system"))


def test_a_host_switches_its_replicas_files_and_leaves_the_router_and_its_record(tiny: Path) -> None:
    first, second = _parts(tiny)
    files = replica_files(first, "g")
    assert sorted(files) == ["g-r0", "g-r1"]
    assert sorted(f.path.name for f in files["g-r0"]) == ["env", "instance.json", "npuops-g-r0.service",
                                                         "vllm.yaml"]
    everything = {str(f.path) for f in first.files}
    assert "/etc/npuops/g/router.json" in everything and "/etc/systemd/system/npuops-g-router.service" in everything
    assert replica_urls(files) == ["http://10.0.0.1:9201", "http://10.0.0.1:9202"]
    # Exactly the URLs the router was launched with, host by host.
    assert [*replica_urls(files), *replica_urls(replica_files(second, "g"))] == list(first.record.backends)
    assert sorted(replica_files(second, "g")) == ["g-r0", "g-r1"]


def test_the_weights_manifest_is_every_file_and_its_sha256(tiny: Path) -> None:
    (tiny / "sub").mkdir()
    (tiny / "sub" / "extra.json").write_text("{}")
    manifest = weights_manifest(tiny)
    assert sorted(manifest) == ["config.json", "model.safetensors", "sub/extra.json"]
    assert manifest["sub/extra.json"] == hashlib.sha256(b"{}").hexdigest()
    with pytest.raises(BadInputError, match="does not exist on this controller"):
        weights_manifest(tiny / "nosuch")


def test_the_controller_keeps_a_group_instances_revisions(tmp_path: Path) -> None:
    store = group_store(tmp_path / "artifacts", "fleet_a")
    assert store == tmp_path / "artifacts" / "revisions" / "fleet_a"
    origin = LaunchOrigin({"model": "/m"}, {"name": "g"}, "launch", ("launch of /m over fleet_a",))
    keep_group_revision(store, "g", 1, origin, "/m", "m", ["a", "b"])
    keep_group_revision(store, "g", 2, LaunchOrigin({"model": "/n"}, {}, "rollout", ("model: /m -> /n",)), "/n",
                        "m", ["a", "b"])
    assert [(r.number, r.outcome, r.parts) for r in read_history(store, "g")] == [
        (1, "superseded", ("a", "b")), (2, "serving", ("a", "b"))]
    assert stored_launch(store, "g", 1) == {"request": {"model": "/m"}, "choices": {"name": "g"}}
    with pytest.raises(BadInputError, match="not usable for the revision store"):
        group_store(tmp_path, "../etc")


def _npuops(*args: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NPUOPS_STATE_DIR": str(state_dir)}
    return subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=120)


def test_group_flags_are_checked_in_one_line(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  children:\n    fleet:\n      hosts:\n        a: {}\n")
    for args, said in [(("g", "-i", str(inventory)), "-i/--inventory and --group go together"),
                       (("g", "--weights-shared"), "--weights-shared is for a group rollout"),
                       (("g", "-i", str(inventory), "--group", "fleet", "--undo"), "a group rollout switches"),
                       (("g", "-i", str(inventory), "--group", "fleet", "--artifacts", str(tmp_path / "art")),
                        "no revision of g over fleet is kept on this controller")]:
        done = _npuops("rollout", *args, state_dir=tmp_path / "state")
        assert done.returncode != 0 and said in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)


def test_a_host_that_holds_only_replicas_switches_from_staged_files_only(tiny: Path, tmp_path: Path) -> None:
    """A host of a group (its record of the instance is a replica set) is rolled by the group's playbook from the
    files it staged; a plain local rollout there is refused, naming the group command."""
    from npuops.instance.manager import SystemdManager
    from npuops.launch.install import install
    from npuops.launch.local import Reporter
    from npuops.launch.rollout import RolloutRequest, rollout_instance
    from npuops.settings import Settings
    from tests.support.instance_records import make_record

    state, units, run = tmp_path / "etc", tmp_path / "units", tmp_path / "run"
    run.mkdir()
    manager = SystemdManager(["/bin/true"], units, run_dir=run)
    settings = Settings(state_dir=state, unit_dir=units)
    replica_set = make_record(state, "g", role="replicas", unit="", replicas=("g-r0",), port=9200)
    replica = make_record(state, "g-r0", behind="g", port=9201)
    from npuops.launch.instance_files import InstanceFiles, RenderedFile

    def files_of(record):  # type: ignore[no-untyped-def]
        text = json.dumps(record.to_json())
        unit = [RenderedFile(record.unit, "[Service]\n", 0o644)] if record.unit else []
        return InstanceFiles(record.name, (RenderedFile("instance.json", text, 0o644),
                                           RenderedFile("vllm.yaml", "", 0o644), RenderedFile("env", "", 0o600),
                                           *unit), record.unit, record)

    for record in (replica_set, replica):
        (state / record.name).mkdir(parents=True)
        for f in files_of(record).files:
            (state / record.name / f.name).write_text(f.text)
    install([files_of(replica)], state, manager)
    with pytest.raises(BadInputError) as refused:
        rollout_instance(settings, manager, RolloutRequest(name="g", allow_downtime=True), Reporter(True))
    assert "one host's part of a group's instance" in refused.value.problem and "--group" in refused.value.fix
    for staged in (tmp_path / "empty", tmp_path / "incoming"):
        (staged / ("g-r0" if staged.name == "incoming" else "")).mkdir(parents=True)
        with pytest.raises(BadInputError, match="holds no part's files"):
            rollout_instance(settings, manager, RolloutRequest(name="g", from_files=staged, revision=2,
                                                               allow_downtime=True), Reporter(True))
