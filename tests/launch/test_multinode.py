"""One multi-node instance rendered host by host (npuops.launch.multinode) and the pure parts of the group launch
(npuops.launch.group): which files and units each host gets, their per-host environment, the Ray commands, the
data-parallel flags, the serving interface of each host, staging and --dry-run output, and systemd-analyze on
every rendered unit."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from npuops.envfile import parse_env_file
from npuops.errors import BadInputError, ConfigError
from npuops.fleet.inventory import InventoryHost
from npuops.hardware.node import Node
from npuops.instance.record import InstanceRecord
from npuops.launch.group import (
    ADDRESS_VAR,
    IFNAME_VAR,
    check_same_hardware,
    choose_serving_interface,
    dump_parts,
    launch_extravars,
    network_peers,
    stage_files,
)
from npuops.launch.instance_files import LaunchSpec
from npuops.launch.multinode import (
    ClusterHost,
    HostPart,
    PlacedFile,
    host_environment,
    ray_runtime_directory,
    ray_unit_name,
    render_cluster,
)
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.result import Plan
from npuops.plan.target import cpu_target, parse_hardware_spec
from npuops.service.gate import peer_group
from tests.support.model_dirs import TINY_LLAMA

UNIT_DIR = Path("/etc/systemd/system")
RAY = ("/opt/npuops/venv/bin/ray",)
NPUOPS = "/opt/npuops/venv/bin/npuops"
HOSTS = (ClusterHost("node-head", "10.0.0.1", "eth0"), ClusterHost("node-two", "10.0.0.2", "ens5"))
ASCEND_ENV = Path("/etc/npuops/ascend.env")


def _plan(model_dir: Path, name: str, **options: Any) -> Plan:
    # A catalog model pointed at a directory: launch refuses catalog names, and the plan keeps the catalog's size.
    model = replace(load_model(name), path=model_dir)
    return make_plan(model, parse_hardware_spec("910B3x8", nodes=2), Workload(1024, 256), PlanOptions(**options))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model")


@pytest.fixture(scope="module")
def ray_plan(model_dir: Path) -> Plan:
    plan = _plan(model_dir, "llama-3.1-70b", multinode="ray")
    assert plan.cluster is not None and plan.cluster.strategy == "ray" and plan.cluster.nodes == 2
    return plan


@pytest.fixture(scope="module")
def dp_plan(model_dir: Path) -> Plan:
    plan = _plan(model_dir, "qwen3-235b-a22b")
    assert plan.cluster is not None and plan.cluster.strategy == "dp" and plan.cluster.dp_local == 8
    return plan


def _spec(name: str = "demo", **overrides: Any) -> LaunchSpec:
    values: dict[str, Any] = {"name": name, "api_key": "sk-cluster-secret",
                              "ascend_env": {"ASCEND_HOME_PATH": "/usr/local/Ascend/ascend-toolkit/latest"}}
    values.update(overrides)
    return LaunchSpec(**values)


def _render(plan: Plan, spec: LaunchSpec | None = None, hosts: Sequence[ClusterHost] = HOSTS,
            **kwargs: Any) -> list[HostPart]:
    return render_cluster(plan, spec or _spec(), hosts, group="serve", ray_command=RAY, unit_dir=UNIT_DIR,
                          env_files=(ASCEND_ENV,), **kwargs)


def _file(part: HostPart, name: str) -> PlacedFile:
    matches = [f for f in part.files if f.path.name == name]
    assert len(matches) == 1, f"{part.host.name} has {len(matches)} files named {name}"
    return matches[0]


def _exec_start(unit_text: str) -> list[str]:
    line = next(line for line in unit_text.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def _directives(unit_text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit_text.splitlines() if line.startswith(f"{key}=")]


# --- ray ---------------------------------------------------------------------------------------------------------


def test_ray_head_gets_the_engine_and_the_ray_node_in_start_order(ray_plan: Plan) -> None:
    head, _ = _render(ray_plan)
    assert (head.rank, head.role, head.host) == (0, "head", HOSTS[0])
    assert head.units == ("npuops-demo-ray.service", "npuops-demo.service")
    assert {str(f.path): f.mode for f in head.files} == {
        "/etc/npuops/demo/vllm.yaml": 0o644,
        "/etc/npuops/demo/env": 0o600,
        "/etc/npuops/demo/instance.json": 0o644,
        "/etc/systemd/system/npuops-demo.service": 0o644,
        "/etc/npuops/demo/ray.env": 0o600,
        "/etc/systemd/system/npuops-demo-ray.service": 0o644,
    }
    assert head.record.role == "engine" and head.record.unit == "npuops-demo.service"
    assert head.record.units == ["npuops-demo-ray.service", "npuops-demo.service"]
    assert head.to_json()["units"] == list(head.units)
    config = yaml.safe_load(_file(head, "vllm.yaml").text)
    assert config["distributed-executor-backend"] == "ray"
    assert config["tensor-parallel-size"] * config["pipeline-parallel-size"] == 16
    assert "data-parallel-address" not in config and "headless" not in config


def test_ray_worker_gets_only_its_ray_node_and_a_worker_record(ray_plan: Plan) -> None:
    _, worker = _render(ray_plan)
    assert (worker.rank, worker.role) == (1, "worker")
    assert worker.units == ("npuops-demo-ray.service",)
    assert sorted(str(f.path) for f in worker.files) == [
        "/etc/npuops/demo/instance.json", "/etc/npuops/demo/ray.env", "/etc/systemd/system/npuops-demo-ray.service"]
    data = json.loads(_file(worker, "instance.json").text)
    assert data["role"] == "ray-worker" and data["unit"] == "npuops-demo-ray.service"
    record = InstanceRecord.from_json(data, "worker instance.json")
    assert record.role == "ray-worker" and not record.serves_api and not record.runs_engine
    assert record.units == ["npuops-demo-ray.service"]
    assert data["cluster"]["rank"] == 1 and data["cluster"]["role"] == "worker"
    assert data["cluster"]["ray_address"] == "10.0.0.1:6379"
    # Every host's interface goes with it: each host's start gate checks its peers from its own.
    assert data["cluster"]["nodes"] == [{"name": "node-head", "address": "10.0.0.1", "role": "head", "ifname": "eth0"},
                                        {"name": "node-two", "address": "10.0.0.2", "role": "worker", "ifname": "ens5"}]
    assert record.cluster is not None and (record.cluster.rank, record.cluster.role) == (1, "worker")
    assert record == worker.record


def test_every_host_has_its_own_addresses_in_its_environment(ray_plan: Plan) -> None:
    parts = _render(ray_plan)
    for part in parts:
        host = part.host
        envs = [parse_env_file(_file(part, "ray.env").text)]
        if part.rank == 0:
            envs.append(parse_env_file(_file(part, "env").text))
        for env in envs:
            assert env["HCCL_IF_IP"] == env["VLLM_HOST_IP"] == host.address
            assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == env["HCCL_SOCKET_IFNAME"] == host.ifname
            assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
            assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
            assert env["ASCEND_HOME_PATH"] == "/usr/local/Ascend/ascend-toolkit/latest"
    head_engine = parse_env_file(_file(parts[0], "env").text)
    assert head_engine["RAY_ADDRESS"] == "10.0.0.1:6379"
    for part in parts:
        assert "RAY_ADDRESS" not in parse_env_file(_file(part, "ray.env").text)


def test_the_api_key_stays_out_of_the_ray_nodes(ray_plan: Plan) -> None:
    parts = _render(ray_plan, _spec(api_key="sk-never-in-ray"))
    assert parse_env_file(_file(parts[0], "env").text)["VLLM_API_KEY"] == "sk-never-in-ray"
    for part in parts:
        assert "VLLM_API_KEY" not in parse_env_file(_file(part, "ray.env").text)
        for f in part.files:
            if f.path.name != "env":
                assert "sk-never-in-ray" not in f.text, f"{part.host.name}:{f.path}"


def test_host_environment_without_ray_leaves_the_device_mask_alone() -> None:
    host = ClusterHost("n", "192.0.2.7", "bond0")
    assert host_environment(host, ray=False) == {
        "HCCL_IF_IP": "192.0.2.7", "VLLM_HOST_IP": "192.0.2.7", "GLOO_SOCKET_IFNAME": "bond0",
        "TP_SOCKET_IFNAME": "bond0", "HCCL_SOCKET_IFNAME": "bond0"}
    assert host_environment(host, ray=True)["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"


def test_the_engine_unit_needs_the_ray_node(ray_plan: Plan) -> None:
    head, _ = _render(ray_plan)
    unit = _file(head, "npuops-demo.service").text
    assert _directives(unit, "Requires") == ["npuops-demo-ray.service"]
    assert "npuops-demo-ray.service" in _directives(unit, "After")
    # One /tmp for the engine and the Ray node (vLLM's IPC sockets between the executor and this host's workers):
    # both private to the pair.
    assert _directives(unit, "JoinsNamespaceOf") == ["npuops-demo-ray.service"]
    assert _directives(unit, "EnvironmentFile") == [f"-{ASCEND_ENV}", "/etc/npuops/demo/env"]
    ray_unit = _file(head, "npuops-demo-ray.service").text
    assert _directives(ray_unit, "EnvironmentFile") == [f"-{ASCEND_ENV}", "/etc/npuops/demo/ray.env"]
    assert not _directives(ray_unit, "Requires")
    assert _directives(unit, "PrivateTmp") == _directives(ray_unit, "PrivateTmp") == ["yes"]


def test_ray_node_commands(ray_plan: Plan) -> None:
    head, worker = _render(ray_plan)
    head_argv = _exec_start(_file(head, "npuops-demo-ray.service").text)
    worker_argv = _exec_start(_file(worker, "npuops-demo-ray.service").text)
    runtime = ray_runtime_directory("demo")
    for argv, address in ((head_argv, "10.0.0.1"), (worker_argv, "10.0.0.2")):
        assert argv[:4] == ["/opt/npuops/venv/bin/ray", "start", "--block", "--node-ip-address"]
        assert argv[4] == address
        assert argv[argv.index("--temp-dir") + 1] == f"/run/{runtime}"
        assert json.loads(argv[argv.index("--resources") + 1]) == {"NPU": 8}
    assert head_argv[head_argv.index("--head"):head_argv.index("--head") + 3] == ["--head", "--port", "6379"]
    assert "--address" not in head_argv
    assert worker_argv[worker_argv.index("--address") + 1] == "10.0.0.1:6379"
    assert "--head" not in worker_argv
    for part in (head, worker):
        assert _directives(_file(part, "npuops-demo-ray.service").text, "RuntimeDirectory") == [runtime]


def test_ray_and_rpc_ports_are_configurable(ray_plan: Plan, dp_plan: Plan) -> None:
    head, worker = _render(ray_plan, ray_port=7000)
    assert "--port" in (argv := _exec_start(_file(head, "npuops-demo-ray.service").text))
    assert argv[argv.index("--port") + 1] == "7000"
    worker_argv = _exec_start(_file(worker, "npuops-demo-ray.service").text)
    assert worker_argv[worker_argv.index("--address") + 1] == "10.0.0.1:7000"
    assert parse_env_file(_file(head, "env").text)["RAY_ADDRESS"] == "10.0.0.1:7000"
    leader, follower = _render(dp_plan, rpc_port=14555)
    for part in (leader, follower):
        assert yaml.safe_load(_file(part, "vllm.yaml").text)["data-parallel-rpc-port"] == 14555


def test_ray_temp_dir_stays_short_for_the_longest_instance_name(ray_plan: Plan) -> None:
    name = "a" * 47 + "z"
    assert len(name) == 48
    parts = _render(ray_plan, _spec(name=name))
    for part in parts:
        argv = _exec_start(_file(part, f"npuops-{name}-ray.service").text)
        temp_dir = argv[argv.index("--temp-dir") + 1]
        assert len(temp_dir) < 40, temp_dir
        assert name not in temp_dir
    assert ray_runtime_directory(name) == ray_runtime_directory(name) != ray_runtime_directory(name[:-1] + "y")
    assert ray_unit_name(name) == f"npuops-{name}-ray.service"


def test_cpu_ray_nodes_ask_for_no_npu(tmp_path: Path) -> None:
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    plan = make_plan(load_model(str(model)), cpu_target(16 * 2**30, 4, 1, nodes=2), Workload(128, 32),
                     PlanOptions(multinode="ray", dtype="float32", enforce_eager=True,
                                 kv_cache_memory_bytes=256 * 2**20))
    parts = render_cluster(plan, _spec(), HOSTS, group="serve", ray_command=RAY, unit_dir=UNIT_DIR)
    for part in parts:
        unit = _file(part, "npuops-demo-ray.service").text
        argv = _exec_start(unit)
        assert "--resources" not in argv
        assert not _directives(unit, "DeviceAllow") and not _directives(unit, "SupplementaryGroups")
        assert _directives(unit, "DevicePolicy") == ["closed"]
        assert _directives(unit, "EnvironmentFile") == ["/etc/npuops/demo/ray.env"]
        env = parse_env_file(_file(part, "ray.env").text)
        assert env["VLLM_HOST_IP"] == part.host.address and "ASCEND_RT_VISIBLE_DEVICES" not in env


# --- dp ----------------------------------------------------------------------------------------------------------


def test_dp_leader_and_headless_follower(dp_plan: Plan) -> None:
    leader, follower = _render(dp_plan)
    assert (leader.role, follower.role) == ("leader", "follower")
    for part in (leader, follower):
        assert part.units == ("npuops-demo.service",)
        assert sorted(f.path.name for f in part.files) == ["env", "instance.json", "npuops-demo.service",
                                                            "vllm.yaml"]
        assert "ray.env" not in [f.path.name for f in part.files]
        env = parse_env_file(_file(part, "env").text)
        assert env["HCCL_IF_IP"] == part.host.address and env["HCCL_SOCKET_IFNAME"] == part.host.ifname
        assert "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES" not in env and "RAY_ADDRESS" not in env
        assert env["HCCL_BUFFSIZE"] == str(dp_plan.cluster.hccl_buffsize_mb)  # type: ignore[union-attr]
        unit = _file(part, "npuops-demo.service").text
        assert not _directives(unit, "Requires")
    lead = yaml.safe_load(_file(leader, "vllm.yaml").text)
    assert lead["data-parallel-address"] == "10.0.0.1"
    assert (lead["data-parallel-size"], lead["data-parallel-size-local"]) == (16, 8)
    assert lead["enable-expert-parallel"] is True
    assert "headless" not in lead and "data-parallel-start-rank" not in lead
    follow = yaml.safe_load(_file(follower, "vllm.yaml").text)
    assert follow["headless"] is True and follow["data-parallel-start-rank"] == 8
    assert follow["data-parallel-address"] == "10.0.0.1"
    assert leader.record.role == "engine" and leader.record.serves_api
    assert follower.record.role == "headless" and follower.record.runs_engine and not follower.record.serves_api
    on_disk = json.loads(_file(follower, "instance.json").text)
    assert on_disk["role"] == "headless" and on_disk["cluster"]["rank"] == 1
    assert on_disk["cluster"]["strategy"] == "dp" and "ray_unit" not in on_disk["cluster"]


def test_bad_host_lists_are_refused(ray_plan: Plan, dp_plan: Plan, model_dir: Path) -> None:
    three = (*HOSTS, ClusterHost("node-three", "10.0.0.3", "eth0"))
    with pytest.raises(BadInputError, match="the plan uses 2 nodes but the group has 3 hosts"):
        _render(ray_plan, hosts=three)
    with pytest.raises(BadInputError, match="the group has 1 hosts"):
        _render(dp_plan, hosts=HOSTS[:1])
    same_address = (HOSTS[0], ClusterHost("node-two", "10.0.0.1", "eth0"))
    with pytest.raises(BadInputError, match="repeat"):
        _render(dp_plan, hosts=same_address)
    same_name = (HOSTS[0], ClusterHost("node-head", "10.0.0.2", "eth0"))
    with pytest.raises(BadInputError, match="repeat"):
        _render(ray_plan, hosts=same_name)
    single = make_plan(replace(load_model("qwen3-8b"), path=model_dir), parse_hardware_spec("910B3x8"),
                       Workload(512, 128), PlanOptions())
    with pytest.raises(BadInputError, match="the plan is for one node"):
        _render(single)


# --- systemd-analyze ---------------------------------------------------------------------------------------------


def _sysroot(root: Path, part: HostPart) -> list[Path]:
    """A root for systemd-analyze with the distribution's units, the executables, and this host's units."""
    (root / "usr/lib/systemd").mkdir(parents=True, exist_ok=True)
    shutil.copytree("/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    for exe in (NPUOPS, RAY[0]):
        path = root / exe.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    units = []
    for f in part.files:
        if f.path.name.endswith(".service"):
            unit = root / "etc/systemd/system" / f.path.name
            unit.parent.mkdir(parents=True, exist_ok=True)
            unit.write_text(f.text)
            units.append(unit)
    return units


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (apt systemd)")
@pytest.mark.parametrize("strategy", ["ray", "dp"])
def test_every_rendered_unit_verifies_and_scores_at_most_2(strategy: str, ray_plan: Plan, dp_plan: Plan,
                                                           tmp_path: Path) -> None:
    parts = _render(ray_plan if strategy == "ray" else dp_plan)
    seen = 0
    for part in parts:
        root = tmp_path / part.host.name
        for unit in _sysroot(root, part):
            seen += 1
            verify = subprocess.run(["systemd-analyze", "verify", "--recursive-errors=yes", f"--root={root}",
                                     str(unit)], capture_output=True, text=True, check=False)
            assert verify.returncode == 0, f"{part.host.name}/{unit.name}: {verify.stderr}"
            assert "Unknown key" not in verify.stderr and "Unknown section" not in verify.stderr
            security = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)],
                                      capture_output=True, text=True, check=False)
            score = re.search(r"Overall exposure level for .*: (\d+\.\d+)", security.stdout)
            assert score, security.stdout[-500:]
            assert float(score.group(1)) <= 2.0, f"{part.host.name}/{unit.name}: exposure {score.group(1)}"
    assert seen == (3 if strategy == "ray" else 2)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (apt systemd)")
def test_verify_catches_a_broken_ray_unit(ray_plan: Plan, tmp_path: Path) -> None:
    """The verification above can fail: a typo'd key in the Ray unit is caught."""
    _, worker = _render(ray_plan)
    unit_file = _file(worker, "npuops-demo-ray.service")
    broken = replace(worker, files=(replace(unit_file, text=unit_file.text.replace("KillMode=", "KilMode=")),))
    (unit,) = _sysroot(tmp_path / "root", broken)
    verify = subprocess.run(["systemd-analyze", "verify", "--recursive-errors=yes", f"--root={tmp_path / 'root'}",
                             str(unit)], capture_output=True, text=True, check=False)
    assert verify.returncode != 0 and "KilMode" in verify.stderr


