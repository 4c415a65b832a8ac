"""`npuops tune`: a guided search for the highest throughput within latency SLOs, every trial a real engine.

The space is vLLM's batching knobs around the workload — `max_num_seqs` the plan's and from a quarter of the
concurrency to twice it, `max_num_batched_tokens` from an eighth of the plan's to the plan's — the dtype and
eager/compiled where the target runs both and the operator fixed neither (the CPU engine: bfloat16 or float32,
torch.compile or eager; A2/A3: graphs or eager) and, on NPUs, `gpu_memory_utilization` and the TP/replica split
where the chips allow. Each candidate is planned (the planner
still checks that it fits) and predicted by the performance model, calibrated by this node's benches.

The search starts from the plan's own configuration, then always runs the untried candidate with the best expected
objective: the model's prediction corrected by what the nearest tried candidate measured against its own prediction
(so the model gives the shape, the trials the level). A candidate predicted to break an SLO counts only when nothing
else is left. Each trial is launched from a tuned file with `npuops launch --tuned FILE --foreground` (npuops'
supervisor, the same start gate and health checks), measured with `npuops bench`'s core, and stopped through its own
supervisor — never by a process-name kill. Every bench also calibrates the node.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from npuops.bench.run import BenchRequest, run_bench
from npuops.bench.tuned import write_tuned
from npuops.errors import BadInputError, MeasurementError
from npuops.httpclient import base_url
from npuops.instance.control import stop_foreground
from npuops.instance.endpoint import health_ok
from npuops.instance.record import load_record
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanRequest
from npuops.plan.model import ModelSpec
from npuops.plan.planner import make_plan
from npuops.plan.request import node_calibration, resolve_target
from npuops.plan.result import Plan
from npuops.plan.target import HardwareTarget
from npuops.settings import Settings

PHASES = ("launch", "healthy", "bench", "stop")
# The dtypes the CPU engine computes in (float16 is planned as bfloat16 there).
CPU_DTYPES = ("bfloat16", "float32")


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def violations(self, ttft: float, tpot: float, e2e: float) -> list[str]:
        out = []
        for name, limit, value in (("TTFT", self.ttft_ms, ttft), ("TPOT", self.tpot_ms, tpot),
                                   ("end-to-end", self.e2e_ms, e2e)):
            if limit is not None and value > limit:
                out.append(f"{name} {value:.1f} ms > {limit:g} ms")
        return out

    def as_dict(self) -> dict[str, float | None]:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2e_ms": self.e2e_ms}


@dataclass(frozen=True)
class TuneRequest:
    plan: PlanRequest
    output: Path
    budget: int = 6
    slo: Slo = field(default_factory=Slo)
    name: str = "tune"
    port: int = 18700
    vllm: str | None = None
    num_prompts: int | None = None
    start_timeout_s: float = 900.0


@dataclass(frozen=True)
class Candidate:
    """One point of the space: the vLLM options a trial fixes on top of the plan request."""

    options: tuple[tuple[str, Any], ...]

    @property
    def fixed(self) -> dict[str, Any]:
        return dict(self.options)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.options)


@dataclass
class Trial:
    candidate: Candidate
    predicted: dict[str, float]
    measured: dict[str, float] | None = None
    error: str | None = None
    slo_violations: list[str] = field(default_factory=list)
    # Why the bench's TTFT and TPOT are the engine's own (a stream in bursts or in chunks), or why nothing timed
    # the engine's steps (timed False: not stored as a calibration sample); None for a steady stream.
    stream_note: str | None = None
    timed: bool = False

    @property
    def ok(self) -> bool:
        return self.measured is not None and not self.slo_violations

    def as_dict(self) -> dict[str, Any]:
        return {"options": self.candidate.fixed, "predicted": self.predicted, "measured": self.measured,
                "error": self.error, "slo_violations": self.slo_violations, "meets_slo": self.ok,
                "stream_note": self.stream_note, "timed": self.timed}


def _around(value: int, factors: tuple[float, ...], low: int, high: int) -> list[int]:
    return sorted({min(high, max(low, round(value * f))) for f in factors})


def _mode_axes(plan: Plan) -> list[list[tuple[str, Any]]]:
    """The dtype and eager/compiled axes, where the target runs both and the operator fixed neither: the CPU engine
    computes in bfloat16 or float32 and compiles or not; an Ascend family with graph capture (A2, A3 on a release
    that has it) runs graphs or eager (its dtypes, bfloat16 and float16, run at the same rate: not searched)."""
    axes: list[list[tuple[str, Any]]] = []
    options = plan.options
    if plan.target.kind == "cpu" and options.fixed("dtype") is None:
        axes.append([("dtype", d) for d in CPU_DTYPES])
    graphs = plan.target.kind == "cpu" or plan.rules.graph_mode(plan.release, eager=False) != "eager"
    if graphs and options.fixed("enforce_eager") is None:
        axes.append([("enforce_eager", e) for e in (False, True)])
    return axes


def search_space(plan: Plan) -> list[Candidate]:
    """The candidates around the plan (its own configuration first)."""
    s = plan.server
    concurrency = max(plan.workload.concurrency, 1)
    seqs_cap = max(int(s.max_num_seqs or concurrency), 1)
    seqs = sorted({*_around(concurrency, (0.25, 0.5, 1.0, 2.0), 1, seqs_cap), seqs_cap})
    batched_plan = int(s.max_num_batched_tokens or 2048)
    batched = _around(batched_plan, (0.125, 0.25, 0.5, 1.0), 1, batched_plan)
    axes: list[list[tuple[str, Any]]] = [[("max_num_seqs", n) for n in seqs],
                                         [("max_num_batched_tokens", b) for b in batched], *_mode_axes(plan)]
    if plan.target.kind == "npu":
        axes.append([("gpu_memory_utilization", u) for u in (0.85, 0.9, 0.95)])
        chips = plan.target.devices_per_node
        tps = [t for t in (1, 2, 4, 8, 16) if t <= chips and chips % t == 0 and t >= plan.layout.tp]
        if len(tps) > 1:
            axes.append([("tensor_parallel_size", t) for t in tps])
    points: list[tuple[tuple[str, Any], ...]] = [()]
    for axis in axes:
        points = [(*p, choice) for p in points for choice in axis]
    # vLLM refuses a step budget below the sequences it may schedule.
    valid = [Candidate(p) for p in points if dict(p)["max_num_batched_tokens"] >= dict(p)["max_num_seqs"]]
    own = {"max_num_seqs": seqs_cap, "max_num_batched_tokens": batched_plan, "dtype": s.dtype,
           "enforce_eager": plan.graph_mode == "eager"}
    valid.sort(key=lambda c: 0 if all(c.fixed.get(k, v) == v for k, v in own.items()) else 1)
    return valid


def _predict(settings: Settings, request: PlanRequest, model: ModelSpec, target: HardwareTarget,
             candidate: Candidate) -> dict[str, float] | None:
    """The calibrated prediction of a candidate, or None when the planner says it does not fit."""
    # Trials are benches: fixed lengths, so a closed loop runs in waves (what the trial's bench is predicted as).
    plan_request = replace(request, fixed={**dict(request.fixed), **candidate.fixed},
                           workload=replace(request.workload, fixed_lengths=True))
    try:
        plan = make_plan(model, target, plan_request.workload, plan_request.options,
                         node_calibration(settings, target, ignore=plan_request.no_calibration))
    except BadInputError:
        return None
    return plan.prediction.as_dict()


def _distance(a: Candidate, b: Candidate) -> float:
    """How far apart two candidates are: the log ratio of each number, and a whole step for each choice that differs
    (a dtype, eager or compiled), so a trial with the same dtype and mode corrects a prediction before one without."""
    total = 0.0
    for key, value in a.fixed.items():
        other = b.fixed.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            total += 0.0 if value == other else 1.0
        elif isinstance(other, (int, float)) and not isinstance(other, bool) and other > 0 and value > 0:
            total += math.log(float(value) / float(other)) ** 2
    return math.sqrt(total)


def expected(candidate: Candidate, predicted: dict[str, float], tried: list[Trial], slo: Slo) -> tuple[int, float]:
    """(meets the SLO as expected, expected throughput): the model's prediction scaled by the nearest measured
    trial's measured/predicted."""
    correction = {"output_tokens_per_s": 1.0, "ttft_ms": 1.0, "tpot_ms": 1.0, "e2e_ms": 1.0}
    measured = [t for t in tried if t.measured is not None]
    if measured:
        nearest = min(measured, key=lambda t: _distance(candidate, t.candidate))
        assert nearest.measured is not None
        correction = {k: nearest.measured[k] / nearest.predicted[k] if nearest.predicted[k] else 1.0
                      for k in correction}
    value = {k: predicted[k] * correction[k] for k in correction}
    meets = not slo.violations(value["ttft_ms"], value["tpot_ms"], value["e2e_ms"])
    return (1 if meets else 0, value["output_tokens_per_s"])


