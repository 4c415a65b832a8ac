"""`npuops bench`: measure an instance with vLLM's own benchmark and set it beside the plan's prediction.

Against an instance NAME: its endpoint, its model (the tokenizer for the prompts), its serving venv's `vllm`, its
API key (from its 0600 env file, handed to the tool in OPENAI_API_KEY), the plan's load by default and the plan's
performance-model inputs for the prediction. The report is kept under the instance's directory, and the
measurement becomes a calibration sample of this node's hardware and stack (npuops/plan/calibration.py).
Against a URL there is no plan: the figures alone.

`--baseline transformers` then runs the same prompts, output lengths and concurrency through plain PyTorch
(npuops/bench/plain_pytorch.py in the serving venv). On NPUs it needs the instance's chips, so the instance is
stopped for it and started again after; the CPU engine leaves enough of the host free and keeps running idle.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from npuops.bench.report import CLAIM_TESTED, baseline_ratios, hardware_fractions, prediction_ratios
from npuops.bench.serve_bench import (
    BenchLoad,
    ServeFigures,
    bench_environment,
    bench_serve_argv,
    ensure_positive,
    run_bench_serve,
    scratch_dir,
)
from npuops.bench.timing import StreamTiming, choose_timing
from npuops.envfile import parse_env_file
from npuops.errors import BadInputError, EnvironmentMissingError, MeasurementError, UsageError
from npuops.hardware.node import Node, discover_node
from npuops.hardware.probe import Probe
from npuops.httpclient import base_url
from npuops.inputfiles import API_KEY_MAX_BYTES, read_input_text
from npuops.instance.bench_results import keep_bench
from npuops.instance.endpoint import health_ok, scrape_metrics
from npuops.instance.metrics import Sample, engine_latencies, prefix_cache_use, spec_decode_use
from npuops.instance.record import InstanceRecord, load_record
from npuops.plan.calibration import CalibrationChoice, CalibrationSample, CalibrationStore, stack_key
from npuops.plan.performance import PerfInputs, Roofline, predict, roofline
from npuops.plan.request import host_memory_bandwidth
from npuops.settings import Settings

BASELINES = ("transformers",)
DEFAULT_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class BenchRequest:
    """What `npuops bench` was asked; None means the plan's value (or the default without a plan)."""

    target: str  # an instance NAME or an endpoint URL
    input_len: int | None = None
    output_len: int | None = None
    concurrency: int | None = None
    request_rate: float | None = None
    num_prompts: int | None = None
    seed: int | None = None  # None: a fresh one (prompts new to the prefix cache)
    baseline: str | None = None
    model: str | None = None  # with a URL: the model directory (its tokenizer)
    served_model_name: str | None = None  # with a URL
    vllm: str | None = None  # with a URL: the `vllm` executable
    api_key_file: Path | None = None  # with a URL
    timeout_s: float = DEFAULT_TIMEOUT_S
    calibrate: bool = True  # store the measurement as a calibration sample


@dataclass(frozen=True)
class BenchTarget:
    """Where the requests go and what is known about what serves them."""

    label: str
    url: str
    model_path: str
    served_model_name: str
    vllm: str
    api_key: str | None
    record: InstanceRecord | None

    @property
    def python(self) -> Path:
        """The serving venv's interpreter: beside its `vllm`."""
        return Path(self.vllm).parent / "python"


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def _instance_key(record: InstanceRecord) -> str | None:
    if not record.api_key:
        return None
    try:
        env = parse_env_file(Path(record.env_file).read_text(encoding="utf-8"), str(record.env_file))
    except PermissionError:
        raise EnvironmentMissingError(f"{record.env_file} (the instance's API key) is not readable by this user",
                                      "run npuops bench as root") from None
    except (OSError, ValueError) as exc:
        raise BadInputError(f"cannot read the API key of {record.name} from {record.env_file}: {exc}",
                            f"re-launch {record.name}") from None
    return env.get("VLLM_API_KEY") or None