# --- the serving interface of each host --------------------------------------------------------------------------


def _node(*interfaces: tuple[str, list[str]]) -> Node:
    """A host's node model with these interfaces, as the controller reads it from the host's `npuops node --json`."""
    return Node.from_json({"npu": {}, "host": {"interfaces": [{"name": n, "ipv4": list(a), "up": True}
                                                              for n, a in interfaces]}})


TWO_NICS = _node(("eth0", ["192.168.1.5/24"]), ("ens5", ["10.0.0.1/16", "10.9.0.1/16"]))


def test_the_interface_holding_the_inventory_address() -> None:
    host = InventoryHost("node-head", "10.0.0.1", 22, {})
    assert choose_serving_interface(host, TWO_NICS) == ClusterHost("node-head", "10.0.0.1", "ens5")
    second = InventoryHost("node-head", "10.9.0.1", 22, {})
    assert choose_serving_interface(second, TWO_NICS).ifname == "ens5"


def test_inventory_overrides_win() -> None:
    host = InventoryHost("node-head", "10.0.0.1", 22, {ADDRESS_VAR: "192.168.1.5"})
    assert choose_serving_interface(host, TWO_NICS) == ClusterHost("node-head", "192.168.1.5", "eth0")
    both = InventoryHost("node-head", "10.0.0.1", 22, {ADDRESS_VAR: "172.16.0.9", IFNAME_VAR: "ib0"})
    assert choose_serving_interface(both, TWO_NICS) == ClusterHost("node-head", "172.16.0.9", "ib0")
    ifname_only = InventoryHost("node-head", "10.0.0.1", 22, {IFNAME_VAR: "bond0"})
    assert choose_serving_interface(ifname_only, TWO_NICS) == ClusterHost("node-head", "10.0.0.1", "bond0")


