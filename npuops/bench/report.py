"""A bench's report: what was measured beside what the plan predicted and what the hardware allows.

Ratios are measured / predicted for every figure (so 1.0 is a perfect prediction; above 1 a latency is slower
and a throughput higher than predicted). The hardware's limit is the fraction of the chips' published peak the
run reached: decode against the HBM-bandwidth roofline (the fastest step that only streams the weights and the
KV cache, divided by the measured TPOT), prefill against the peak FLOPs (the prompt's FLOPs over the median
TTFT, which also holds queueing and the request's overhead, so it is a lower bound).
"""

from __future__ import annotations

from typing import Any

from npuops.bench.serve_bench import ServeFigures
from npuops.bench.timing import ENGINE, TIMED, StreamTiming
from npuops.plan.performance import PerfInputs, Prediction, Roofline, prefill_flops
from npuops.textout import table, wrapped

# The headline claim npuops tests (docs/claims.md, claim 1): vLLM on 910B against a plain PyTorch implementation.
CLAIM_TESTED = {"throughput_ratio": 1.7, "latency_reduction": 0.40}

_PREDICTED_OF = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "tpot_ms", "e2el": "e2e_ms"}


def _ratio(measured: float, predicted: float | None) -> float | None:
    if predicted is None or predicted <= 0:
        return None
    # Four significant digits, not four decimals: a ratio of 0.0012 must keep its precision too.
    return float(f"{measured / predicted:.4g}")


def prediction_ratios(measured: ServeFigures, predicted: Prediction,
                      timing: StreamTiming | None = None) -> dict[str, float | None]:
    """measured / predicted: TTFT, TPOT and ITL as `timing` chose them (the client's medians by default; ITL is
    predicted as the decode step, like TPOT), end-to-end latency's median and the throughputs from the client."""
    values = predicted.as_dict()
    ratios: dict[str, float | None] = {}
    for metric, key in _PREDICTED_OF.items():
        figure = timing.figure(metric) if timing is not None and metric in TIMED else measured.latency[metric].median_ms
        ratios[metric] = _ratio(figure, float(values[key]))
    ratios["output_throughput"] = _ratio(measured.output_throughput, predicted.output_tokens_per_s)
    ratios["request_throughput"] = _ratio(measured.request_throughput, predicted.requests_per_s)
    return ratios


def memory_of(perf: PerfInputs) -> str:
    """What a decode step streams its bytes from: an NPU's HBM, or the CPU host's RAM."""
    return "HBM" if perf.kind == "npu" else "host memory"


def hardware_fractions(timing: StreamTiming, perf: PerfInputs, limits: Roofline,
                       bandwidth_source: str) -> dict[str, Any]:
    """The share of the hardware's peak the run reached (see the module's docstring). Figures that do not time
    the engine's steps (a burst with no engine histograms) give None rather than "2720% of the roofline"."""
    tpot_s, ttft_s = timing.tpot_ms / 1e3, timing.ttft_ms / 1e3
    prompt_flops = prefill_flops(perf.arch, perf.input_len, perf.input_len / 2)
    return {
        "memory": memory_of(perf), "bandwidth_bytes_per_s": limits.bandwidth_bytes_per_s,
        "bandwidth_source": bandwidth_source,
        "decode_roofline_tokens_per_s": round(limits.decode_tokens_per_s, 1),
        "decode_fraction": round(limits.fastest_step_s / tpot_s, 4) if timing.timed and tpot_s > 0 else None,
        "prefill_peak_flops_per_s": limits.prefill_flops_per_s,
        "prefill_fraction": round(prompt_flops / ttft_s / limits.prefill_flops_per_s, 4)
        if timing.timed and ttft_s > 0 else None,
        "batch": round(limits.batch, 2),
    }


def baseline_ratios(vllm: ServeFigures, plain: ServeFigures) -> dict[str, float | None]:
    """vLLM over plain PyTorch: throughput ratios (above 1: vLLM serves more) and latency reductions (above 0:
    vLLM answers sooner), as the claim tested states it (docs/claims.md, claim 1)."""
    def reduction(metric: str) -> float | None:
        base = plain.latency[metric].median_ms
        return round(1.0 - vllm.latency[metric].median_ms / base, 4) if base > 0 else None

    return {
        "output_throughput_ratio": _ratio(vllm.output_throughput, plain.output_throughput),
        "request_throughput_ratio": _ratio(vllm.request_throughput, plain.request_throughput),
        "e2el_reduction": reduction("e2el"),
        "ttft_reduction": reduction("ttft"),
        "tpot_reduction": reduction("tpot"),
    }


def _fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}{suffix}"


