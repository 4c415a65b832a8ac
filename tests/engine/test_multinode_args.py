"""vLLM's own argument parser accepts every multi-node command line npuops renders.

The per-host files of Ray (head) and native data-parallel (leader and --headless followers) plans, for NPU catalog
models and for the tiny CPU model, are turned into the `vllm serve MODEL --config vllm.yaml` each unit runs and parsed
by `vllm serve`'s parser (vllm/entrypoints/cli/serve.py, FlexibleArgumentParser with --config), in the engine venv;
then vLLM's EngineArgs are built from them and, for the tiny model, its config objects (ParallelConfig validates the
data-parallel and pipeline shape). What the parser reads must be what the plan meant.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from npuops.launch.instance_files import LaunchSpec
from npuops.launch.multinode import ClusterHost, render_cluster
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target, parse_hardware_spec
from tests.support.paths import REPO
from tests.support.vllm_args import PARSE_PRELUDE

pytestmark = [pytest.mark.engine]

# Parses each (model, config) like `vllm serve MODEL --config FILE`, builds EngineArgs, and (when asked) the
# engine config; prints what vLLM understood.
PARSE_SCRIPT = PARSE_PRELUDE + r"""
out = []
for model, config, build in json.loads(sys.argv[1]):
    args, engine = engine_args(model, config)
    entry = {k: getattr(engine, k) for k in (
        "model", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "data_parallel_size_local",
        "data_parallel_address", "data_parallel_rpc_port", "data_parallel_start_rank", "enable_expert_parallel",
        "distributed_executor_backend", "block_size", "max_model_len", "max_num_seqs", "dtype")}
    entry["headless"] = bool(getattr(args, "headless", False))
    entry["host"], entry["port"] = args.host, args.port
    if build:
        parallel = engine.create_engine_config().parallel_config
        entry["world_size"] = parallel.world_size
        entry["world_size_across_dp"] = parallel.world_size_across_dp
    out.append(entry)
