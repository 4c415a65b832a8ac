"""An engine's /metrics turned into the figures an operator reads: requests running and waiting, KV cache usage,
token throughput, TTFT and inter-token latency percentiles.

prometheus_client parses the text format; what is left here is pure: sums by sample name and the quantile
estimate Prometheus' histogram_quantile makes. Sample names are the exposition's own: a counter's samples keep
`_total` (its family's name drops it), a histogram's buckets are `<family>_bucket` with an `le` label.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["ENGINE_LATENCY_FAMILIES", "EngineLatency", "Sample", "engine_figures", "engine_latencies",
           "histogram_quantile", "parse_prometheus", "prefix_cache_use", "spec_decode_use"]


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition, or none when the body does not parse.

    The parser refuses a whole body on one bad line (ValueError, the only error it raises on any text); an engine
    answering garbage then shows no figures in `npuops status` rather than half of them or a traceback."""
    try:
        return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    except ValueError:
        return []


def _sum(samples: Sequence[Sample], name: str) -> float | None:
    values = [s.value for s in samples if s.name == name]
    return sum(values) if values else None


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets: linear inside a bucket."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return ordered[-1][0]


def _buckets(samples: Sequence[Sample], name: str) -> list[tuple[float, float]]:
    """A histogram's cumulative buckets, summed over its label sets (engines, models); `le` is "+Inf" at the top."""
    merged: dict[float, float] = {}
    for s in samples:
        if s.name == f"{name}_bucket" and "le" in s.labels:
            try:
                bound = float(s.labels["le"])
            except ValueError:
                continue
            merged[bound] = merged.get(bound, 0.0) + s.value
    return sorted(merged.items())


def engine_figures(now: Sequence[Sample], before: Sequence[Sample] | None = None,
                   interval_s: float = 0.0) -> dict[str, Any]:
    """The live figures from vLLM's /metrics (vLLM's Production Metrics page,
    docs.vllm.ai/en/v0.32.0/usage/metrics/, lists the families). With an earlier scrape `interval_s` before,
    token throughput is a rate over that interval; percentiles are over the engine's life."""
    figures: dict[str, Any] = {
        "requests_running": _sum(now, "vllm:num_requests_running"),
        "requests_waiting": _sum(now, "vllm:num_requests_waiting"),
        "kv_cache_usage": _sum(now, "vllm:kv_cache_usage_perc"),
        "prompt_tokens_total": _sum(now, "vllm:prompt_tokens_total"),
        "generation_tokens_total": _sum(now, "vllm:generation_tokens_total"),
        "requests_finished_total": _sum(now, "vllm:request_success_total"),
        # A PD decode engine: prompt tokens whose KV it loaded from a prefill engine (its KV connector's hits).
        "external_kv_tokens_total": _sum(now, "vllm:external_prefix_cache_hits_total"),
    }
    for key, family in (("ttft_s", "vllm:time_to_first_token_seconds"), ("itl_s", "vllm:inter_token_latency_seconds")):
        buckets = _buckets(now, family)
        figures[key] = {f"p{int(q * 100)}": histogram_quantile(q, buckets) for q in (0.5, 0.9, 0.99)}
    info = [s for s in now if s.name == "vllm:cache_config_info"]
    if info:
        tokens = info[0].labels.get("kv_cache_size_tokens")
        figures["kv_cache_tokens"] = int(tokens) if tokens and tokens.isdigit() else None
    if before is not None and interval_s > 0:
        for key, family in (("generation_tokens_per_s", "vllm:generation_tokens_total"),
                            ("prompt_tokens_per_s", "vllm:prompt_tokens_total")):
            latest, earlier = _sum(now, family), _sum(before, family)
            figures[key] = (latest - earlier) / interval_s if latest is not None and earlier is not None else None
    return figures


def prefix_cache_use(before: Sequence[Sample], after: Sequence[Sample]) -> dict[str, float] | None:
    """Prompt tokens the engine looked up in its prefix cache between two scrapes and how many it found there
    (vLLM's vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total, in tokens); None without them."""
    queried_before, queried_after = (_sum(s, "vllm:prefix_cache_queries_total") for s in (before, after))
    hit_before, hit_after = (_sum(s, "vllm:prefix_cache_hits_total") for s in (before, after))
    if queried_before is None or queried_after is None or hit_before is None or hit_after is None:
        return None
    queried, hit = queried_after - queried_before, hit_after - hit_before
    if queried < 0 or hit < 0:
        return None  # the engine restarted between the scrapes: its counters began again
    return {"queried_tokens": queried, "hit_tokens": hit, "hit_rate": round(hit / queried, 4) if queried else 0.0}


