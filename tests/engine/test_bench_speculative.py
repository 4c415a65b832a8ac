"""`npuops launch --speculative ngram:3` and `npuops bench` on the real vLLM CPU engine (the tiny model).

The launched instance's vllm.yaml carries the plan's speculative_config, the engine serves with n-gram speculation
(its /metrics export the speculative-decoding counters), and the bench report gives the draft tokens proposed and
accepted between its two scrapes; where drafts were accepted the prediction beside the measurement uses that rate.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http_server import free_port
from tests.support.npuops_cli import npuops_argv
from tests.support.workspace import PLAN_FLAGS, Workspace, foreground_launch, foreground_workspace

pytestmark = [pytest.mark.engine, pytest.mark.slow]

START_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def speculating(engine_python: Path, tiny_model: Path, engine_compile_cache: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    root = tmp_path_factory.mktemp("bench-spec")
    ws = foreground_workspace(root, engine_python, engine_compile_cache)
    argv = npuops_argv("launch", str(tiny_model), *PLAN_FLAGS, "--speculative", "ngram:3", "--name", "s",
                       "--port", str(free_port()), "--vllm", str(engine_python.parent / "vllm"), "--foreground")
    try:
        with foreground_launch(argv, ws.env, root, START_TIMEOUT_S):
            yield ws
    finally:
        for tmp_dir in ws.tmp_dirs:
            shutil.rmtree(tmp_dir, ignore_errors=True)


def test_the_bench_reads_the_speculative_counters_of_a_speculating_instance(speculating: Workspace) -> None:
    config = (speculating.state / "s" / "vllm.yaml").read_text()
    assert "speculative-config" in config and '\\"method\\":\\"ngram\\"' in config
    record = json.loads((speculating.state / "s" / "instance.json").read_text())
    assert record["perf_inputs"]["spec_tokens"] == 3
    done = speculating.run("bench", "s", "--num-prompts", "8", "--output-len", "128", "--concurrency", "2",
                           "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["measured"]["completed"] == 8 and report["measured"]["failed"] == 0
    spec = report["speculative"]
    # The engine speculates (its counters exist and moved with the bench's steps); random prompts give the
    # n-gram proposer few matches, so how many drafts it made is the engine's business, not this test's.
    assert spec is not None and set(spec) == {"drafts", "draft_tokens", "accepted_tokens", "acceptance_rate"}
    assert 0 <= spec["accepted_tokens"] <= spec["draft_tokens"]
    text = speculating.run("bench", "s", "--num-prompts", "4", "--output-len", "32", "--concurrency", "1",
                           timeout=600)
    assert text.returncode == 0, text.stderr[-3000:]
    assert "TPOT" in text.stdout