print(json.dumps(out))
"""

HOSTS = (ClusterHost("node-a", "10.20.0.1", "enp1"), ClusterHost("node-b", "10.20.0.2", "enp1"),
         ClusterHost("node-c", "10.20.0.3", "enp1"), ClusterHost("node-d", "10.20.0.4", "enp1"))


def parse_with_vllm(python: Path, cases: list[tuple[str, str, bool]]) -> list[dict[str, Any]]:
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([str(python), "-c", PARSE_SCRIPT, json.dumps(cases)], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 0, f"vLLM refused a rendered command line:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def render(plan: Any, hosts: tuple[ClusterHost, ...], out: Path) -> list[tuple[str, str, str]]:
    """(host, role, vllm.yaml path) for every host that runs vllm serve."""
    parts = render_cluster(plan, LaunchSpec(name="mn", api_key="k"), hosts, group="serving",
                           ray_command=("/opt/npuops/venv/bin/ray",), unit_dir=Path("/etc/systemd/system"))
    served = []
    for part in parts:
        for placed in part.files:
            if placed.path.name == "vllm.yaml":
                target = out / part.host.name / "vllm.yaml"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(placed.text)
                served.append((part.host.name, part.role, str(target)))
    return served


def catalog_plan(name: str, nodes: int, multinode: str, tmp_path: Path) -> Any:
    # An existing directory: vLLM takes anything else for a hub name and looks it up.
    (tmp_path / name).mkdir(exist_ok=True)
    model = dataclasses.replace(load_model(name), path=tmp_path / name)
    return make_plan(model, parse_hardware_spec("910B3x8", nodes=nodes), Workload(512, 128),
                     PlanOptions(multinode=multinode))


NPU_CASES = [
    ("qwen3-235b-a22b", 2, "dp"),  # MoE: data + expert parallel, leader and a headless follower
    ("qwen3-235b-a22b", 2, "ray"),  # the same over Ray: TP in a node x PP across nodes
    ("llama-3.1-70b", 4, "dp"),  # dense, fits a node: DP ranks behind one endpoint
    ("llama-3.1-70b", 2, "ray"),
]


@pytest.fixture(scope="module")
def npu_cases(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int, str], Any]:
    """Every NPU case rendered and parsed in one engine-venv process (importing vLLM takes seconds)."""
    tmp_path = tmp_path_factory.mktemp("npu-args")
    rendered = {}
    cases: list[tuple[str, str, bool]] = []
    for name, nodes, multinode in NPU_CASES:
        plan = catalog_plan(name, nodes, multinode, tmp_path)
        served = render(plan, HOSTS[:nodes], tmp_path / f"{name}-{nodes}-{multinode}")
        rendered[(name, nodes, multinode)] = (plan, served, len(cases))
        cases += [(str(tmp_path / name), path, False) for _, _, path in served]
    parsed = parse_with_vllm(engine_python, cases)
    return {key: (plan, served, parsed[start:start + len(served)]) for key, (plan, served, start) in rendered.items()}


@pytest.mark.parametrize(("name", "nodes", "multinode"), NPU_CASES)
def test_vllm_parses_the_npu_command_lines(npu_cases: dict[tuple[str, int, str], Any], name: str, nodes: int,
                                           multinode: str) -> None:
    plan, served, parsed = npu_cases[(name, nodes, multinode)]
    cluster = plan.cluster
    assert cluster is not None and cluster.strategy == multinode
    if multinode == "ray":
        # Only the head runs vllm serve; the workers run Ray alone.
        assert [role for _, role, _ in served] == ["head"]
        (head,) = parsed
        assert head["distributed_executor_backend"] == "ray"
        assert head["tensor_parallel_size"] * head["pipeline_parallel_size"] == cluster.tp * cluster.pp
        assert head["tensor_parallel_size"] * head["pipeline_parallel_size"] == 8 * nodes
        assert head["data_parallel_size"] == 1 and not head["headless"]
        return
    assert [role for _, role, _ in served] == ["leader"] + ["follower"] * (nodes - 1)
    for rank, entry in enumerate(parsed):
        assert entry["data_parallel_size"] == cluster.dp
        assert entry["data_parallel_size_local"] == cluster.dp_local
        assert entry["data_parallel_address"] == HOSTS[0].address
        assert entry["data_parallel_rpc_port"] == 13345
        assert entry["tensor_parallel_size"] == cluster.tp
        assert entry["enable_expert_parallel"] is cluster.expert_parallel
        assert entry["headless"] is (rank > 0)
        if rank > 0:
            assert entry["data_parallel_start_rank"] == rank * cluster.dp_local
        assert entry["distributed_executor_backend"] in (None, "mp")


def test_vllm_builds_the_cpu_cluster_configs(engine_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    """The tiny model's two-host plans go all the way to vLLM's engine config (ParallelConfig validates them)."""
    model = load_model(str(tiny_model))
    target = cpu_target(16 * 2**30, 2, 1, nodes=2)
    workload = Workload(256, 64)
    cases = []
    expected = []
    for multinode in ("dp", "ray"):
        plan = make_plan(model, target, workload, PlanOptions(multinode=multinode, max_model_len=512,
                                                               dtype="float32", enforce_eager=True,
                                                               kv_cache_memory_bytes=256 * 2**20))
        for host, role, path in render(plan, HOSTS[:2], tmp_path / multinode):
            # Ray's config needs a Ray cluster to place its workers: parse only; dp builds the config.
            cases.append((str(tiny_model), path, multinode == "dp"))
            expected.append((multinode, host, role))
    parsed = parse_with_vllm(engine_python, cases)
    by_case = {(m, h): p for (m, h, _), p in zip(expected, parsed, strict=True)}
    leader, follower = by_case[("dp", "node-a")], by_case[("dp", "node-b")]
    assert leader["data_parallel_size"] == follower["data_parallel_size"] == 2
    assert leader["world_size_across_dp"] == follower["world_size_across_dp"] == 2
    assert not leader["headless"] and follower["headless"] and follower["data_parallel_start_rank"] == 1
    head = by_case[("ray", "node-a")]
    assert head["pipeline_parallel_size"] == 2 and head["distributed_executor_backend"] == "ray"
    assert ("ray", "node-b") not in by_case