def test_a_dns_name_takes_the_only_interface_with_an_address() -> None:
    node = _node(("eth0", ["192.168.1.5/24"]), ("docker-less", []))
    host = InventoryHost("node-head", "node-head.example", 22, {})
    assert choose_serving_interface(host, node) == ClusterHost("node-head", "192.168.1.5", "eth0")
    # With an interface named, that interface's first address.
    named = InventoryHost("node-head", "node-head.example", 22, {IFNAME_VAR: "ens5"})
    assert choose_serving_interface(named, TWO_NICS) == ClusterHost("node-head", "10.0.0.1", "ens5")


def test_a_dns_name_with_several_interfaces_is_ambiguous() -> None:
    host = InventoryHost("node-head", "node-head.example", 22, {})
    with pytest.raises(BadInputError, match="node-head: cannot tell which address") as err:
        choose_serving_interface(host, TWO_NICS)
    assert ADDRESS_VAR in err.value.fix and IFNAME_VAR in err.value.fix
    named = InventoryHost("node-head", "node-head.example", 22, {IFNAME_VAR: "lo9"})
    with pytest.raises(BadInputError, match="interface lo9 has no IPv4 address"):
        choose_serving_interface(named, TWO_NICS)


def test_no_interface_holds_the_address() -> None:
    host = InventoryHost("node-seven", "10.0.0.7", 22, {})
    with pytest.raises(BadInputError, match=r"host node-seven: no interface holds 10\.0\.0\.7 \(its interfaces: "
                                            r"eth0, ens5\)"):
        choose_serving_interface(host, TWO_NICS)
    with pytest.raises(BadInputError, match=r"node-seven.*none reported"):
        choose_serving_interface(host, _node())