def _figures_table(report: dict[str, Any]) -> str:
    """The client's figures, the engine's own means beside them, the prediction and measured/predicted (of the
    figures the timing chose: the engine's when the client's stream could not time the steps, marked *)."""
    measured, predicted = report["measured"], report.get("predicted") or {}
    ratios, engine = report.get("ratios") or {}, report.get("engine") or {}
    from_engine = (report.get("timing") or {}).get("source") == ENGINE
    rows = []
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "end-to-end")):
        figures = measured["latency"][metric]
        mark = "*" if from_engine and metric in TIMED else ""
        rows.append([f"{label} ms", _fmt(figures["median_ms"]), _fmt(figures["p99_ms"]),
                     _fmt((engine.get(metric) or {}).get("mean_ms")) + mark, _fmt(predicted.get(_PREDICTED_OF[metric])),
                     _fmt(ratios.get(metric))])
    rows.append(["output tok/s", _fmt(measured["output_throughput"], 1), "", "",
                 _fmt(predicted.get("output_tokens_per_s"), 1), _fmt(ratios.get("output_throughput"))])
    rows.append(["requests/s", _fmt(measured["request_throughput"], 3), "", "",
                 _fmt(predicted.get("requests_per_s"), 3), _fmt(ratios.get("request_throughput"))])
    return table(["figure", "median", "p99", "engine mean", "predicted", "measured/predicted"], rows)


def _hardware_lines(limits: dict[str, Any] | None) -> list[str]:
    if not limits:
        return []
    if limits["decode_fraction"] is None:
        return ["  hardware: not measured (the stream did not time the engine's steps, see below)"]
    return [f"  hardware: decode at {limits['decode_fraction'] * 100:.1f}% of the {limits['memory']} bandwidth "
            f"roofline ({limits['decode_roofline_tokens_per_s']:.0f} tok/s at {limits['batch']} a replica)",
            f"            prefill at {limits['prefill_fraction'] * 100:.1f}% of peak FLOPs "
            f"({limits['prefill_peak_flops_per_s'] / 1e12:.2f} TFLOP/s)",
            f"            bandwidth: {limits['bandwidth_source']}"]


def render_report_text(report: dict[str, Any]) -> str:
    """The human view of a bench report (the --json one is the report itself)."""
    load, measured = report["load"], report["measured"]
    out = [f"bench {report['target']}: {report['load_description']}",
           f"  vLLM's own `vllm bench serve`: {measured['completed']} completed, {measured['failed']} failed "
           f"in {measured['duration_s']:.1f} s"]
    out.append(_figures_table(report))
    if report.get("prediction_note"):
        out.append(wrapped(report["prediction_note"], "  prediction: "))
    cache = report.get("prefix_cache")
    if cache and cache["queried_tokens"]:
        cached = (f"  prefix cache: {cache['hit_rate'] * 100:.1f}% of {cache['queried_tokens']:.0f} prompt tokens "
                  "found cached")
        if cache.get("repeated_prompts"):
            cached += " (TTFT measures partly cached prompts: give another --seed for new ones)"
        out.append(cached)
    spec = report.get("speculative")
    if spec and spec["draft_tokens"]:
        out.append(f"  speculative decoding: {spec['acceptance_rate'] * 100:.1f}% of {spec['draft_tokens']:.0f} draft "
                   "tokens accepted (the prediction uses this rate)")
    out += _hardware_lines(report.get("hardware_limit"))
    baseline = report.get("baseline")
    if baseline:
        b = baseline["ratios"]
        plain = baseline["measured"]
        out.append(f"  plain PyTorch (transformers generate, static batches of {load['concurrency']}, "
                   f"{baseline['dtype']} on {baseline['device']}): {plain['output_throughput']:.1f} output tok/s, "
                   f"end-to-end {plain['latency']['e2el']['median_ms']:.1f} ms")
        out.append(f"  vLLM / plain: throughput x{_fmt(b['output_throughput_ratio'])}, end-to-end latency "
                   f"{_fmt(-100 * b['e2el_reduction'] if b['e2el_reduction'] is not None else None, 0, '%')}")
        out.append(f"  the claim tested (docs/claims.md): throughput x{CLAIM_TESTED['throughput_ratio']}, "
                   f"end-to-end latency -{CLAIM_TESTED['latency_reduction'] * 100:.0f}%")
    if report.get("stream_note"):
        out.append(wrapped(report["stream_note"], "  stream: "))
    calibration = report.get("calibration")
    if calibration and calibration.get("skipped"):
        out.append(wrapped(f"not stored ({calibration['skipped']}); bench again", "  calibration: "))
    elif calibration:
        out.append(wrapped(f"{calibration['describe']} (`npuops plan` applies it; --no-calibration not)",
                           "  calibration now: "))
    if report.get("file"):
        out.append(f"  kept in {report['file']}")
    return "\n".join(out)
