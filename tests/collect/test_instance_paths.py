"""Where collect and profile look for an instance's files and units: derived from the state dir, its name and the
settings exactly as launch placed them, whatever its record says (npuops/support/instance_paths.py); and a fleet
bundle built from what other hosts send, read in bounded memory and under names that cannot climb."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from npuops.instance.membership import ClusterMembership
from npuops.instance.record import MANAGER_FOREGROUND, MANAGER_SYSTEMD, ROLE_RAY_WORKER, ROLE_REPLICAS, ROLE_ROUTER
from npuops.launch import instance_files
from npuops.launch.multinode import ray_unit_name
from npuops.settings import Settings
from npuops.support.bundle import Bundle
from npuops.support.fleet_collect import _merge
from npuops.support.instance_paths import PROFILES_DIR, confined_record, instance_paths
from npuops.support.redact import Redactor
from tests.support.instance_records import make_record


@pytest.mark.parametrize("manager", [MANAGER_SYSTEMD, MANAGER_FOREGROUND])
def test_the_paths_are_launchs_whatever_the_record_says(tmp_path: Path, manager: str) -> None:
    settings = Settings(state_dir=tmp_path / "state", service_data_root=tmp_path / "var")
    spec = instance_files.LaunchSpec(name="demo", state_dir=settings.state_dir,
                                     service_data_root=settings.service_data_root, manager=manager, profiling=True)
    # A record whose own paths and unit name other places: none of them is used.
    record = make_record(settings.state_dir, "demo", manager=manager, instance_dir="/etc",
                         status_file="/etc/shadow", unit="../../etc/passwd")
    paths = instance_paths(settings, "demo", record)
    assert str(paths.instance_dir) == str(settings.state_dir / "demo")
    assert str(paths.status_dir) == str(instance_files._status_dir(spec, "demo"))
    profiler = instance_files._profiler_config(spec, "demo")
    assert profiler is not None and str(paths.profiles) == profiler["torch_profiler_dir"]
    assert PROFILES_DIR == instance_files.PROFILES_DIR
    assert paths.units == ("npuops-demo.service",)
    confined = confined_record(record, paths)
    assert (confined.instance_dir, confined.status_file, confined.unit) == (
        str(paths.instance_dir), str(paths.status_file), "npuops-demo.service")


def test_each_role_has_the_units_launch_gives_it(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    ray = ClusterMembership("g", "ray", 0, "head", (), "h", ray_unit="npuops-x-ray.service")
    engine = make_record(tmp_path, "demo", unit="evil.service")
    cases = {ROLE_ROUTER: ("npuops-demo-router.service",), ROLE_RAY_WORKER: (ray_unit_name("demo"),),
             ROLE_REPLICAS: ()}
    for role, units in cases.items():
        assert instance_paths(settings, "demo", replace(engine, role=role)).units == units
    with_ray = instance_paths(settings, "demo", replace(engine, cluster=ray))
    assert with_ray.units == (ray_unit_name("demo"), "npuops-demo.service")
    assert confined_record(replace(engine, cluster=ray), with_ray).ray_unit == ray_unit_name("demo")
    assert instance_paths(settings, "demo", None).units == ("npuops-demo.service",)


def _host_bundle(path: Path, members: dict[str, bytes], *, claimed: dict[str, int] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = (claimed or {}).get(name, len(data))
            tar.addfile(info, io.BytesIO(data + b"\0" * max(0, info.size - len(data))))
    return path


def test_what_another_host_sends_is_bounded_and_named_safely(tmp_path: Path) -> None:
    manifest = json.dumps({"host": "h", "files": [{"path": "a\x1b[2Jb.log", "source": "x"}],
                           "skipped": [{"what": "evil\nname", "why": "why\x1b"}]}).encode()
    good = _host_bundle(tmp_path / "good.tar.gz", {"manifest.json": manifest, "a\x1b[2Jb.log": b"line\n"})
    bundle = Bundle(Redactor(), bundle_cap=2**20)
    part = _merge(bundle, "node1", good)
    assert part.status == "ok"
    assert "hosts/node1/a\\x1b[2Jb.log" in {f.path for f in bundle.files}
    assert {s.what for s in bundle.skipped} == {"hosts/node1/evil\\nname"}
    # More than the bundle can hold, declared by a host: refused before it is read.
    big = _host_bundle(tmp_path / "big.tar.gz", {"manifest.json": manifest, "huge.log": b""},
                       claimed={"huge.log": 4 * 2**20})
    assert _merge(Bundle(Redactor(), bundle_cap=2**20), "node2", big).status == "failed"
    # A host whose name would climb out of hosts/: said, not a traceback.
    climbed = _merge(Bundle(Redactor()), "..", good)
    assert climbed.status == "failed" and "inventory" in climbed.fix
    not_gzip = tmp_path / "junk.tar.gz"
    not_gzip.write_bytes(b"\x1f\x8b\x08junk")
    assert _merge(Bundle(Redactor()), "node3", not_gzip).status == "failed"