def _chips(count: int, name: str = "910B3", memory_mb: int | None = 65536) -> Node:
    return Node.from_json({"npu": {}, "host": {}, "chips": [
        {"npu_id": i, "chip_id": 0, "name": name, "hbm_total_mb": memory_mb, "memory_total_mb": 15000}
        for i in range(count)]})


def test_same_hardware_on_every_host() -> None:
    assert check_same_hardware({"a": _chips(8), "b": _chips(8)}) == ("910B3", 8, 65536)
    # 310P reports no HBM: the DDR total stands in.
    assert check_same_hardware({"a": _chips(2, "310P3", None)}) == ("310P3", 2, 15000)


def test_differing_hosts_are_named() -> None:
    with pytest.raises(BadInputError, match=r"node-a: 8 x 910B3; node-b: 4 x 910B3"):
        check_same_hardware({"node-a": _chips(8), "node-b": _chips(4)})
    with pytest.raises(BadInputError, match=r"node-b: 0 x no NPU"):
        check_same_hardware({"node-a": _chips(8), "node-b": _chips(0)})
    with pytest.raises(BadInputError, match=r"node-a: 8 x 910B3; node-b: 8 x 910B4"):
        check_same_hardware({"node-a": _chips(8), "node-b": _chips(8, "910B4")})


