"""Talking to a running engine: /health, one short completion and a scrape of /metrics (whose figures are in
metrics.py).

The HTTP calls use the standard library and never raise on a refused or reset connection (that is the normal
state of an engine that is still loading).
"""

from __future__ import annotations

from dataclasses import dataclass

from npuops.httpclient import http_request
from npuops.instance.metrics import Sample, parse_prometheus
from npuops.wire import loads_json


def health_ok(url: str, timeout: float = 5.0, path: str = "/health") -> bool:
    answer = http_request(url.rstrip("/") + path, timeout=timeout)
    return answer is not None and answer[0] == 200


def scrape_metrics(url: str, timeout: float = 5.0, api_key: str | None = None) -> list[Sample] | None:
    """The samples of `url`/metrics, or None when it does not answer 200 (a body that does not parse gives none)."""
    answer = http_request(url.rstrip("/") + "/metrics", timeout=timeout, api_key=api_key)
    if answer is None or answer[0] != 200:
        return None
    return parse_prometheus(answer[1].decode("utf-8", "replace"))


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
        data = loads_json(body)
        choice = data["choices"][0]
        tokens = int(data.get("usage", {}).get("completion_tokens", 0))
        return Completion(True, status, tokens, choice.get("finish_reason"), seconds)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return Completion(False, status, 0, None, seconds, f"unexpected answer: {exc}")

