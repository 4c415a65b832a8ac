"""`npuops launch --speculative ngram:3` and `npuops bench` on the real vLLM CPU engine (the tiny model).

The launched instance's vllm.yaml carries the plan's speculative_config, the engine serves with n-gram speculation
(its /metrics export the speculative-decoding counters, which a looping greedy completion moves, and npuops reads
the acceptance rate from them), and the bench report gives the draft tokens proposed and accepted between its two
scrapes; where drafts were accepted the prediction beside the measurement uses that rate.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.http_server import free_port, http_request
from tests.support.npuops_cli import npuops_argv
from tests.support.workspace import PLAN_FLAGS, Workspace, foreground_launch, foreground_workspace

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# An engine start on a 2-core CI machine whose other worker serves, streams and restarts engines (the
# rollout tests) took over 240 s (run L): the wait is for the start, not a bound on it.
START_TIMEOUT_S = 600.0


@dataclass
class Speculating:
    ws: Workspace
    port: int


@pytest.fixture(scope="module")
def speculating(engine_python: Path, tiny_model: Path, engine_compile_cache: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Speculating]:
    root = tmp_path_factory.mktemp("bench-spec")
    ws = foreground_workspace(root, engine_python, engine_compile_cache)
    port = free_port()
    argv = npuops_argv("launch", str(tiny_model), *PLAN_FLAGS, "--speculative", "ngram:3", "--name", "s",
                       "--port", str(port), "--vllm", str(engine_python.parent / "vllm"), "--foreground")
    try:
        with foreground_launch(argv, ws.env, root, START_TIMEOUT_S):
            yield Speculating(ws, port)
    finally:
        for tmp_dir in ws.tmp_dirs:
            shutil.rmtree(tmp_dir, ignore_errors=True)


def test_ngram_speculation_drafts_and_its_acceptance_rate_is_read(speculating: Speculating) -> None:
    from npuops.instance.endpoint import scrape_metrics
    from npuops.instance.metrics import spec_decode_use

    logs = speculating.ws.run("logs", "s", "-n", "2000")
    assert "ngram" in logs.stdout.lower(), logs.stdout[-3000:]
    url = f"http://127.0.0.1:{speculating.port}"
    before = scrape_metrics(url, timeout=10.0)
    # Greedy decoding of a random tiny model falls into a loop, which the n-gram proposer then drafts.
    request = {"model": "tiny-llama", "prompt": "a b c d a b c", "max_tokens": 400, "temperature": 0}
    status, body = http_request(f"{url}/v1/completions", data=request, timeout=300)
    assert status == 200, body[:500]
    assert json.loads(body)["choices"][0]["text"]
    after = scrape_metrics(url, timeout=10.0)
    assert before is not None and after is not None
    use = spec_decode_use(before, after)
    assert use is not None, "the engine exports no speculative-decoding counters"
    assert use["drafts"] > 0 and use["draft_tokens"] > 0, use
    assert 0 < use["accepted_tokens"] <= use["draft_tokens"]
    assert use["acceptance_rate"] == round(use["accepted_tokens"] / use["draft_tokens"], 4)


def test_the_bench_reads_the_speculative_counters_of_a_speculating_instance(speculating: Speculating) -> None:
    ws = speculating.ws
    config = (ws.state / "s" / "vllm.yaml").read_text()
    assert "speculative-config" in config and '\\"method\\":\\"ngram\\"' in config
    record = json.loads((ws.state / "s" / "instance.json").read_text())
    assert record["perf_inputs"]["spec_tokens"] == 3
    done = ws.run("bench", "s", "--num-prompts", "8", "--output-len", "128", "--concurrency", "2",
                           "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["measured"]["completed"] == 8 and report["measured"]["failed"] == 0
    spec = report["speculative"]
    # The engine speculates (its counters exist and moved with the bench's steps); random prompts give the
    # n-gram proposer few matches, so how many drafts it made is the engine's business, not this test's.
    assert spec is not None and set(spec) == {"drafts", "draft_tokens", "accepted_tokens", "acceptance_rate"}
    assert 0 <= spec["accepted_tokens"] <= spec["draft_tokens"]
    text = ws.run("bench", "s", "--num-prompts", "4", "--output-len", "32", "--concurrency", "1",
                           timeout=600)
    assert text.returncode == 0, text.stderr[-3000:]
    assert "TPOT" in text.stdout
