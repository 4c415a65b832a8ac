"""Multi-node plans (issue 8): the HCCL_BUFFSIZE formula, the ray / dp choice, per-node flags, explanations, text.

The buffer numbers are worked by hand from the MC2 kernels' formula quoted in npuops/plan/cluster.py, for a
DeepSeek-V3-like model (the catalog's deepseek-v3: hidden 7168, 256 routed experts, top-8, 1 shared expert):

    tokenNeedSizeCombine  = align512(7168 * 2)             = 14336   (28 x 512 exactly)
    tokenNeedSizeDispatch = align512(align32(14336) + 44)  = align512(14380) = 14848   (29 x 512)
    ep = 32 ranks -> ceil(256 / 32) = 8 local experts; k + shared = 8 + 1 = 9
    16 tokens:  (16 * 14848 * 32 * 8 + 16 * 14336 * 9) * 2 = (60817408 + 2064384) * 2 = 125763584 B = 119.93 MiB
                x 1.25 = 149.9 -> 150 -> align64 = 192 < 200: HCCL's default 200 MB wins
    256 tokens: 16 x the above = 2012217344 B = 1919.0 MiB exactly (1919 * 2**20)
                x 1.25 = 2398.75 -> 2399 -> align64 = 38 * 64 = 2432
    512 tokens (the kernel's cap): 3838.0 MiB x 1.25 = 4797.5 -> 4798 -> align64 = 75 * 64 = 4800
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from npuops.errors import BadInputError
from npuops.plan.catalog import load_model
from npuops.plan.cluster import HCCL_DEFAULT_BUFFSIZE_MB, MC2_MAX_BS, ClusterPlan, hccl_buffsize_for_ep
from npuops.plan.inputs import PlanOptions, Workload, check_strategy
from npuops.plan.model import ModelArch
from npuops.plan.planner import make_plan
from npuops.plan.result import Plan
from npuops.plan.target import cpu_target, parse_hardware_spec
from npuops.plan.text import render_plan_text
from tests.support.model_dirs import TINY_LLAMA

WORKLOAD = Workload(1024, 256)


def _plan(name: str, nodes: int, **options: object) -> Plan:
    return make_plan(load_model(name), parse_hardware_spec("910B3x8", nodes=nodes), WORKLOAD,
                     PlanOptions(**options))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def deepseek() -> ModelArch:
    arch = load_model("deepseek-v3").arch
    # The numbers the hand computation above rests on.
    assert (arch.hidden_size, arch.num_experts, arch.num_experts_per_tok, arch.num_shared_experts) == (7168, 256, 8, 1)
    return arch


@pytest.fixture(scope="module")
def moe_dp() -> Plan:
    return _plan("qwen3-235b-a22b", 2)


@pytest.fixture(scope="module")
def moe_ray() -> Plan:
    return _plan("qwen3-235b-a22b", 2, multinode="ray")


@pytest.fixture(scope="module")
def dense_dp() -> Plan:
    return _plan("llama-3.1-70b", 2)


@pytest.fixture(scope="module")
def dense_ray() -> Plan:
    return _plan("llama-3.1-70b", 2, multinode="ray")


# --- HCCL_BUFFSIZE for expert parallel ---------------------------------------------------------------------------


def test_hccl_buffsize_small_batch_stays_at_hccls_default(deepseek: ModelArch) -> None:
    size = hccl_buffsize_for_ep(deepseek, 32, 16)
    assert size.needed_mb == 119.9  # 125763584 B
    assert size.mb == HCCL_DEFAULT_BUFFSIZE_MB == 200
    assert "16 tokens x 14848 B x 32 ranks x 8 experts per rank" in size.why
    assert "16 x 14336 B x (8 routed + 1 shared)" in size.why
    assert "never below HCCL's 200 MiB default" in size.why


def test_hccl_buffsize_full_batch_gets_headroom_in_64mb_steps(deepseek: ModelArch) -> None:
    size = hccl_buffsize_for_ep(deepseek, 32, 256)
    assert size.needed_mb == 1919.0  # 2012217344 B = 1919 MiB exactly
    assert size.mb == 2432  # align64(ceil(1919 * 1.25)) = align64(2399)
    assert size.mb % 64 == 0
    assert "1919 MiB per rank" in size.why and "2432 MiB with 25% headroom" in size.why
    assert "default" not in size.why


def test_hccl_buffsize_tokens_are_capped_at_the_kernels_512(deepseek: ModelArch) -> None:
    capped = hccl_buffsize_for_ep(deepseek, 32, MC2_MAX_BS)
    assert (capped.needed_mb, capped.mb) == (3838.0, 4800)
    assert hccl_buffsize_for_ep(deepseek, 32, 4096) == capped
    # Fewer than one token is still one token.
    assert hccl_buffsize_for_ep(deepseek, 32, 0) == hccl_buffsize_for_ep(deepseek, 32, 1)


def test_hccl_buffsize_local_experts_round_up(deepseek: ModelArch) -> None:
    # ep 24: ceil(256 / 24) = 11 local experts; (256*14848*24*11 + 256*14336*9) * 2 = 2073034752 B = 1977.0 MiB.
    size = hccl_buffsize_for_ep(deepseek, 24, 256)
    assert size.needed_mb == 1977.0
    assert size.mb == 2496  # ceil(1977 * 1.25) = 2472 -> 39 * 64
    assert "11 experts per rank" in size.why


def test_hccl_buffsize_dense_model_or_no_expert_parallel_is_the_default(deepseek: ModelArch) -> None:
    dense = replace(deepseek, num_experts=0, num_experts_per_tok=0, num_shared_experts=0)
    for arch, ep in ((dense, 32), (deepseek, 1), (deepseek, 0)):
        size = hccl_buffsize_for_ep(arch, ep, 256)
        assert (size.mb, size.needed_mb) == (HCCL_DEFAULT_BUFFSIZE_MB, 0.0)
        assert "no expert parallel" in size.why


# --- the strategy ------------------------------------------------------------------------------------------------


def test_moe_over_two_nodes_is_data_plus_expert_parallel(moe_dp: Plan) -> None:
    cluster = moe_dp.cluster
    assert cluster is not None
    assert cluster.strategy == "dp" and cluster.expert_parallel and cluster.nodes == 2
    assert cluster.dp * cluster.tp == 16 and cluster.pp == 1
    assert cluster.dp_local * cluster.tp == 8
    assert cluster.ep_size == 16
    config = moe_dp.config
    assert config["distributed_executor_backend"] is None
    assert "--distributed-executor-backend" not in moe_dp.vllm_args
    assert config["multinode"] == "dp"
    assert config["enable_expert_parallel"] is True and "--enable-expert-parallel" in moe_dp.vllm_args
    assert config["data_parallel_size"] == cluster.dp
    assert config["data_parallel_size_local"] == cluster.dp_local
    assert config["tensor_parallel_size"] == cluster.tp
    assert config["replica_mode"] == "one endpoint over 2 nodes"
    # HCCL_BUFFSIZE: the formula's value for this cluster's EP group and the plan's batch, in the env and the cluster.
    assert cluster.hccl_buffsize_mb is not None
    assert moe_dp.env["HCCL_BUFFSIZE"] == str(cluster.hccl_buffsize_mb)
    expected = hccl_buffsize_for_ep(moe_dp.model.arch, cluster.ep_size, config["max_num_seqs"])
    assert cluster.hccl_buffsize_mb == expected.mb
    assert moe_dp.explanation("env.HCCL_BUFFSIZE").value == expected.mb
    # One instance: all of a node's devices.
    assert len(moe_dp.replicas) == 1 and moe_dp.replicas[0].devices == tuple(range(8))
    assert moe_dp.env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_moe_forced_ray_is_tp_x_pp_over_two_nodes(moe_ray: Plan) -> None:
    cluster = moe_ray.cluster
    assert cluster is not None
    assert cluster.strategy == "ray" and cluster.nodes == 2
    assert cluster.tp * cluster.pp == 16 and cluster.dp == 1
    assert moe_ray.config["distributed_executor_backend"] == "ray"
    assert moe_ray.vllm_args[-2:] == ("--distributed-executor-backend", "ray")
    assert moe_ray.config["pipeline_parallel_size"] == cluster.pp
    assert [(n.rank, n.role) for n in cluster.node_list()] == [(0, "head"), (1, "worker")]
    assert [n.dp_start_rank for n in cluster.node_list()] == [None, None]
    # The experts are still spread whole inside each stage: its buffer follows the stage's EP group (TP x DP).
    assert cluster.expert_parallel and cluster.ep_size == cluster.tp
    assert moe_ray.env["HCCL_BUFFSIZE"] == str(cluster.hccl_buffsize_mb)
    assert cluster.rejected == ("dp (data + expert parallel): asked for ray",)


def test_dense_model_that_fits_a_node_runs_data_parallel_ranks(dense_dp: Plan) -> None:
    cluster = dense_dp.cluster
    assert cluster is not None
    assert cluster.strategy == "dp" and not cluster.expert_parallel and cluster.ep_size == 1
    ranks_per_node = 8 // (cluster.tp * cluster.pp)
    assert ranks_per_node > 1
    assert cluster.dp_local == ranks_per_node
    assert dense_dp.config["data_parallel_size"] == cluster.dp == cluster.dp_local * 2
    assert dense_dp.config["data_parallel_size_local"] == cluster.dp_local
    assert dense_dp.config["distributed_executor_backend"] is None
    assert dense_dp.config["enable_expert_parallel"] is False
    assert "HCCL_BUFFSIZE" not in dense_dp.env and cluster.hccl_buffsize_mb is None
    assert [n.as_dict() for n in cluster.node_list()] == [
        {"rank": 0, "role": "leader", "dp_start_rank": 0},
        {"rank": 1, "role": "follower", "dp_start_rank": cluster.dp_local},
    ]
    assert cluster.rejected[0].startswith("ray (TP x PP across nodes): the model fits")


def test_dense_model_forced_ray_spans_both_nodes(dense_ray: Plan) -> None:
    cluster = dense_ray.cluster
    assert cluster is not None
    assert cluster.strategy == "ray" and cluster.nodes == 2
    assert cluster.tp * cluster.pp == 16 and cluster.tp <= 8
    assert not cluster.expert_parallel and cluster.hccl_buffsize_mb is None
    assert dense_ray.config["distributed_executor_backend"] == "ray"
    assert dense_ray.config["data_parallel_size"] == 1
    assert cluster.rejected == ("dp: asked for ray",)


def test_dense_model_too_big_for_a_node_goes_ray_on_its_own() -> None:
    plan = make_plan(load_model("llama-3.1-70b"), parse_hardware_spec("910B3x2", nodes=2), WORKLOAD, PlanOptions())
    assert plan.cluster is not None and plan.cluster.strategy == "ray"
    assert plan.cluster.tp * plan.cluster.pp == 4
    assert plan.cluster.rejected == (
        "dp (data parallel): every rank would need the whole model, which does not fit a node",)
    # Forcing dp there cannot fit: the error says what would.
    with pytest.raises(BadInputError, match="does not fit"):
        make_plan(load_model("llama-3.1-70b"), parse_hardware_spec("910B3x2", nodes=2), WORKLOAD,
                  PlanOptions(multinode="dp"))


def test_ray_using_fewer_nodes_than_given_warns() -> None:
    plan = _plan("llama-3.1-70b", 3, multinode="ray")
    assert plan.cluster is not None and plan.cluster.nodes == 2
    assert "the plan uses 2 of the 3 nodes; launch another group on the rest" in plan.warnings


@pytest.mark.parametrize("strategy", ["dp", "ray"])
def test_a_forced_strategy_needs_several_nodes(strategy: str) -> None:
    with pytest.raises(BadInputError, match=f"--multinode {strategy} plans for several nodes"):
        _plan("qwen3-8b", 1, multinode=strategy)
    # auto on one node: no cluster at all.
    single = _plan("qwen3-8b", 1)
    assert single.cluster is None and single.config["multinode"] is None
    assert single.config["data_parallel_size_local"] is None and single.to_json()["cluster"] is None


def test_strategy_names_are_checked() -> None:
    assert check_strategy(None) == "auto" and check_strategy(" Ray ") == "ray"
    with pytest.raises(BadInputError, match="'bogus' is not a strategy"):
        _plan("qwen3-8b", 2, multinode="bogus")


@pytest.fixture()
def tiny_config_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tiny-llama"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    return directory


def test_cpu_hosts_auto_is_one_data_parallel_rank_per_host(tiny_config_dir: Path) -> None:
    target = cpu_target(16 * 2**30, 4, 1, nodes=2)
    plan = make_plan(load_model(str(tiny_config_dir)), target, Workload(128, 32), PlanOptions())
    cluster = plan.cluster
    assert cluster is not None
    assert (cluster.strategy, cluster.nodes, cluster.dp, cluster.dp_local, cluster.tp, cluster.pp) == (
        "dp", 2, 2, 1, 1, 1)
    assert plan.config["data_parallel_size"] == 2 and plan.config["distributed_executor_backend"] is None
    assert cluster.node_args(1, leader_address="192.0.2.1") == [
        "--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-address", "192.0.2.1",
        "--data-parallel-rpc-port", "13345", "--headless", "--data-parallel-start-rank", "1"]
    assert plan.env == {} and plan.replicas[0].devices == ()


def test_cpu_hosts_forced_ray_are_two_pipeline_stages(tiny_config_dir: Path) -> None:
    target = cpu_target(16 * 2**30, 4, 1, nodes=2)
    plan = make_plan(load_model(str(tiny_config_dir)), target, Workload(128, 32), PlanOptions(multinode="ray"))
    cluster = plan.cluster
    assert cluster is not None
    assert (cluster.strategy, cluster.nodes, cluster.tp, cluster.pp, cluster.dp) == ("ray", 2, 1, 2, 1)
    assert plan.config["pipeline_parallel_size"] == 2 and plan.config["distributed_executor_backend"] == "ray"
    assert "2 pipeline stages over 2 hosts" in cluster.why


# --- per-node flags ----------------------------------------------------------------------------------------------


def test_dp_node_args_leader_and_followers() -> None:
    cluster = ClusterPlan("dp", 3, 8, 2, 1, 12, 4, True, 512, "why")
    leader = cluster.node_args(0, leader_address="10.0.0.1", rpc_port=14000)
    assert leader == ["--data-parallel-size", "12", "--data-parallel-size-local", "4",
                      "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "14000"]
    assert "--headless" not in leader and "--data-parallel-start-rank" not in leader
    for rank in (1, 2):
        follower = cluster.node_args(rank, leader_address="10.0.0.1")
        assert follower[:8] == ["--data-parallel-size", "12", "--data-parallel-size-local", "4",
                                "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345"]
        assert follower[8:] == ["--headless", "--data-parallel-start-rank", str(rank * 4)]
    assert [n.dp_start_rank for n in cluster.node_list()] == [0, 4, 8]
    assert cluster.ep_size == 24


def test_node_args_refuse_ray_workers_and_ranks_out_of_range() -> None:
    ray = ClusterPlan("ray", 2, 8, 8, 2, 1, 1, False, None, "why")
    assert ray.node_args(0, leader_address="10.0.0.1") == []
    with pytest.raises(ValueError, match="ray workers run no vllm serve"):
        ray.node_args(1, leader_address="10.0.0.1")
    dp = ClusterPlan("dp", 2, 8, 1, 1, 16, 8, False, None, "why")
    for cluster in (ray, dp):
        for rank in (-1, 2):
            with pytest.raises(ValueError, match=r"outside 0\.\.1"):
                cluster.node_args(rank, leader_address="10.0.0.1")


# --- explanations, JSON, text ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["moe_dp", "moe_ray", "dense_dp", "dense_ray"])
def test_multinode_explanation_and_the_rejected_alternative(case: str, request: pytest.FixtureRequest) -> None:
    plan: Plan = request.getfixturevalue(case)
    cluster = plan.cluster
    assert cluster is not None
    explanation = plan.explanation("multinode")
    assert explanation.value == cluster.strategy == plan.config["multinode"]
    assert explanation.why.startswith(cluster.why) and len(explanation.why) > 40
    assert explanation.why.endswith(f"; not {cluster.rejected[0]}")
    other = "ray" if cluster.strategy == "dp" else "dp"
    assert len(cluster.rejected) == 1 and cluster.rejected[0].startswith(other)
    # The text names the alternative and why it lost.
    assert f" not {cluster.rejected[0]}" in " ".join(render_plan_text(plan).split())  # unwrapped


@pytest.mark.parametrize("case", ["moe_dp", "dense_dp"])
def test_multinode_explanation_names_why_the_alternative_lost(case: str, request: pytest.FixtureRequest) -> None:
    plan: Plan = request.getfixturevalue(case)
    assert plan.cluster is not None
    reason = plan.cluster.rejected[0].split(": ", 1)[1]
    assert reason in plan.explanation("multinode").why


@pytest.mark.parametrize("case", ["moe_dp", "dense_dp"])
def test_data_parallel_size_explanation_describes_one_endpoint(case: str, request: pytest.FixtureRequest) -> None:
    plan: Plan = request.getfixturevalue(case)
    why = plan.explanation("data_parallel_size").why
    assert plan.explanation("data_parallel_size").value == plan.config["data_parallel_size"]
    assert "independent instances" not in why and "own device mask and port" not in why


def test_tp_explanation_of_an_expert_parallel_cluster_is_true(moe_dp: Plan) -> None:
    assert moe_dp.config["tensor_parallel_size"] == 1
    why = moe_dp.explanation("tensor_parallel_size").why
    assert "fit one" not in why and "no collectives" not in why


def test_expert_parallel_is_explained_whenever_enabled(moe_dp: Plan) -> None:
    assert moe_dp.config["enable_expert_parallel"] is True
    assert moe_dp.explanation("enable_expert_parallel").value is True


def test_expert_parallel_explanation_quotes_the_planned_buffer(moe_ray: Plan) -> None:
    buffsize = moe_ray.env["HCCL_BUFFSIZE"]
    assert buffsize != "1024"
    why = moe_ray.explanation("enable_expert_parallel").why
    assert "HCCL_BUFFSIZE=1024" not in why


@pytest.mark.parametrize("case", ["moe_dp", "moe_ray", "dense_dp", "dense_ray"])
def test_plan_json_carries_the_cluster(case: str, request: pytest.FixtureRequest) -> None:
    plan: Plan = request.getfixturevalue(case)
    assert plan.cluster is not None
    data = json.loads(json.dumps(plan.to_json()))
    cluster = data["cluster"]
    assert cluster == plan.cluster.as_dict()
    assert cluster["strategy"] == plan.cluster.strategy
    assert cluster["nodes"] == len(cluster["node_roles"]) == 2
    assert cluster["tensor_parallel_size"] == data["config"]["tensor_parallel_size"]
    assert cluster["pipeline_parallel_size"] == data["config"]["pipeline_parallel_size"]
    assert cluster["data_parallel_size"] == data["config"]["data_parallel_size"]
    assert cluster["expert_parallel_size"] == plan.cluster.ep_size
    assert cluster["rejected"] == list(plan.cluster.rejected)


def test_text_shows_multi_node_only_for_cluster_plans(moe_dp: Plan, dense_ray: Plan) -> None:
    text = render_plan_text(moe_dp)
    assert "\nMulti-node: dp over 2 nodes (TP 1, PP 1, DP 16, EP 16)" in text
    assert "  node 0: leader, data-parallel ranks from 0" in text
    assert "  node 1: follower, data-parallel ranks from 8" in text
    assert f" why: {moe_dp.cluster.why}" in " ".join(text.split())  # type: ignore[union-attr]  # wrapped
    ray_text = render_plan_text(dense_ray)
    assert "\nMulti-node: ray over 2 nodes (TP 8, PP 2, DP 1)" in ray_text
    assert "  node 0: head\n  node 1: worker\n" in ray_text
    assert "EP " not in ray_text.split("Multi-node:")[1].splitlines()[0]
    single = render_plan_text(_plan("qwen3-8b", 1))
    assert "Multi-node" not in single and "not ray" not in single


def test_a_data_parallel_cluster_explains_its_single_stage() -> None:
    plan = make_plan(load_model("qwen3-235b-a22b"), parse_hardware_spec("910B3x8", nodes=2), Workload(512, 128))
    assert plan.cluster is not None and plan.cluster.strategy == "dp"
    why = plan.explanation("pipeline_parallel_size").why
    assert why == "one stage: each data-parallel rank runs every layer, with its share of the experts"
