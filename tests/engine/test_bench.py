"""`npuops launch --foreground` and `npuops bench` against it, with the real vLLM CPU engine (the tiny model).

One foreground launch (with an API key) for the module. It proves: vLLM's own `vllm bench serve` runs with the
key from the instance's env file and gives every figure beside the plan's prediction and the hardware's limit;
the report is kept and `npuops status` shows it; the bench calibrates the node, so the next `npuops plan` of the
same workload predicts within 10% of what was measured, and `--no-calibration` gives the shared constants back;
the plain-PyTorch baseline runs the same prompts and gives vLLM/plain ratios; a URL gives the figures alone.
Last, the launch itself (it ran the files npuops rendered): its progress in order, the plan's KV capacity equal
to the engine's, the key required and on no command line, status/list/logs, a conflicting launch refused, and a
stop that drains: four answers streaming when it begins all finish whole before it returns. The tests run in this
order (one xdist group: tests/support/scheduling.py).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_server import free_port, http_request
from tests.support.npuops_cli import npuops_argv
from tests.support.streams import DRAIN_STREAMS, DRAIN_TOKENS, StreamedAnswer, drained_as_the_engine_said
from tests.support.workspace import (
    PLAN_FLAGS,
    Workspace,
    foreground_launch,
    foreground_workspace,
    group_alive,
    kill_group,
    wait_for,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# An engine start on a 2-core CI machine whose other worker serves, streams and restarts engines (the
# rollout tests) took over 240 s (run L): the wait is for the start, not a bound on it.
START_TIMEOUT_S = 600.0
LOAD = ("--input-len", "128", "--output-len", "16", "--concurrency", "4")
# The plan's flags with the bench's load, so `npuops plan` predicts the same workload.
PLANNED = (*PLAN_FLAGS[: PLAN_FLAGS.index("--input-len")], *PLAN_FLAGS[PLAN_FLAGS.index("--output-len") + 2:], *LOAD)
# The bench's own load as a plan states it: every request exactly those lengths (a closed loop in waves).
PLANNED_AS_BENCHED = (*PLANNED, "--fixed-lengths")


@dataclass
class BenchedInstance:
    ws: Workspace
    model: Path
    port: int
    engine_python: Path
    launcher: subprocess.Popen[bytes]
    root: Path  # launch.out and launch.err: the foreground launch's summary and progress


@pytest.fixture(scope="module")
def instance(engine_python: Path, tiny_model: Path, engine_compile_cache: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchedInstance]:
    root = tmp_path_factory.mktemp("bench")
    ws = foreground_workspace(root, engine_python, engine_compile_cache)
    key_file = root / "api-key"
    key_file.write_text("sk-bench-key\n")
    key_file.chmod(0o600)
    port = free_port()
    argv = npuops_argv("launch", str(tiny_model), *PLANNED, "--name", "b", "--port", str(port),
                       "--vllm", str(engine_python.parent / "vllm"), "--api-key-file", str(key_file), "--foreground")
    try:
        with foreground_launch(argv, ws.env, root, START_TIMEOUT_S) as launcher:
            yield BenchedInstance(ws, tiny_model, port, engine_python, launcher, root)
    finally:
        for tmp_dir in ws.tmp_dirs:
            shutil.rmtree(tmp_dir, ignore_errors=True)


def bench(inst: BenchedInstance, *args: str, timeout: float = 600) -> dict[str, object]:
    done = inst.ws.run("bench", *args, "--json", timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert isinstance(report, dict)
    return report


def checked_bench_report(instance: BenchedInstance) -> dict[str, Any]:
    done = instance.ws.run("bench", "b", "--num-prompts", "24", "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "vllm bench serve" in done.stderr  # the progress line
    report = json.loads(done.stdout)
    measured = report["measured"]
    # The plan's load by default, every request answered with exactly its output length (--ignore-eos), which
    # also proves the key from the env file reached the tool: without it every request is a 401.
    seed = report["load"].pop("seed")
    assert isinstance(seed, int) and seed >= 0  # a fresh one: prompts new to the instance's prefix cache
    assert report["load"] == {"input_len": 128, "output_len": 16, "concurrency": 4, "request_rate": None,
                              "num_prompts": 24}
    # The engine's own prefix-cache counters around the bench. A fresh seed's prompts are new to the instance, but
    # vLLM's random prompts are runs of consecutive token ids from a random start (datasets.py
    # generate_token_sequence), so on the tiny model's 1024-token vocabulary two of one bench's 24 prompts start
    # alike by chance (a CI run saw 4 such block hits besides the warm-ups'): most prompt tokens still miss.
    cache = report["prefix_cache"]
    assert cache["queried_tokens"] >= 24 * 128 and cache["hit_rate"] < 0.5, cache
    assert measured["completed"] == 24 and measured["failed"] == 0
    assert measured["total_output_tokens"] == 24 * 16
    # The client's TPOT and ITL may be 0.00 ms: the plan streams the tiny model's tokens several a chunk, and a
    # 16-token reply can arrive in one or two chunks (then the engine's histograms time the steps, below).
    for metric in ("ttft", "tpot", "itl", "e2el"):
        figures = measured["latency"][metric]
        assert 0 <= figures["median_ms"] <= figures["p99_ms"]
        assert figures["median_ms"] > 0 or metric in ("tpot", "itl")
    assert measured["output_throughput"] > 0 and measured["request_throughput"] > 0
    ratios, predicted = report["ratios"], report["predicted"]
    for key in ("ttft", "tpot", "itl", "e2el", "output_throughput", "request_throughput"):
        assert ratios[key] is not None and ratios[key] > 0
    # The engine's own histograms around the bench: every measured request and the warm-ups (one per slot).
    engine, timing = report["engine"], report["timing"]
    for metric in ("ttft", "tpot", "e2el"):
        assert 24 <= engine[metric]["count"] <= 24 + 4 and engine[metric]["mean_ms"] > 0, engine
    assert engine["itl"]["count"] >= 24 * 15
    # The figures that time the engine: the client's medians on a steady stream, the engine's means when the
    # stream came in bursts (a busy host) or in chunks (the plan's --stream-interval), which the report names.
    # Either way the bench times the steps.
    assert timing["timed"] is True and timing["source"] in ("client", "engine"), timing
    if timing["source"] == "engine":
        assert "bursts" in report["stream_note"] or "tokens a chunk" in report["stream_note"]
        assert timing["tpot_ms"] == engine["tpot"]["mean_ms"]
    else:
        assert report["stream_note"] is None
        assert timing["tpot_ms"] == measured["latency"]["tpot"]["median_ms"]
    assert ratios["tpot"] == pytest.approx(timing["tpot_ms"] / predicted["tpot_ms"], rel=1e-2)
    # The CPU host's roofline from its own memory bandwidth, measured by this first bench and kept.
    limit = report["hardware_limit"]
    assert limit["memory"] == "host memory" and "measured on this host" in limit["bandwidth_source"]
    kept = json.loads((instance.ws.state / "calibration.json").read_text())["host_memory_bandwidth"]
    assert kept[report["hardware"]]["bytes_per_s"] == limit["bandwidth_bytes_per_s"] > 1e9
    assert 0 < limit["decode_fraction"] < 1 and 0 < limit["prefill_fraction"] < 1
    assert report["calibration"]["samples"] == 1 and report["calibration"]["figures"] == timing["source"]
    assert report["stack"]["vllm"] and report["hardware"].startswith("cpu (")
    assert "sk-bench-key" not in done.stdout + done.stderr
    assert "sk-bench-key" not in json.dumps(report["vllm_bench_argv"])
    return report


def test_bench_gives_every_figure_beside_the_prediction_and_calibrates_the_plan(instance: BenchedInstance) -> None:
    report = checked_bench_report(instance)
    measured, timing = report["measured"], report["timing"]

    # Kept with the instance, and status shows it.
    kept = Path(report["file"])
    assert kept.parent == instance.ws.state / "b" / "bench" and json.loads(kept.read_text())["at"] == report["at"]
    status = instance.ws.status("b")
    assert status["last_bench"]["output_throughput"] == pytest.approx(measured["output_throughput"], rel=1e-3)
    text = instance.ws.run("status", "b").stdout
    assert "bench     " in text and "x predicted" in text

    # The next plan of the same workload on this node predicts what was measured (the figures that timed the
    # engine), within 10%.
    planned = instance.ws.run("plan", str(instance.model), *PLANNED_AS_BENCHED, "--json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["calibration"]["applied"] is not None, plan["calibration"]["why"]
    assert plan["calibration"]["applied"]["samples"] == 1
    p = plan["prediction"]
    assert p["ttft_ms"] == pytest.approx(timing["ttft_ms"], rel=0.10)
    assert p["tpot_ms"] == pytest.approx(timing["tpot_ms"], rel=0.10)
    assert p["output_tokens_per_s"] == pytest.approx(measured["output_throughput"], rel=0.10)
    uncalibrated = instance.ws.run("plan", str(instance.model), *PLANNED_AS_BENCHED, "--json", "--no-calibration")
    assert json.loads(uncalibrated.stdout)["prediction"] == plan["calibration"]["uncalibrated_prediction"]
    human = instance.ws.run("plan", str(instance.model), *PLANNED).stdout
    human = " ".join(human.split())  # the text wraps at the terminal's width
    assert "calibration" in human and "from 1 bench on cpu" in human

    # The same seed again sends the same prompts: the engine finds them in its prefix cache, and the report says so.
    # (256-token prompts: the CPU engine caches whole 128-token blocks and always computes a prompt's last token,
    # so a 128-token prompt can never be a hit.)
    longer = ("--input-len", "256", "--num-prompts", "24", "--no-calibrate", "--json")
    first = json.loads(instance.ws.run("bench", "b", *longer, timeout=600).stdout)
    assert first["prefix_cache"]["repeated_prompts"] is False, first["prefix_cache"]
    again = instance.ws.run("bench", "b", *longer[:-1], "--seed", str(first["load"]["seed"]), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "TTFT measures partly cached prompts: give another --seed" in again.stdout, again.stdout


def test_a_url_gives_the_figures_alone(instance: BenchedInstance, tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-bench-key\n")
    report = bench(instance, f"http://127.0.0.1:{instance.port}", "--model", str(instance.model),
                   "--api-key-file", str(key), "--vllm", str(instance.engine_python.parent / "vllm"),
                   "--num-prompts", "8", "--output-len", "4", "--input-len", "32", "--concurrency", "2")
    assert report["measured"]["completed"] == 8 and report["predicted"] is None and report["instance"] is None
    assert "no plan" in report["prediction_note"]


def test_the_baseline_runs_the_same_prompts_through_plain_pytorch(instance: BenchedInstance) -> None:
    done = instance.ws.run("bench", "b", "--baseline", "transformers", "--num-prompts", "8", "--no-calibrate",
                           "--json", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "transformers generate" in done.stderr and "batch 2/2 done" in done.stderr  # its progress, relayed
    report = json.loads(done.stdout)
    baseline = report["baseline"]
    plain = baseline["measured"]
    # The same load: 8 prompts of 128 tokens, 16 out each, in static batches of the concurrency (4), float32.
    assert plain["backend"] == "transformers" and plain["completed"] == 8
    assert plain["total_output_tokens"] == report["measured"]["total_output_tokens"] == 8 * 16
    assert baseline["device"] == "cpu" and baseline["dtype"] == "float32"
    ratios = baseline["ratios"]
    assert ratios["output_throughput_ratio"] == pytest.approx(
        report["measured"]["output_throughput"] / plain["output_throughput"], rel=1e-3)
    assert ratios["e2el_reduction"] == pytest.approx(
        1 - report["measured"]["latency"]["e2el"]["median_ms"] / plain["latency"]["e2el"]["median_ms"], abs=1e-3)
    # The key keeps its name (bench --json keeps its shape); docs/claims.md says what it holds.
    assert baseline["founding_claim"] == {"throughput_ratio": 1.7, "latency_reduction": 0.4}
    human = instance.ws.run("bench", "b", "--num-prompts", "4", "--no-calibrate", "--baseline", "transformers",
                            timeout=900).stdout
    assert "vLLM / plain: throughput x" in human
    assert "the claim tested (docs/claims.md): throughput x1.7, end-to-end latency -40%" in human


def authorized_post(url: str, data: dict[str, object], key: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(data).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return int(resp.status), resp.read()


def every_cmdline() -> str:
    """Every process's command line on this machine (where a secret must never appear)."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
    return " ".join(lines)