def resolve_target(settings: Settings, request: BenchRequest) -> BenchTarget:
    if _is_url(request.target):
        if not request.model:
            raise UsageError("a URL needs --model DIR (the served model's directory, for its tokenizer)",
                             "add --model, or bench an instance by NAME")
        if not Path(request.model).is_dir():
            raise BadInputError(f"--model {request.model} is not a directory", "give the model's local directory")
        key = None
        if request.api_key_file is not None:
            key = read_input_text(request.api_key_file, "--api-key-file", max_bytes=API_KEY_MAX_BYTES,
                                  fix="give a readable file holding only the key").strip() or None
        vllm = request.vllm or str(settings.venv / "bin" / "vllm")
        return BenchTarget(request.target, request.target.rstrip("/"), request.model,
                           request.served_model_name or Path(request.model).name, vllm, key, None)
    for flag, value in (("--model", request.model), ("--served-model-name", request.served_model_name),
                        ("--api-key-file", request.api_key_file)):
        if value is not None:
            raise UsageError(f"{flag} is for a URL; instance {request.target} has its own", f"drop {flag}")
    record = load_record(settings.state_dir, request.target)
    if record.is_replica_set or not record.serves_api:
        raise UsageError(f"{record.name} serves no endpoint on this host",
                         "bench it on the host that serves its endpoint (the group's first host)")
    vllm = request.vllm or record.vllm_command[0]
    return BenchTarget(record.name, base_url(record.host, record.port), record.model_path,
                       record.served_model_name, vllm, _instance_key(record), record)


def _plan_perf(record: InstanceRecord | None) -> PerfInputs | None:
    if record is None or not record.perf_inputs:
        return None
    try:
        perf = PerfInputs.from_json(record.perf_inputs)
    except (KeyError, TypeError, ValueError):
        return None  # an instance launched by an older npuops: no prediction, the figures alone
    # A replica benched on its own port serves alone, whatever the plan around it.
    return replace(perf, replicas=1) if record.behind else perf


def bench_load(request: BenchRequest, perf: PerfInputs | None) -> BenchLoad:
    concurrency = request.concurrency or (perf.concurrency if perf else 1)
    rate = request.request_rate if request.request_rate is not None else (perf.request_rate if perf else None)
    load = BenchLoad(
        input_len=request.input_len or (perf.input_len if perf else 512),
        output_len=request.output_len or (perf.output_len if perf else 128),
        concurrency=concurrency, request_rate=rate,
        # Enough requests that the medians settle and each in-flight slot turns over several times.
        num_prompts=request.num_prompts or max(40, 10 * concurrency),
        # vLLM's random prompts of one seed are the same every run, and those of a longer --input-len start with
        # the shorter ones' tokens: a second bench on a warm instance found 18% of its prompt tokens (another
        # load's, 33%) in the prefix cache and measured a shorter TTFT. A fresh seed keeps each bench's prompts new.
        seed=request.seed if request.seed is not None else secrets.randbelow(2**31))
    ensure_positive(load)
    return load


def _node_summary(node: Node) -> dict[str, Any]:
    host = node.host
    return {
        "chips": [{"name": c.smi.name, "device_id": c.device_id, "memory_mb": c.device_memory_total_mb}
                  for c in node.chips],
        "npu": {"found": node.has_npus, "reasons": [] if node.has_npus else node.no_npu_reasons()},
        "driver": node.driver.version, "cann": node.cann.to_json().get("version"),
        "host": {"hostname": host.hostname, "cpu_model": host.cpu_model, "cpu_count": host.cpu_count,
                 "memory_total_bytes": host.memory_total_bytes},
    }


def _serving_probe(settings: Settings, target: BenchTarget) -> Probe:
    python = target.python
    return Probe(replace(settings, stack_python=str(python)) if python.exists() else settings)


