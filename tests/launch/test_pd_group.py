"""`launch --pd P:D -i INVENTORY --group GROUP`, rendered: the first P hosts' prefill engines, the next D hosts'
decode engines, each on its serving address with its kv_transfer_config, and the PD router on the first host in
front of all of them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from npuops.errors import BadInputError
from npuops.launch.instance_files import LaunchSpec
from npuops.launch.multinode import ClusterHost, HostPart, render_pd_group
from npuops.plan.catalog import load_model
from npuops.plan.disaggregation import MOONCAKE_CONNECTOR, PdShape, plan_pools_over_hosts
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.model import ModelSpec
from npuops.plan.target import parse_hardware_spec

HOSTS = [ClusterHost("a", "10.0.0.1", "eth0"), ClusterHost("b", "10.0.0.2", "eth0"), ClusterHost("c", "10.0.0.3",
                                                                                                 "eth0")]


def _files(part: HostPart, suffix: str) -> dict[str, str]:
    return {str(f.path): f.text for f in part.files if str(f.path).endswith(suffix)}


def test_one_prefill_host_and_two_decode_hosts_behind_the_first_hosts_router(tmp_path: Path) -> None:
    pd = plan_pools_over_hosts(_npu_model(tmp_path), parse_hardware_spec("910B3x8"),
                               Workload(2048, 512, concurrency=64), PlanOptions(), PdShape(1, 2))
    assert pd.connector == MOONCAKE_CONNECTOR and pd.prefill.hosts == 1 and pd.decode.hosts == 2
    # Different hosts: no HCCL_INTRA_ROCE_ENABLE; every host's ports start above the transport range.
    assert "HCCL_INTRA_ROCE_ENABLE" not in pd.decode.plan.env
    parts = render_pd_group(pd, LaunchSpec(name="pdg", port=8000), HOSTS, unit_dir=Path("/etc/systemd/system"))
    assert [p.role for p in parts] == ["router", "replicas", "replicas"]
    engines = {json.loads(text)["name"]: json.loads(text) for p in parts for text in _files(p, "instance.json")
               .values() if json.loads(text).get("pd_role")}
    prefill = [r for r in engines.values() if r["pd_role"] == "prefill"]
    decode = [r for r in engines.values() if r["pd_role"] == "decode"]
    assert {r["host"] for r in prefill} == {"10.0.0.1"} and {r["host"] for r in decode} == {"10.0.0.2", "10.0.0.3"}
    assert len(decode) == pd.decode.count and len({r["name"] for r in decode}) == len(decode)
    for record in prefill + decode:
        assert record["kv_port"] >= 28000 and record["behind"] == "pdg"
    router = json.loads(next(iter(_files(parts[0], "router.json").values())))["argv"]
    assert router[0] == "--vllm-pd-disaggregation"
    assert [router[i + 1] for i, a in enumerate(router) if a == "--prefill"] == [
        f"http://10.0.0.1:{r['port']}" for r in prefill]
    assert sorted(router[i + 1] for i, a in enumerate(router) if a == "--decode") == sorted(
        f"http://{r['host']}:{r['port']}" for r in decode)
    env = next(iter(_files(parts[2], "/env").values()))
    assert 'VLLM_HOST_IP="10.0.0.3"' in env


def _npu_model(tmp_path: Path) -> ModelSpec:
    (tmp_path / "qwen3-32b").mkdir()
    return dataclasses.replace(load_model("qwen3-32b"), path=tmp_path / "qwen3-32b")


def test_the_group_must_have_p_plus_d_hosts(tmp_path: Path) -> None:
    pd = plan_pools_over_hosts(_npu_model(tmp_path), parse_hardware_spec("910B3x8"), Workload(), PlanOptions(),
                               PdShape(1, 1))
    with pytest.raises(BadInputError) as caught:
        render_pd_group(pd, LaunchSpec(name="pdg"), HOSTS, unit_dir=Path("/etc/systemd/system"))
    assert "2 hosts, but the group has 3" in caught.value.problem and "P + D = 3" in caught.value.fix


def test_plan_pd_over_nodes_shows_the_group_layout() -> None:
    from tests.support.npuops_cli import npuops

    done = npuops("plan", "qwen3-32b", "--hardware", "910B3x8", "--nodes", "2", "--pd", "1:1", "--json")
    assert done.returncode == 0, done.stderr
    pd = json.loads(done.stdout)["disaggregated"]
    assert pd["prefill"]["hosts"] == 1 and pd["decode"]["hosts"] == 1
    assert "HCCL_INTRA_ROCE_ENABLE" not in pd["env"]
    bad = npuops("plan", "qwen3-32b", "--hardware", "910B3x8", "--nodes", "3", "--pd", "1:1")
    assert bad.returncode != 0 and "use --nodes 2" in bad.stderr and "Traceback" not in bad.stderr
