"""The tune's search space, its guide, and the tuned file launch reads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from npuops.bench.tune import Candidate, Slo, Trial, _stop_launcher, expected, search_space
from npuops.bench.tuned import read_tuned, write_tuned
from npuops.errors import BadInputError
from npuops.hardware.cpu_features import parse_cpu_features
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, PlanRequest, Workload
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target, parse_hardware_spec
from npuops.settings import Settings
from tests.support.model_dirs import write_tiny_model
from tests.support.paths import REPO

CPUINFO = REPO / "tests" / "fixtures" / "cpuinfo"


def test_the_space_starts_from_the_plan_and_keeps_batches_above_sequences() -> None:
    plan = make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x8"), Workload(concurrency=16), PlanOptions())
    space = search_space(plan)
    first = space[0].fixed
    assert first["max_num_seqs"] == plan.server.max_num_seqs
    assert first["max_num_batched_tokens"] == plan.server.max_num_batched_tokens
    assert all(c.fixed["max_num_batched_tokens"] >= c.fixed["max_num_seqs"] for c in space)
    # On NPUs the memory fraction and the TP/replica split are searched too.
    assert {c.fixed["gpu_memory_utilization"] for c in space} == {0.85, 0.9, 0.95}
    assert {c.fixed["tensor_parallel_size"] for c in space} >= {plan.layout.tp, 8}
    assert {4, 8, 16, 32} <= {c.fixed["max_num_seqs"] for c in space}


def test_the_space_searches_dtype_and_compilation_where_the_target_runs_both(tmp_path: Path) -> None:
    model = load_model(str(write_tiny_model(tmp_path / "tiny")))
    epyc = parse_cpu_features((CPUINFO / "amd-epyc-kvm-avx512bf16-test-machine.txt").read_text())
    cpu = cpu_target(16 * 2**30, 2, 1, features=epyc)
    plan = make_plan(model, cpu, Workload(128, 32, concurrency=8), PlanOptions())
    space = search_space(plan)
    # The plan's own configuration first: bfloat16 (avx512_bf16), compiled.
    assert space[0].fixed["dtype"] == "bfloat16" and space[0].fixed["enforce_eager"] is False
    assert {(c.fixed["dtype"], c.fixed["enforce_eager"]) for c in space} == {
        ("bfloat16", False), ("bfloat16", True), ("float32", False), ("float32", True)}
    # What the operator fixed is not searched.
    fixed = search_space(make_plan(model, cpu, Workload(128, 32, concurrency=8),
                                   PlanOptions(dtype="float32", enforce_eager=True)))
    assert all("dtype" not in c.fixed and "enforce_eager" not in c.fixed for c in fixed)
    assert len(space) == 4 * len(fixed)
    # A2 and 310P capture graphs on the default release, so they also run eager (a 310P release before 0.20.2rc1
    # only runs eager); NPU dtypes run alike.
    a2 = search_space(make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x8"), Workload(concurrency=16)))
    assert {c.fixed["enforce_eager"] for c in a2} == {False, True} and all("dtype" not in c.fixed for c in a2)
    p310 = search_space(make_plan(load_model("qwen2.5-7b-instruct"), parse_hardware_spec("310P3x4"),
                                  Workload(concurrency=4)))
    assert {c.fixed["enforce_eager"] for c in p310} == {False, True}
    old_310p = search_space(make_plan(load_model("qwen2.5-7b-instruct"), parse_hardware_spec("310P3x4"),
                                      Workload(concurrency=4), PlanOptions(vllm_ascend_version="0.19.1rc1")))
    assert all("enforce_eager" not in c.fixed for c in old_310p)


def test_the_guide_corrects_by_a_trial_of_the_same_dtype_and_mode_first() -> None:
    bf16 = Candidate((("max_num_seqs", 8), ("dtype", "bfloat16"), ("enforce_eager", False)))
    fp32_near = Trial(Candidate((("max_num_seqs", 8), ("dtype", "float32"), ("enforce_eager", False))),
                      {"output_tokens_per_s": 100.0, "ttft_ms": 10.0, "tpot_ms": 1.0, "e2e_ms": 50.0},
                      measured={"output_tokens_per_s": 50.0, "ttft_ms": 10.0, "tpot_ms": 1.0, "e2e_ms": 50.0})
    bf16_far = Trial(Candidate((("max_num_seqs", 16), ("dtype", "bfloat16"), ("enforce_eager", False))),
                     {"output_tokens_per_s": 100.0, "ttft_ms": 10.0, "tpot_ms": 1.0, "e2e_ms": 50.0},
                     measured={"output_tokens_per_s": 200.0, "ttft_ms": 10.0, "tpot_ms": 1.0, "e2e_ms": 50.0})
    predicted = {"output_tokens_per_s": 100.0, "ttft_ms": 10.0, "tpot_ms": 1.0, "e2e_ms": 50.0}
    # Twice the sequences is nearer than another dtype: the bfloat16 trial's 2x correction applies.
    assert expected(bf16, predicted, [fp32_near, bf16_far], Slo()) == (1, 200.0)


def test_the_guide_trusts_the_nearest_measurement_and_the_slo() -> None:
    a = Candidate((("max_num_seqs", 8), ("max_num_batched_tokens", 512)))
    b = Candidate((("max_num_seqs", 16), ("max_num_batched_tokens", 512)))
    predicted = {"output_tokens_per_s": 100.0, "ttft_ms": 10.0, "tpot_ms": 1.0, "e2e_ms": 50.0}
    assert expected(b, predicted, [], Slo()) == (1, 100.0)
    tried = Trial(a, predicted, measured={"output_tokens_per_s": 50.0, "ttft_ms": 30.0, "tpot_ms": 2.0,
                                          "e2e_ms": 100.0})
    # The measured trial ran at half the predicted throughput and twice the TPOT: so will its neighbour.
    assert expected(b, predicted, [tried], Slo()) == (1, 50.0)
    assert expected(b, predicted, [tried], Slo(tpot_ms=1.5)) == (0, 50.0)
    assert Slo(ttft_ms=20).violations(30.0, 1.0, 1.0) == ["TTFT 30.0 ms > 20 ms"]


def test_a_tuned_file_round_trips_and_launch_reads_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    request = PlanRequest(model=str(write_tiny_model(tmp_path / "tiny-llama")), hardware="cpu",
                          workload=Workload(input_len=256, concurrency=16),
                          fixed={"max_num_seqs": 16, "max_num_batched_tokens": 1024, "dtype": "float32"})
    path = tmp_path / "tuned.json"
    write_tuned(path, request, {"tuned": {"trials": 3}})
    assert read_tuned(path) == request
    # A flag given over it changes that value and keeps the rest (the request's --dp and --tp among them).
    over = request.with_flags({"max_num_seqs": 8, "dp": 2, "tp": 1})
    assert over.fixed["max_num_seqs"] == 8 and over.fixed["max_num_batched_tokens"] == 1024
    assert over.replicas == 2 and over.workload.input_len == 256 and over.fixed["tensor_parallel_size"] == 1
    # launch --tuned: the file's configuration, with a flag given on the command line over it.
    done = subprocess.run([sys.executable, "-m", "npuops", "launch", "--tuned", str(path), "--max-num-seqs", "8",
                           "--dry-run", "--output", str(out), "--json"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    config = next(out.rglob("vllm.yaml")).read_text()
    assert "max-num-seqs: 8" in config and "max-num-batched-tokens: 1024" in config


@pytest.mark.parametrize(("text", "problem"), [("{", "not JSON"), ('{"format": "x"}', "not a tuned configuration"),
                                               ('{"format": "npuops-tuned/1", "request": {}}', "malformed")])
def test_a_file_that_is_not_a_tuned_one_is_one_error(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(BadInputError, match=problem):
        read_tuned(path)


def test_a_trial_launch_without_a_record_yet_is_ended_with_its_session(tmp_path: Path) -> None:
    """A trial that times out before launch wrote the instance's record has no supervisor to ask: the launch's
    own session (it and what it started) is ended instead."""
    launcher = subprocess.Popen([sys.executable, "-c", "import subprocess, time; "
                                 "subprocess.Popen(['sleep', '300']); time.sleep(300)"], start_new_session=True)
    _stop_launcher(Settings(state_dir=tmp_path / "state"), "never-written", launcher)
    assert launcher.poll() is not None

    def left() -> list[int]:  # the group's processes still running (an orphan's zombie waits for init)
        return [p.pid for p in psutil.process_iter(["status"]) if p.info["status"] != psutil.STATUS_ZOMBIE
                and _pgid(p.pid) == launcher.pid]

    for _ in range(50):  # the signal reaches them all at once; dying takes them a moment
        if not left():
            break
        time.sleep(0.1)
    assert left() == []


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