# --- staging, extravars, --dry-run --------------------------------------------------------------------------------


def test_stage_files_are_private_and_the_manifest_says_where_they_go(ray_plan: Plan, tmp_path: Path) -> None:
    parts = _render(ray_plan)
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "leftover").write_text("old run")
    manifest = stage_files(parts, staging)
    assert not (staging / "leftover").exists()
    assert stat.S_IMODE(staging.stat().st_mode) == 0o700
    assert sorted(manifest) == ["node-head", "node-two"]
    for part in parts:
        assert stat.S_IMODE((staging / part.host.name).stat().st_mode) == 0o700
        entries = manifest[part.host.name]
        assert [e["dest"] for e in entries] == [str(f.path) for f in part.files]
        assert [e["mode"] for e in entries] == [f"{f.mode:04o}" for f in part.files]
        for entry, placed in zip(entries, part.files, strict=True):
            source = Path(entry["src"])
            assert source.parent == staging / part.host.name
            assert stat.S_IMODE(source.stat().st_mode) == 0o600
            assert source.read_text() == placed.text
    modes = {Path(e["dest"]).name: e["mode"] for e in manifest["node-head"]}
    assert modes["env"] == modes["ray.env"] == "0600" and modes["npuops-demo-ray.service"] == "0644"


def test_launch_extravars(ray_plan: Plan, tmp_path: Path) -> None:
    parts = _render(ray_plan)
    manifest = stage_files(parts, tmp_path / "staging")
    nodes = {"node-head": Node.from_json({"npu": {}, "host": {}, "chips": [
                 {"npu_id": 0, "chip_id": 0, "device_id": 0, "nic_ip": "29.1.0.1"}]}),
             "node-two": Node.from_json({"npu": {}, "host": {}, "chips": [
                 {"npu_id": 0, "chip_id": 0, "device_id": 0, "nic_ip": "29.1.0.2"},
                 {"npu_id": 1, "chip_id": 0, "device_id": 1, "nic_ip": None}]})}
    hosts = [InventoryHost("node-head", "192.168.9.1", 22), InventoryHost("node-two", "192.168.9.2", 2222)]
    peers = network_peers(parts, hosts, nodes)
    # Each host checks the others at their serving addresses, from its serving interface, and their NPU NICs.
    assert json.loads(peers["node-two"]) == {"ifname": parts[1].host.ifname, "peers": [
        {"name": "node-head", "address": parts[0].host.address, "port": 22, "npu_ips": {"0": "29.1.0.1"}}]}
    assert json.loads(peers["node-head"])["peers"][0]["port"] == 2222
    extravars = launch_extravars("demo", "serve", parts, manifest, service_user="npuops", cluster_wait_s=300,
                                 ready_wait_s=1800, peers=peers)
    assert extravars == {
        "npuops_peers": peers,
        "npuops_group": "serve", "npuops_instance": "demo", "npuops_first_host": "node-head",
        "npuops_strategy": "ray", "npuops_files": manifest,
        "npuops_units": {"node-head": ["npuops-demo-ray.service", "npuops-demo.service"],
                         "node-two": ["npuops-demo-ray.service"]},
        "npuops_engine_unit": "npuops-demo.service", "npuops_service_user": "npuops",
        "npuops_cluster_wait_s": 300, "npuops_ready_wait_s": 1800,
    }
    json.dumps(extravars)