def run_bench(settings: Settings, request: BenchRequest, progress: Callable[[str], None]) -> dict[str, Any]:
    """Bench the target and return the report (kept with the instance, when it is one)."""
    if request.baseline is not None and request.baseline not in BASELINES:
        raise UsageError(f"unknown baseline {request.baseline!r}", f"use one of: {', '.join(BASELINES)}")
    target = resolve_target(settings, request)
    perf_plan = _plan_perf(target.record)
    load = bench_load(request, perf_plan)
    if not Path(target.vllm).exists():
        raise EnvironmentMissingError(f"no vllm at {target.vllm}", "provision the serving venv or pass --vllm PATH")
    if not health_ok(target.url, timeout=5.0):
        raise MeasurementError(f"{target.label} does not answer on {target.url}/health",
                               f"start it and wait until `npuops status {target.label}` says healthy")
    node = discover_node(_serving_probe(settings, target))
    stack = stack_key(node.python_stack.versions)
    # vLLM's random dataset (range ratio 0) with --ignore-eos: every request exactly the load's lengths.
    perf = perf_plan.for_load(input_len=load.input_len, output_len=load.output_len, concurrency=load.concurrency,
                              request_rate=load.request_rate, fixed_lengths=True) if perf_plan else None
    store = CalibrationStore(settings.state_dir)
    choice = store.choose(target.record.hardware_label, stack) if target.record and perf else None

    limits = _roofline(settings, perf, target, progress) if perf is not None else None
    progress(f"bench {target.label}: {load.describe()} with `vllm bench serve` ...")
    work = scratch_dir()
    argv = bench_serve_argv(target.vllm, base_url=target.url, model_path=target.model_path,
                            served_model_name=target.served_model_name, load=load, result_dir=work)
    engines = _engine_urls(settings, target)
    before = _scrape_engines(engines, target.api_key)
    started = time.monotonic()
    measured = run_bench_serve(argv, env=bench_environment(target.api_key), result_dir=work,
                               timeout_s=request.timeout_s,
                               progress=lambda s: progress(f"  vllm bench serve running ({s:.0f} s)"))
    progress(f"  done in {time.monotonic() - started:.0f} s: {measured.output_throughput:.1f} output tok/s")

    report: dict[str, Any] = {
        "target": target.label, "url": target.url, "instance": target.record.name if target.record else None,
        "model": target.served_model_name, "model_path": target.model_path, "at": time.time(),
        "load": load.as_dict(), "load_description": load.describe(), "measured": measured.as_dict(),
        "hardware": target.record.hardware_label if target.record else None, "node": _node_summary(node),
        "stack": stack, "vllm_bench_argv": argv,
        "plan": {"perf_inputs": perf_plan.to_json(), "prediction_at_launch": target.record.prediction}
        if perf_plan and target.record else None,
        "predicted": None, "ratios": None, "hardware_limit": None, "prediction_note": None,
        "baseline": None, "calibration": None,
    }
    after = _scrape_engines(engines, target.api_key) if before is not None else None
    report["prefix_cache"] = _prefix_cache_during(before, after, load)
    report["speculative"] = spec_decode_use(before, after) if before is not None and after else None
    engine = engine_latencies(before, after) if before is not None and after is not None else None
    report["engine"] = {metric: figures.as_dict() for metric, figures in engine.items()} if engine else None
    spec = report["speculative"]
    if perf is not None and perf.spec_tokens and spec and spec["draft_tokens"]:
        # Predict with the acceptance the engine measured on this load, not the method's default.
        perf = replace(perf, spec_acceptance=spec["acceptance_rate"])
    timing = choose_timing(measured, engine, limits[0] if limits else None, perf.spec_tokens if perf else 0,
                           target.record.stream_interval if target.record else 1)
    report["timing"], report["stream_note"] = timing.as_dict(), timing.note
    report.update(_prediction_part(measured, timing, perf, limits, choice, target))
    if request.baseline is not None:
        report["baseline"] = run_baseline(settings, target, load, measured, request.timeout_s, progress)
    if request.calibrate:
        report["calibration"] = _calibrate(store, report, measured, timing, perf, target)
    if target.record is not None:
        path = keep_bench(target.record, report)
        report["file"] = str(path)
    return report


def _engine_urls(settings: Settings, target: BenchTarget) -> list[str]:
    """The engines whose /metrics time the bench: the target itself, or every replica a router fronts. A
    prefill/decode pair is left out (each pool times only its half of a request)."""
    record = target.record
    if record is None or not record.backends:
        return [target.url]
    for name in record.replicas:
        try:
            if load_record(settings.state_dir, name).pd_role is not None:
                return []
        except BadInputError:
            continue
    return list(record.backends)


def _scrape_engines(urls: list[str], api_key: str | None) -> list[Sample] | None:
    """Every engine's samples together (the histograms add up), or None when one of them does not answer. The
    instance's key goes along (its replicas share it), as it did when the bench scraped its endpoint alone."""
    samples: list[Sample] = []
    for url in urls:
        scraped = scrape_metrics(url, timeout=10.0, api_key=api_key)
        if scraped is None:
            return None
        samples += scraped
    return samples if urls else None


def _roofline(settings: Settings, perf: PerfInputs, target: BenchTarget,
              progress: Callable[[str], None]) -> tuple[Roofline, str]:
    """The roofline of the benched configuration and where its bandwidth comes from: an NPU's catalog HBM
    figure, or the CPU host's own memory bandwidth, measured by the first bench of the host and kept."""
    if perf.kind == "npu":
        return roofline(perf), "the chip's published HBM figure (npuops/data/chips.toml)"
    assert target.record is not None  # a plan (perf) comes from an instance's record
    kept = host_memory_bandwidth(settings, target.record.hardware_label, perf.cpu_count or 1, progress=progress)
    assert kept is not None
    return roofline(replace(perf, bandwidth_bytes_per_s=kept.bytes_per_s)), kept.describe()