def spec_decode_use(before: Sequence[Sample], after: Sequence[Sample]) -> dict[str, float] | None:
    """Speculative decoding between two scrapes: draft steps, draft tokens proposed and accepted, and the rate
    (vLLM's vllm:spec_decode_num_drafts_total / _num_draft_tokens_total / _num_accepted_tokens_total); None when
    the engine runs without speculation or restarted in between."""
    names = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
             "vllm:spec_decode_num_accepted_tokens_total")
    pairs = [(_sum(before, n), _sum(after, n)) for n in names]
    if any(b is None or a is None for b, a in pairs):
        return None
    drafts, proposed, accepted = (a - b for b, a in pairs)  # type: ignore[operator]
    if drafts < 0 or proposed < 0 or accepted < 0:
        return None
    return {"drafts": drafts, "draft_tokens": proposed, "accepted_tokens": accepted,
            "acceptance_rate": round(accepted / proposed, 4) if proposed else 0.0}


# The engine's own latency histograms, by the name `vllm bench serve` gives the same figure. vLLM v1 stamps each step's
# outputs in the engine core and its frontend observes TTFT and the inter-token gaps from those stamps (and TPOT as
# a request's decode time over its later tokens), so they time the engine's steps however the API server later
# chunks the stream.
ENGINE_LATENCY_FAMILIES = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2el": "vllm:e2e_request_latency_seconds",
}


@dataclass(frozen=True)
class EngineLatency:
    """One latency histogram between two scrapes: how many observations, their exact mean (sum over count), and
    the median Prometheus' histogram_quantile would estimate from the buckets (coarse: vLLM's lowest ITL bucket is
    10 ms wide)."""

    count: float
    mean_ms: float
    median_ms: float | None

    def as_dict(self) -> dict[str, float | None]:
        return {"count": self.count, "mean_ms": round(self.mean_ms, 3),
                "median_ms": round(self.median_ms, 3) if self.median_ms is not None else None}


def engine_latencies(before: Sequence[Sample], after: Sequence[Sample]) -> dict[str, EngineLatency] | None:
    """The engine's TTFT, TPOT, ITL and end-to-end latency over what it served between two scrapes (summed over
    its engines and models), or None when it exports no such histograms, observed nothing in between, or
    restarted (its counters began again)."""
    found: dict[str, EngineLatency] = {}
    for metric, family in ENGINE_LATENCY_FAMILIES.items():
        sums = [_sum(samples, f"{family}_sum") for samples in (before, after)]
        counts = [_sum(samples, f"{family}_count") for samples in (before, after)]
        if None in sums or None in counts:
            return None
        count = counts[1] - counts[0]  # type: ignore[operator]
        total = sums[1] - sums[0]  # type: ignore[operator]
        if count < 0 or total < 0:
            return None
        if count == 0:
            continue
        earlier = dict(_buckets(before, family))
        delta = [(bound, value - earlier.get(bound, 0.0)) for bound, value in _buckets(after, family)]
        median = histogram_quantile(0.5, delta)
        found[metric] = EngineLatency(count, total / count * 1e3, median * 1e3 if median is not None else None)
    return found or None


def _by_worker(samples: Sequence[Sample], name: str) -> dict[str, float]:
    return {s.labels["worker"]: s.value for s in samples if s.name == name and "worker" in s.labels}


def router_figures(samples: Sequence[Sample]) -> dict[str, Any]:
    """vllm-router's figures from its Prometheus port: requests and errors in all, and per replica URL whether its
    health checks pass, how many requests it was sent and whether its circuit breaker is open (a replica whose
    requests failed, kept out for a while). Names as vllm-router 0.1.17 exports them
    (tests/fixtures/router/metrics.txt)."""
    health = _by_worker(samples, "vllm_router_worker_health")
    processed = _by_worker(samples, "vllm_router_processed_requests_total")
    circuit = _by_worker(samples, "vllm_router_cb_state")
    workers = {url: {"healthy": health[url] >= 1 if url in health else None,
                     "requests": processed.get(url),
                     "circuit_open": circuit[url] == 1 if url in circuit else None}
               for url in sorted(set(health) | set(processed) | set(circuit))}
    return {"requests_total": _sum(samples, "vllm_router_requests_total"),
            "errors_total": _sum(samples, "vllm_router_request_errors_total"),
            "active_workers": _sum(samples, "vllm_router_active_workers"),
            "workers": workers}