def _measured(report: dict[str, Any]) -> dict[str, float]:
    """A trial's figures: TTFT and TPOT as the bench's timing chose them (the engine's when the client's stream
    could not time the steps), the rest from the client."""
    m, timing = report["measured"], report["timing"]
    return {"output_tokens_per_s": float(m["output_throughput"]),
            "ttft_ms": float(timing["ttft_ms"]), "tpot_ms": float(timing["tpot_ms"]),
            "e2e_ms": float(m["latency"]["e2el"]["median_ms"]), "requests_per_s": float(m["request_throughput"])}


def _bar(done: int, phases: int = len(PHASES), width: int = 12) -> str:
    filled = round(width * done / phases)
    return "#" * filled + "-" * (width - filled)


def run_trial(settings: Settings, request: TuneRequest, trial: Trial, index: int, work: Path,
              progress: Callable[[str], None]) -> None:
    """Launch the candidate in the foreground under npuops' supervisor, bench it, stop it through its supervisor."""
    head = f"trial {index}/{request.budget} {trial.candidate.describe()}"
    trial_request = replace(request.plan, fixed={**dict(request.plan.fixed), **trial.candidate.fixed})
    tuned = work / f"trial-{index}.json"
    write_tuned(tuned, trial_request)
    argv = [sys.executable, "-m", "npuops", "launch", "--tuned", str(tuned), "--name", request.name,
            "--port", str(request.port), "--foreground"]
    if request.vllm:
        argv += ["--vllm", request.vllm]
    log = work / f"trial-{index}.log"
    progress(f"{head} [{_bar(0)}] launch")
    with open(log, "wb") as out:
        launcher = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
    url = base_url("127.0.0.1", request.port)
    try:
        deadline = time.monotonic() + request.start_timeout_s
        while not health_ok(url, timeout=2.0):
            if launcher.poll() is not None or time.monotonic() > deadline:
                tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
                trial.error = f"did not start (exit {launcher.poll()}): {tail}"
                progress(f"{head} [{_bar(1)}] failed to start")
                return
            time.sleep(1.0)
        progress(f"{head} [{_bar(1)}] healthy, bench")
        report = run_bench(settings, BenchRequest(target=request.name, num_prompts=request.num_prompts),
                           lambda line: None)
        trial.measured = _measured(report)
        trial.stream_note, trial.timed = report["timing"]["note"], report["timing"]["timed"]
        m = trial.measured
        trial.slo_violations = request.slo.violations(m["ttft_ms"], m["tpot_ms"], m["e2e_ms"])
        progress(f"{head} [{_bar(3)}] {m['output_tokens_per_s']:.1f} tok/s, TTFT {m['ttft_ms']:.1f} ms, TPOT "
                 f"{m['tpot_ms']:.2f} ms" + (f" (misses: {'; '.join(trial.slo_violations)})"
                                             if trial.slo_violations else ""))
    except MeasurementError as exc:
        trial.error = exc.one_line()
    finally:
        if launcher.poll() is None:
            _stop_launcher(settings, request.name, launcher)
        progress(f"{head} [{_bar(4)}] stopped")


