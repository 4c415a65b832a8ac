"""The drain of a stopping engine (vLLM's --shutdown-timeout): the plan's default from its own prediction, the
operator's --drain-timeout, releases whose vLLM has no such option, and what launch renders from it: vllm.yaml,
the supervisor's wait and systemd's TimeoutStopSec= above both. tests/engine/test_bench.py drains real streams."""

from __future__ import annotations

from pathlib import Path

import pytest

from npuops.errors import BadInputError
from npuops.launch.instance_files import DEFAULT_STOP_TIMEOUT_S, LaunchSpec, render_instances
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import DRAIN_MAX_S, DRAIN_MIN_S, make_plan
from npuops.plan.target import cpu_target, parse_hardware_spec
from tests.support.model_dirs import write_tiny_model
from tests.support.unit_syntax import parse_unit


def test_the_default_drain_is_twice_the_predicted_answer_within_bounds() -> None:
    for model, hardware in (("qwen3-8b", "910B3x8"), ("llama-2-70b", "910B3x8"), ("qwen3-32b", "310P3x4")):
        plan = make_plan(load_model(model), parse_hardware_spec(hardware), Workload(512, 2048),
                         PlanOptions(vllm_ascend_version="0.23.0"))
        expected = min(DRAIN_MAX_S, max(DRAIN_MIN_S, -(-2 * plan.prediction.e2e_ms // 1000)))
        assert plan.server.shutdown_timeout == expected, (model, plan.prediction.e2e_ms)
        assert plan.server.config_file()["shutdown-timeout"] == expected
        why = plan.explanation("shutdown_timeout").why
        assert "twice the predicted end-to-end time" in why and "--drain-timeout" in why


def test_a_release_without_the_option_aborts_and_says_so() -> None:
    plan = make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x8"), Workload(512, 128),
                     PlanOptions(vllm_ascend_version="0.13.0"))
    assert plan.server.shutdown_timeout is None and "shutdown-timeout" not in plan.server.config_file()
    assert "aborts the requests in flight" in plan.explanation("shutdown_timeout").why
    with pytest.raises(BadInputError) as refused:
        make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x8"), Workload(512, 128),
                  PlanOptions(vllm_ascend_version="0.13.0", shutdown_timeout=20))
    assert "vllm-ascend 0.13.0 lacks" in refused.value.problem and "--vllm-ascend-version" in refused.value.fix


def test_the_operator_sets_it_and_zero_aborts() -> None:
    host = cpu_target(32 * 2**30, 4, 1)
    asked = make_plan(load_model("qwen3-8b"), host, Workload(128, 32), PlanOptions(shutdown_timeout=45,
                                                                                   kv_cache_memory_bytes=2**30))
    assert asked.server.shutdown_timeout == 45 and asked.explanation("shutdown_timeout").why.startswith("as asked")
    zero = make_plan(load_model("qwen3-8b"), host, Workload(128, 32), PlanOptions(shutdown_timeout=0,
                                                                                  kv_cache_memory_bytes=2**30))
    assert zero.server.shutdown_timeout == 0 and "shutdown-timeout" not in zero.server.config_file()
    assert "a stop aborts the requests in flight" in zero.explanation("shutdown_timeout").why


def test_launch_waits_for_the_drain_and_systemd_waits_longer(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny-llama")
    plan = make_plan(load_model(str(model)), cpu_target(16 * 2**30, 2, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", shutdown_timeout=40))
    (instance,) = render_instances(plan, LaunchSpec(name="d", state_dir=tmp_path / "state"))
    assert "shutdown-timeout: 40" in instance.file("vllm.yaml").text
    assert instance.record.stop_timeout_s == DEFAULT_STOP_TIMEOUT_S + 40  # the supervisor's wait: drain, then exit
    settings = {(section, key): value for section, key, value in parse_unit(instance.file(instance.unit_name).text)}
    assert int(settings[("Service", "TimeoutStopSec")]) == instance.record.stop_timeout_s + 15