def test_the_launch_reported_its_stages_served_the_plan_and_stops_cleanly(instance: BenchedInstance) -> None:
    """Runs last: it stops the module's instance."""
    ws, port = instance.ws, instance.port
    progress = (instance.root / "launch.err").read_text()
    # The stages arrived in order, from the engine's own log lines, and "healthy" only from /health.
    positions = [progress.find(s) for s in ("start gate for b", "loading weights",
                                            "KV cache allocated (262,144 tokens)", "listening", "healthy (")]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), progress
    summary = (instance.root / "launch.out").read_text()
    assert f"http://127.0.0.1:{port}/v1" in summary and "first      8 token(s)" in summary

    # The engine ran the files npuops rendered, and its KV capacity is the plan's to the token.
    planned = json.loads(ws.run("plan", str(instance.model), *PLANNED, "--json").stdout)["memory"]["kv_cache_tokens"]
    state = ws.status("b")
    assert state["state"] == "healthy" and state["manager"] == "foreground"
    metrics = state["metrics"]
    assert isinstance(metrics, dict) and metrics["kv_cache_tokens"] == planned == 262144
    assert metrics["generation_tokens_total"] >= 12

    # The key reached the engine through the env file (never a command line): without it, 401.
    request = {"model": "tiny-llama", "prompt": "one two", "max_tokens": 4, "temperature": 0}
    status, _ = http_request(f"http://127.0.0.1:{port}/v1/completions", data=request)
    assert status == 401
    status, body = authorized_post(f"http://127.0.0.1:{port}/v1/completions", request, "sk-bench-key")
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4
    assert json.loads(body)["choices"][0]["finish_reason"] in ("length", "stop")
    assert "sk-bench-key" not in every_cmdline()

    listed = json.loads(ws.run("list", "--json").stdout)["instances"]
    assert [(i["name"], i["state"]) for i in listed] == [("b", "healthy")]
    logs = ws.run("logs", "b", "-n", "400")
    assert logs.returncode == 0 and "Starting vLLM server on" in logs.stdout
    json_logs = json.loads(ws.run("logs", "b", "-n", "400", "--json").stdout)
    assert json_logs["name"] == "b" and any("KV cache size" in line for line in json_logs["lines"])

    # Another instance on the same port is refused before anything starts.
    clash = ws.run("launch", str(instance.model), *PLAN_FLAGS, "--name", "other", "--port", str(port),
                   "--vllm", str(instance.engine_python.parent / "vllm"), "--foreground")
    assert clash.returncode == 3 and "already used by instance 'b'" in clash.stderr, clash.stderr
    assert clash.stderr.count("\n") == 1

    # A stop drains: the answers streaming when `npuops stop` begins all finish, whole, and stop returns once
    # they have (the plan's drain timeout, vLLM's --shutdown-timeout, is 30 s here). Enough of them that the
    # engine is still generating when the stop begins (a few would be generated before their streams end).
    config = (ws.state / "b" / "vllm.yaml").read_text()
    assert "shutdown-timeout: 30" in config
    # The tiny model's tokens come far faster than a reader needs: the plan streams them several a chunk.
    interval = int(config.split("stream-interval: ", 1)[1].split()[0])
    engine_pgid = int(ws.supervisor_state("b")["engine_pid"])  # type: ignore[call-overload]
    streams = [StreamedAnswer(port, "sk-bench-key", f"stream {i} says", DRAIN_TOKENS) for i in range(DRAIN_STREAMS)]
    try:
        for stream in streams:
            stream.start()
        wait_for(lambda: all(s.chunks >= 8 for s in streams), 120, "four answers streaming")
        stopping = ws.run("stop", "b", "--json", timeout=120)
        stop_returned = time.monotonic()
        for stream in streams:
            stream.join(60)
        assert stopping.returncode == 0 and json.loads(stopping.stdout)["ok"], stopping.stdout + stopping.stderr
        for stream in streams:
            assert stream.whole(), (stream.error, stream.finish_reason, stream.completion_tokens)  # not cut
            # vLLM honours the plan's --stream-interval: the first token alone, then `interval` a chunk, the
            # usage chunk, and one to spare.
            assert stream.chunks <= 1 + -(-(DRAIN_TOKENS - 1) // interval) + 2, (stream.chunks, interval)
            assert stream.ended_at is not None and stream.ended_at <= stop_returned
        assert instance.launcher.wait(timeout=60) == 0, progress[-2000:]
        said = (instance.root / "launch.err").read_text()
        assert "b stopped" in said
        # What the engine still had to generate when the stop began (on a busy host it may have generated every
        # token already, the API server still sending them: nothing to count), the supervisor said, down to none
        # (what `npuops status` shows meanwhile).
        assert drained_as_the_engine_said((ws.state / "b" / "engine.log").read_text(), said, "b")
        wait_for(lambda: not group_alive(engine_pgid), 10, "the engine's process group to be gone")
    finally:
        kill_group(engine_pgid)
    stopped = ws.status("b")
    assert stopped["state"] == "stopped" and not stopped["healthy"]