def test_dump_parts_writes_every_host_with_a_manifest(dp_plan: Plan, tmp_path: Path) -> None:
    parts = _render(dp_plan)
    written = dump_parts(parts, tmp_path / "out")
    for part in parts:
        directory = tmp_path / "out" / part.host.name
        assert written[part.host.name] == [str(directory / f.path.name) for f in part.files]
        manifest = json.loads((directory / "manifest.json").read_text())
        assert manifest == {"host": part.host.name, "role": part.role, "units": list(part.units),
                            "files": {f.path.name: str(f.path) for f in part.files}}
        for f in part.files:
            path = directory / f.path.name
            assert path.read_text() == f.text
            assert stat.S_IMODE(path.stat().st_mode) == f.mode
    assert json.loads((tmp_path / "out" / "node-two" / "manifest.json").read_text())["role"] == "follower"


def test_ray_token_authentication(ray_plan: Plan) -> None:
    """With a token every Ray node and the engine (a Ray driver) run with RAY_AUTH_MODE=token; the token is only in
    the 0600 env files, never in a unit, a record or a command line."""
    token = "a1" * 32
    parts = _render(ray_plan, _spec(api_key="secret-key"), ray_token=token)
    for part in parts:
        for placed in part.files:
            if placed.path.name in ("env", "ray.env"):
                assert f'RAY_AUTH_TOKEN="{token}"' in placed.text and 'RAY_AUTH_MODE="token"' in placed.text
                assert placed.mode == 0o600
            else:
                assert token not in placed.text, placed.path
        cluster = part.record.cluster
        assert cluster is not None
        assert cluster.ray_auth == "token" and cluster.ray_env_file == "/etc/npuops/demo/ray.env"
    without = _render(ray_plan)
    assert without[0].record.cluster is not None and without[0].record.cluster.ray_auth == "none"
    assert all("RAY_AUTH" not in placed.text for part in without for placed in part.files)


