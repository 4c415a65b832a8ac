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
from npuops.plan.performance import PerfInputs, Prediction, Roofline, prefill_flops
from npuops.textout import table

# The headline claim npuops tests (docs/claims.md, claim 1): vLLM on 910B against a plain PyTorch implementation.
CLAIM_TESTED = {"throughput_ratio": 1.7, "latency_reduction": 0.40}

_PREDICTED_OF = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "tpot_ms", "e2el": "e2e_ms"}


def _ratio(measured: float, predicted: float | None) -> float | None:
    if predicted is None or predicted <= 0:
        return None
    # Four significant digits, not four decimals: a ratio of 0.0012 must keep its precision too.
    return float(f"{measured / predicted:.4g}")


def prediction_ratios(measured: ServeFigures, predicted: Prediction) -> dict[str, float | None]:
    """measured / predicted: medians for the latencies (ITL is predicted as the decode step, like TPOT)."""
    values = predicted.as_dict()
    ratios: dict[str, float | None] = {
        metric: _ratio(measured.latency[metric].median_ms, float(values[key])) for metric, key in _PREDICTED_OF.items()
    }
    ratios["output_throughput"] = _ratio(measured.output_throughput, predicted.output_tokens_per_s)
    ratios["request_throughput"] = _ratio(measured.request_throughput, predicted.requests_per_s)
    return ratios


def hardware_fractions(measured: ServeFigures, perf: PerfInputs, limits: Roofline,
                       timed: bool = True) -> dict[str, float | None]:
    """The share of the chips' peak the run reached (see the module's docstring). A stream that came in bursts
    (`bursty_stream`) did not time the engine's steps: its fractions are None rather than "2720% of the roofline"."""
    tpot_s = measured.latency["tpot"].median_ms / 1e3
    ttft_s = measured.latency["ttft"].median_ms / 1e3
    fastest_step_s = limits.busy_replicas * limits.batch / limits.decode_tokens_per_s
    prompt_flops = prefill_flops(perf.arch, perf.input_len, perf.input_len / 2)
    return {
        "decode_roofline_tokens_per_s": round(limits.decode_tokens_per_s, 1),
        "decode_fraction": round(fastest_step_s / tpot_s, 4) if timed and tpot_s > 0 else None,
        "prefill_peak_flops_per_s": limits.prefill_flops_per_s,
        "prefill_fraction": round(prompt_flops / ttft_s / limits.prefill_flops_per_s, 4)
        if timed and ttft_s > 0 else None,
        "batch": round(limits.batch, 2),
    }


def bursty_stream(measured: ServeFigures, limits: Roofline, spec_tokens: int = 0) -> str | None:
    """Why the run's TTFT and TPOT do not time the engine's steps, or None. vLLM's bench times a request's first
    streamed chunk (TTFT) and spreads the rest over its later tokens (TPOT); when the API server falls behind the
    engine, one chunk carries many tokens, the first arrives late and TPOT falls towards zero. A median TPOT below
    the fastest step the memory bandwidth allows cannot be a decode step (the demo met it on a busy 2-core host:
    TPOT 0.00 ms, TTFT 3.4x the prediction, at "2235% of the roofline"; the same bench again: TPOT 2.26 ms).
    With speculative decoding a step yields up to 1 + K tokens, so the bound is the step over 1 + K."""
    tpot_s = measured.latency["tpot"].median_ms / 1e3
    fastest_step_s = limits.busy_replicas * limits.batch / limits.decode_tokens_per_s / (1 + spec_tokens)
    if tpot_s >= fastest_step_s:
        return None
    return (f"median TPOT {tpot_s * 1e3:.2f} ms is below the fastest step the memory bandwidth allows "
            f"({fastest_step_s * 1e3:.2f} ms): the stream delivered its tokens in bursts (the API server fell behind "
            "the engine), so TTFT and TPOT do not time the engine's steps")


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


def render_report_text(report: dict[str, Any]) -> str:
    """The human view of a bench report (the --json one is the report itself)."""
    load = report["load"]
    measured = report["measured"]
    predicted = report.get("predicted") or {}
    ratios = report.get("ratios") or {}
    out = [f"bench {report['target']}: {report['load_description']}",
           f"  vLLM's own `vllm bench serve`: {measured['completed']} completed, {measured['failed']} failed "
           f"in {measured['duration_s']:.1f} s"]
    rows = []
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "end-to-end")):
        figures = measured["latency"][metric]
        key = _PREDICTED_OF[metric]
        rows.append([f"{label} ms", _fmt(figures["median_ms"]), _fmt(figures["p99_ms"]),
                     _fmt(predicted.get(key)), _fmt(ratios.get(metric))])
    rows.append(["output tok/s", _fmt(measured["output_throughput"], 1), "",
                 _fmt(predicted.get("output_tokens_per_s"), 1), _fmt(ratios.get("output_throughput"))])
    rows.append(["requests/s", _fmt(measured["request_throughput"], 3), "", _fmt(predicted.get("requests_per_s"), 3),
                 _fmt(ratios.get("request_throughput"))])
    out.append(table(["figure", "median", "p99", "predicted", "measured/predicted"], rows))
    if report.get("prediction_note"):
        out.append(f"  prediction: {report['prediction_note']}")
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
    limits = report.get("hardware_limit")
    if limits and limits["decode_fraction"] is None:
        out.append("  hardware: not measured (the stream did not time the engine's steps, see below)")
    elif limits:
        out.append(f"  hardware: decode at {limits['decode_fraction'] * 100:.1f}% of the memory-bandwidth (HBM) "
                   "roofline "
                   f"({limits['decode_roofline_tokens_per_s']:.0f} tok/s at {limits['batch']} per replica), "
                   f"prefill at {limits['prefill_fraction'] * 100:.1f}% of peak FLOPs "
                   f"({limits['prefill_peak_flops_per_s'] / 1e12:.2f} TFLOP/s)")
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
        out.append(f"  stream: {report['stream_note']}")
    calibration = report.get("calibration")
    if calibration and calibration.get("skipped"):
        out.append(f"  calibration: not stored ({calibration['skipped']}); bench again")
    elif calibration:
        out.append(f"  calibration now: {calibration['describe']} (`npuops plan` applies it; --no-calibration not)")
    if report.get("file"):
        out.append(f"  kept in {report['file']}")
    return "\n".join(out)
