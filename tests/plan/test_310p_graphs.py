"""ACL graphs on the Atlas 300I DUO (310P): FULL_DECODE_ONLY from vllm-ascend 0.20.2rc1, eager before it; with TP > 1
only the two largest capture sizes (the chip's event ids); the compiler switch each release's 310P commands pass; and
the low-concurrency decode the graphs make faster (target_rules.toml [family.310P] cites the guides)."""

from __future__ import annotations

import pytest

from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.result import Plan
from npuops.plan.target import parse_hardware_spec


def plan_310p(release: str, hardware: str = "310P3x1", tp: int | None = None, **options: object) -> Plan:
    return make_plan(load_model("qwen3-8b", "W8A8SC"), parse_hardware_spec(hardware), Workload(1024, 512, 1),
                     PlanOptions(vllm_ascend_version=release, tp=tp, **options))  # type: ignore[arg-type]


@pytest.mark.parametrize("release", ["0.16.0rc1", "0.19.1rc1"])
def test_a_release_before_0_20_2rc1_runs_eager_and_says_why(release: str) -> None:
    plan = plan_310p(release)
    assert plan.graph_mode == "eager" and plan.config["enforce_eager"] is True
    assert plan.server.compilation_config is None and plan.server.additional_config is None
    why = {e.key: e.why for e in plan.explanations}["enforce_eager"]
    assert "eager before 0.20.2rc1" in why


@pytest.mark.parametrize(("release", "switch"), [("0.20.2rc1", {"fuse_norm_quant": False}),
                                                  ("0.22.1rc1", {"fuse_norm_quant": False}),
                                                  ("0.23.0", {"enable_npugraph_ex": False}),
                                                  ("0.30.0rc2", {"enable_npugraph_ex": False})])
def test_from_0_20_2rc1_decode_steps_replay_as_graphs(release: str, switch: dict[str, bool]) -> None:
    plan = plan_310p(release)
    assert plan.graph_mode == "full_decode_only" and plan.config["enforce_eager"] is False
    config = plan.server.compilation_config
    assert config is not None and config["cudagraph_mode"] == "FULL_DECODE_ONLY"
    # TP 1 keeps the whole ladder up to max_num_seqs, as the guide's [1,2,4,8,16,32] for 32 sequences.
    sizes = config["cudagraph_capture_sizes"]
    assert sizes[0] == 1 and sizes[-1] == plan.server.max_num_seqs and len(sizes) > 2
    assert plan.server.additional_config == {"ascend_compilation_config": switch}
    assert "--compilation-config" in plan.vllm_args and "--enforce-eager" not in plan.vllm_args


def test_a_tp_group_captures_only_its_two_largest_sizes() -> None:
    plan = make_plan(load_model("qwen3-32b", "W8A8SC"), parse_hardware_spec("310P3x4"), Workload(1024, 512, 16),
                     PlanOptions(vllm_ascend_version="0.23.0", tp=4))
    config = plan.server.compilation_config
    assert config is not None
    sizes = config["cudagraph_capture_sizes"]
    assert len(sizes) == 2 and sizes[-1] == plan.server.max_num_seqs and sizes[0] < sizes[1]
    why = {e.key: e.why for e in plan.explanations}["compilation_config"]
    assert "event ids hold 2 graphs" in why
    # A2 has no such limit: the same TP keeps its ladder.
    a2 = make_plan(load_model("qwen3-32b"), parse_hardware_spec("910B3x4"), Workload(1024, 512, 16),
                   PlanOptions(vllm_ascend_version="0.23.0", tp=4))
    assert a2.server.compilation_config is not None and len(a2.server.compilation_config["cudagraph_capture_sizes"]) > 2


def test_graphs_shorten_the_low_concurrency_decode_and_eager_stays_on_request() -> None:
    graphs, eager_release = plan_310p("0.23.0"), plan_310p("0.19.1rc1")
    assert graphs.prediction.tpot_ms < eager_release.prediction.tpot_ms
    asked = plan_310p("0.23.0", enforce_eager=True)
    assert asked.graph_mode == "eager" and asked.server.additional_config is None
    assert asked.prediction.tpot_ms == pytest.approx(eager_release.prediction.tpot_ms)
    # The operator's own compiler settings win over the plan's.
    own = plan_310p("0.23.0", additional={"ascend_compilation_config": {"enable_npugraph_ex": False,
                                                                        "fuse_norm_quant": False}})
    assert own.server.additional_config == {"ascend_compilation_config": {"enable_npugraph_ex": False,
                                                                          "fuse_norm_quant": False}}