def test_each_hosts_record_carries_its_peers_for_its_start_gate(ray_plan: Plan) -> None:
    """The inventory's NPU NIC addresses (npuops_npu_ips) and each host's interface go into every host's membership:
    the start gate of each host checks the others from them (host-peer-reach, npu-peer-ping)."""
    hosts = (replace(HOSTS[0], npu_ips={0: "29.1.0.1", 1: "29.1.0.2"}), replace(HOSTS[1], npu_ips={0: "29.1.0.3"}))
    head, worker = _render(ray_plan, hosts=hosts)
    record = InstanceRecord.from_json(json.loads(_file(worker, "instance.json").text), "worker instance.json")
    group = peer_group(record)
    assert group is not None and group.ifname == "ens5" and dict(group.npu_ips) == {0: "29.1.0.3"}
    assert [(p.name, p.address, dict(p.npu_ips)) for p in group.peers] == [
        ("node-head", "10.0.0.1", {0: "29.1.0.1", 1: "29.1.0.2"})]
    head_record = InstanceRecord.from_json(json.loads(_file(head, "instance.json").text), "head instance.json")
    head_group = peer_group(head_record)
    assert head_group is not None and [p.name for p in head_group.peers] == ["node-two"]
    bad = json.loads(_file(worker, "instance.json").text)
    bad["cluster"]["nodes"][0]["npu_ips"] = {"eth0": "29.1.0.1"}
    with pytest.raises(ConfigError, match="npu_ips has a key that is not a device id"):
        InstanceRecord.from_json(bad, "worker instance.json")