def _calibrate(store: CalibrationStore, report: dict[str, Any], measured: ServeFigures, timing: StreamTiming,
               perf: PerfInputs | None, target: BenchTarget) -> dict[str, Any] | None:
    """Store the bench as a calibration sample of the node, from the figures that time the engine."""
    if not timing.timed:
        # Such a run would scale the decode step towards zero and TTFT up by the decode it holds.
        return {"skipped": "the stream came in bursts and no engine histogram timed the steps"}
    if perf is None or target.record is None or measured.failed:
        return None
    sample = CalibrationSample(hardware=target.record.hardware_label, stack=report["stack"],
                               model=target.served_model_name, perf=perf, ttft_ms=timing.ttft_ms,
                               tpot_ms=timing.tpot_ms, output_tokens_per_s=measured.output_throughput,
                               at=report["at"])
    calibration = store.add(sample)
    return {**calibration.as_dict(), "describe": calibration.describe(), "file": str(store.path),
            "figures": timing.source}


def _prediction_part(measured: ServeFigures, timing: StreamTiming, perf: PerfInputs | None,
                     limits: tuple[Roofline, str] | None, choice: CalibrationChoice | None,
                     target: BenchTarget) -> dict[str, Any]:
    """The report's prediction, ratios and hardware fractions (or why there are none)."""
    if perf is not None and choice is not None and limits is not None:
        predicted = predict(perf, factors=choice.factors)
        return {"predicted": predicted.as_dict(), "ratios": prediction_ratios(measured, predicted, timing),
                "hardware_limit": hardware_fractions(timing, perf, limits[0], limits[1]),
                "prediction_note": f"for this load on the launched configuration; calibration: {choice.why}",
                "uncalibrated_predicted": predict(perf).as_dict()}
    if target.record is not None:
        return {"prediction_note": "the instance's record has no performance-model inputs (launched by an older "
                                   "npuops): the figures alone"}
    return {"prediction_note": "a URL has no plan: the figures alone"}


def _prefix_cache_during(before: list[Sample] | None, after: list[Sample] | None, load: BenchLoad
                         ) -> dict[str, Any] | None:
    """How much of the bench's prompts the engine found in its prefix cache (a repeated prompt set measures a
    shorter TTFT than new prompts get); None where the endpoint exports no such counters (a router)."""
    use = prefix_cache_use(before, after) if before is not None and after is not None else None
    if use is None:
        return None
    return {**use, "repeated_prompts": repeated_prompt_set(use["hit_tokens"], load)}


def repeated_prompt_set(hit_tokens: float, load: BenchLoad) -> bool:
    """Whether a bench's prompts were seen before, from its prefix-cache hits (pure). The warm-ups are
    `concurrency` copies of the first prompt, which the measured run sends once more: those hits are the tool's
    own. A prompt set the instance has seen before hits nearly every full KV block of every prompt (at least half
    its tokens from two blocks on); new random prompts hit only by chance (on a tiny vocabulary two prompts may
    start alike: a CI run saw 6 such blocks among 24 prompts). Repeated: more than a quarter of the other prompts'
    tokens found cached."""
    own = (load.concurrency + 1) * load.input_len
    return hit_tokens - own > (load.num_prompts - 1) * load.input_len / 4


def _baseline_request(target: BenchTarget, load: BenchLoad) -> dict[str, Any]:
    dtype = target.record.dtype if target.record and target.record.dtype else "auto"
    device = "npu" if target.record is not None and target.record.target_kind == "npu" else "cpu"
    return {"model": target.model_path, "dtype": dtype, "input_len": load.input_len, "output_len": load.output_len,
            "num_prompts": load.num_prompts, "batch_size": load.concurrency, "seed": load.seed, "device": device}


def run_baseline(settings: Settings, target: BenchTarget, load: BenchLoad, vllm_figures: ServeFigures,
                 timeout_s: float, progress: Callable[[str], None]) -> dict[str, Any]:
    """The same prompts through plain PyTorch in the serving venv, and vLLM/plain ratios."""
    from npuops.bench.baseline import free_devices_for_baseline, run_plain_pytorch

    if not target.python.exists():
        raise EnvironmentMissingError(f"no python beside {target.vllm} for the plain-PyTorch baseline",
                                      "pass --vllm with the serving venv's vllm")
    request = _baseline_request(target, load)
    progress(f"baseline: the same {load.num_prompts} prompts through transformers generate, static batches of "
             f"{load.concurrency} ({request['dtype']} on {request['device']}) ...")
    with free_devices_for_baseline(settings, target.record, progress):
        plain = run_plain_pytorch(target.python, request, target.record, timeout_s, progress)
    return {"backend": "transformers", "device": request["device"], "dtype": request["dtype"],
            "measured": plain.as_dict(), "ratios": baseline_ratios(vllm_figures, plain),
            "founding_claim": CLAIM_TESTED}  # the key keeps its name: bench --json keeps its shape (docs/claims.md)


def dump(report: dict[str, Any]) -> None:
    json.dump(report, sys.stdout, indent=1)
    sys.stdout.write("\n")
