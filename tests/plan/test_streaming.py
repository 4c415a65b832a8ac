"""How many tokens a streaming client gets per chunk (vLLM's --stream-interval): a chunk about every 50 ms at the
predicted TPOT where the engine is fast, every token where it is not, the operator's --stream-interval, and the
releases whose vLLM streams token by token only. tests/engine/test_plan_predicts_bench.py serves a plan with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from npuops.cli.main import cli
from npuops.errors import BadInputError
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.streaming import MAX_STREAM_INTERVAL, STREAM_PERIOD_MS
from npuops.plan.target import cpu_target, parse_hardware_spec
from tests.support.model_dirs import write_tiny_model


def test_a_fast_engine_streams_a_chunk_every_50_ms_and_a_slow_one_every_token() -> None:
    fast = make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x8"), Workload(512, 256, concurrency=1),
                     PlanOptions(vllm_ascend_version="0.23.0"))
    interval = fast.server.stream_interval
    assert interval == min(MAX_STREAM_INTERVAL, int(STREAM_PERIOD_MS // fast.prediction.tpot_ms)) and interval > 1
    assert fast.server.config_file()["stream-interval"] == interval
    why = fast.explanation("stream_interval").why
    assert f"{interval} tokens a chunk" in why and "--stream-interval 1" in why
    slow = make_plan(load_model("qwen3-32b"), parse_hardware_spec("310P3x4"), Workload(512, 256, concurrency=32),
                     PlanOptions(vllm_ascend_version="0.23.0"))
    assert slow.prediction.tpot_ms >= STREAM_PERIOD_MS
    assert slow.server.stream_interval == 1 and "stream-interval" not in slow.server.config_file()
    assert "every token is streamed on its own" in slow.explanation("stream_interval").why


def test_the_cpu_engine_at_16_in_flight_batches_its_stream(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny-llama")
    plan = make_plan(load_model(str(model)), cpu_target(16 * 2**30, 2, 1), Workload(128, 64, concurrency=16),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20))
    assert plan.release is None  # the CPU engine's vLLM is the node's own: the option is there from 0.13 on
    assert 1 < plan.server.stream_interval <= MAX_STREAM_INTERVAL
    assert f"--stream-interval {plan.server.stream_interval}" in " ".join(plan.server.flags())


def test_a_release_without_it_streams_every_token_and_refuses_the_flag() -> None:
    plan = make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x8"), Workload(512, 128),
                     PlanOptions(vllm_ascend_version="0.11.0"))
    assert plan.server.stream_interval is None and "stream-interval" not in plan.server.config_file()
    assert "arrived with 0.13.0" in plan.explanation("stream_interval").why
    with pytest.raises(BadInputError) as refused:
        make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x8"), Workload(512, 128),
                  PlanOptions(vllm_ascend_version="0.11.0", stream_interval=4))
    assert "vllm-ascend 0.11.0" in refused.value.problem and "--vllm-ascend-version" in refused.value.fix
    # Asking for every token is what that release does anyway.
    every = make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x8"), Workload(512, 128),
                      PlanOptions(vllm_ascend_version="0.11.0", stream_interval=1))
    assert every.server.stream_interval == 1 and "stream-interval" not in every.server.config_file()


def test_the_operator_sets_it_from_the_command_line() -> None:
    runner = CliRunner()
    asked = runner.invoke(cli, ["plan", "qwen3-8b", "--hardware", "910B3x8", "--stream-interval", "1", "--json"])
    assert asked.exit_code == 0, asked.output
    document = json.loads(asked.output)
    assert "stream_interval" not in document["config"] or document["config"]["stream_interval"] == 1
    why = {e["key"]: e["why"] for e in document["explanations"]}["stream_interval"]
    assert why == "as asked (--stream-interval)"
    refused = runner.invoke(cli, ["plan", "qwen3-8b", "--hardware", "910B3x8", "--stream-interval", "0"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert "'--stream-interval': 0 is not in the range 1<=x<=256" in refused.output