def _stop_launcher(settings: Settings, name: str, launcher: subprocess.Popen[bytes]) -> None:
    """Stop a trial through its supervisor, which stops its engine and writes its state (the launch process exits
    with it). A launch that has not written its record yet has no supervisor to ask: its own session is ended."""
    try:
        record = load_record(settings.state_dir, name)
    except BadInputError:
        record = None
    if record is not None:
        stop_foreground(record, 60)
    try:
        launcher.wait(timeout=90 if record is not None else 1)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):  # start_new_session: the launch and all it started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(launcher.pid, sig)
            try:
                launcher.wait(timeout=30)
                return
            except subprocess.TimeoutExpired:
                continue


def tune(settings: Settings, request: TuneRequest, progress: Callable[[str], None]) -> dict[str, Any]:
    if request.budget < 1:
        raise BadInputError(f"--budget {request.budget} runs no trial", "give --budget 1 or more")
    model = load_model(request.plan.model, request.plan.quantization)
    if model.path is None:
        raise BadInputError(f"{request.plan.model} is a catalog name: a trial needs the model's weights",
                            "give the model's local directory")
    target = resolve_target(settings, request.plan)
    base = make_plan(model, target, request.plan.workload, request.plan.options)
    space = search_space(base)
    predictions = {c: _predict(settings, request.plan, model, target, c) for c in space}
    candidates = [c for c in space if predictions[c] is not None]
    progress(f"tune {model.served_name}: {len(candidates)} candidates, budget {request.budget} trials")
    trials: list[Trial] = []
    work = request.output.parent / f".{request.output.name}.trials"
    work.mkdir(parents=True, exist_ok=True)
    for index in range(1, min(request.budget, len(candidates)) + 1):
        untried = [c for c in candidates if all(t.candidate != c for t in trials)]
        if index == 1:
            pick = untried[0]  # the plan's own configuration
        else:
            # Re-predict with the calibration the trials so far have stored.
            for c in untried:
                predictions[c] = _predict(settings, request.plan, model, target, c) or predictions[c]
            pick = max(untried, key=lambda c: expected(c, predictions[c] or {}, trials, request.slo))
        trial = Trial(pick, predictions[pick] or {})
        trials.append(trial)
        run_trial(settings, request, trial, index, work, progress)
    best = max((t for t in trials if t.ok), key=lambda t: t.measured["output_tokens_per_s"] if t.measured else 0,
               default=None)
    result: dict[str, Any] = {"model": model.served_name, "candidates": len(candidates), "budget": request.budget,
                              "slo": request.slo.as_dict(), "trials": [t.as_dict() for t in trials],
                              "best": best.as_dict() if best else None, "file": None}
    if best is None:
        missed = sorted({v for t in trials for v in t.slo_violations}) or ["every trial failed"]
        raise MeasurementError(f"no trial met the SLOs ({'; '.join(missed)}); the trials are in {work}",
                               "relax --slo-*, or raise --budget")
    best_request = replace(request.plan, fixed={**dict(request.plan.fixed), **best.candidate.fixed})
    write_tuned(request.output, best_request, {"tuned": {"measured": best.measured, "trials": len(trials),
                                                          "slo": request.slo.as_dict()}})
    result["file"] = str(request.output)
    return result
