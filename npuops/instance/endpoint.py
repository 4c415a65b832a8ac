"""Talking to a running engine: /health, one short completion, and /metrics turned into the figures an operator
reads (requests running and waiting, KV cache usage, token throughput, TTFT and inter-token latency percentiles).

The HTTP calls use the standard library and never raise on a refused or reset connection (that is the normal
state of an engine that is still loading). Parsing the Prometheus text format is pure.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from npuops.httpclient import http_request


def health_ok(url: str, timeout: float = 5.0) -> bool:
    answer = http_request(url.rstrip("/") + "/health", timeout=timeout)
    return answer is not None and answer[0] == 200


@dataclass(frozen=True)
class Completion:
    ok: bool
    status: int | None
    tokens: int
    finish_reason: str | None
    seconds: float
    error: str | None = None


def first_completion(url: str, model: str, *, api_key: str | None, timeout: float = 120.0) -> Completion:
    """One short greedy completion: proof the endpoint serves, not only that /health answers."""
    import time

    started = time.monotonic()
    answer = http_request(url.rstrip("/") + "/v1/completions", timeout=timeout, api_key=api_key,
                          data={"model": model, "prompt": "Hello", "max_tokens": 8, "temperature": 0})
    seconds = time.monotonic() - started
    if answer is None:
        return Completion(False, None, 0, None, seconds, "no answer")
    status, body = answer
    if status != 200:
        return Completion(False, status, 0, None, seconds, body[:300].decode("utf-8", "replace"))
    try:
        data = json.loads(body)
        choice = data["choices"][0]
        tokens = int(data.get("usage", {}).get("completion_tokens", 0))
        return Completion(True, status, tokens, choice.get("finish_reason"), seconds)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return Completion(False, status, 0, None, seconds, f"unexpected answer: {exc}")


# --- Prometheus text format ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[Sample]:
    """Samples of the Prometheus text exposition format; comments and lines that do not parse are skipped."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(match.group(2) or "")}
        samples.append(Sample(match.group(1), labels, value))
    return samples


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
    merged: dict[float, float] = {}
    for s in samples:
        if s.name == f"{name}_bucket" and "le" in s.labels:
            bound = float("inf") if s.labels["le"] in ("+Inf", "Inf") else float(s.labels["le"])
            merged[bound] = merged.get(bound, 0.0) + s.value
    return sorted(merged.items())


def engine_figures(now: Sequence[Sample], before: Sequence[Sample] | None = None,
                   interval_s: float = 0.0) -> dict[str, Any]:
    """The live figures from vLLM's /metrics (testing-recipes.md lists the families). With an earlier scrape
    `interval_s` before, token throughput is a rate over that interval; percentiles are over the engine's life."""
    figures: dict[str, Any] = {
        "requests_running": _sum(now, "vllm:num_requests_running"),
        "requests_waiting": _sum(now, "vllm:num_requests_waiting"),
        "kv_cache_usage": _sum(now, "vllm:kv_cache_usage_perc"),
        "prompt_tokens_total": _sum(now, "vllm:prompt_tokens_total"),
        "generation_tokens_total": _sum(now, "vllm:generation_tokens_total"),
        "requests_finished_total": _sum(now, "vllm:request_success_total"),
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
