"""Grafana dashboards, generated from one description: each panel its title, its queries and its unit.

Three dashboards: the fleet (every node and instance at a glance), one instance (measured TTFT, TPOT and
throughput beside its plan's prediction, the KV cache, the queue, its replicas in the router) and the NPU chips
(npu-exporter's names, which the doctor's textfile writes too). The queries read the recording rules of
npuops.monitor.rules and the names of npuops.monitor.sources; the prediction is a recording per instance
(`npuops:predicted_ttft_seconds`, ...) that `npuops monitor render` writes from each instance's record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from npuops.monitor.targets import ENGINES_JOB, ROUTERS_JOB

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_INSTANCE = 'npuops_instance=~"$npuops_instance"'
_HOST = 'host=~"$host"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    variables: tuple[tuple[str, str], ...]  # (label, the series whose values of it the variable lists)
    panels: tuple[Panel, ...]


def _q(expr: str, legend: str) -> Query:
    return Query(expr, legend)


DASHBOARDS: tuple[Dashboard, ...] = (
    Dashboard("npuops-fleet", "npuops: fleet", (("host", f'up{{job="{ENGINES_JOB}"}}'),), (
        Panel("Engines answering, by host", (_q(f'sum by (host) (up{{job="{ENGINES_JOB}", {_HOST}}})', "{{host}}"),)),
        Panel("Routers answering", (_q(f'up{{job="{ROUTERS_JOB}", {_HOST}}}', "{{npuops_instance}}"),)),
        Panel("Requests per second, by instance", (_q("npuops:requests:rate5m", "{{npuops_instance}}"),),
              unit="reqps"),
        Panel("Generated tokens per second, by instance",
              (_q("npuops:generation_tokens:rate5m", "{{npuops_instance}}"),)),
        Panel("Failing doctor checks, by host", (_q(f"count by (host) (npuops_check_status{{{_HOST}}} == 2)",
                                                     "{{host}}"),)),
        Panel("Engine restarts (30 min)", (_q(f'changes(process_start_time_seconds{{job="{ENGINES_JOB}", '
                                              f'{_HOST}}}[30m])', "{{npuops_part}}"),)),
    )),
    Dashboard("npuops-instance", "npuops: instance",
              (("npuops_instance", f'up{{job="{ENGINES_JOB}"}}'),), (
        Panel("TTFT p99, measured beside the plan's prediction", (
            _q(f"npuops:ttft_seconds:p99{{{_INSTANCE}}}", "measured p99"),
            _q(f"npuops:predicted_ttft_seconds{{{_INSTANCE}}}", "predicted")), unit="s"),
        Panel("TPOT p99, measured beside the plan's prediction", (
            _q(f"npuops:tpot_seconds:p99{{{_INSTANCE}}}", "measured p99"),
            _q(f"npuops:predicted_tpot_seconds{{{_INSTANCE}}}", "predicted")), unit="s"),
        Panel("Output tokens per second, measured beside the plan's prediction", (
            _q(f"npuops:generation_tokens:rate5m{{{_INSTANCE}}}", "measured"),
            _q(f"npuops:predicted_output_tokens_per_second{{{_INSTANCE}}}", "predicted")), unit="short"),
        Panel("KV cache usage, by replica", (_q(f"vllm:kv_cache_usage_perc{{{_INSTANCE}}}", "{{npuops_part}}"),),
              unit="percentunit"),
        Panel("Requests running and waiting", (
            _q(f"sum by (npuops_part) (vllm:num_requests_running{{{_INSTANCE}}})", "running {{npuops_part}}"),
            _q(f"sum by (npuops_part) (vllm:num_requests_waiting{{{_INSTANCE}}})", "waiting {{npuops_part}}"))),
        Panel("Replicas in the router", (
            _q(f"vllm_router_worker_health{{{_INSTANCE}}}", "{{worker}}"),)),
    )),
    Dashboard("npuops-npu", "npuops: NPU chips", (("host", "npu_chip_info_health_status"),), (
        Panel("Chip health (1 OK)", (_q(f"npu_chip_info_health_status{{{_HOST}}}", "{{host}} chip {{id}}"),)),
        Panel("Chip temperature", (_q(f"npu_chip_info_temperature{{{_HOST}}}", "{{host}} chip {{id}}"),),
              unit="celsius"),
        Panel("AI Core utilization", (_q(f"npu_chip_info_utilization{{{_HOST}}}", "{{host}} chip {{id}}"),),
              unit="percent"),
        Panel("HBM in use", (_q(f"npu_chip_info_hbm_used_memory{{{_HOST}}} / npu_chip_info_hbm_total_memory"
                                f"{{{_HOST}}}", "{{host}} chip {{id}}"),), unit="percentunit"),
        Panel("Chip power", (_q(f"npu_chip_info_power{{{_HOST}}}", "{{host}} chip {{id}}"),), unit="watt"),
    )),
)


def _variable(label: str, series: str) -> dict[str, Any]:
    return {"name": label, "label": label, "type": "query", "datasource": DATASOURCE,
            "query": f"label_values({series}, {label})",
            "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*", "current": {}}


def _panel(panel: Panel, index: int) -> dict[str, Any]:
    return {"id": index + 1, "type": "timeseries", "title": panel.title, "description": panel.description,
            "datasource": DATASOURCE, "gridPos": {"x": (index % 2) * 12, "y": (index // 2) * 8, "w": 12, "h": 8},
            "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + n), "expr": q.expr, "legendFormat": q.legend, "datasource": DATASOURCE}
                        for n, q in enumerate(panel.queries)]}


def dashboard_json(dashboard: Dashboard) -> str:
    """A dashboard as Grafana imports it (its datasource a variable: pick the Prometheus at import)."""
    model = {
        "uid": dashboard.uid, "title": dashboard.title, "schemaVersion": 39, "version": 1, "editable": True,
        "tags": ["npuops"], "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "current": {}},
                                *(_variable(label, series) for label, series in dashboard.variables)]},
        "panels": [_panel(p, i) for i, p in enumerate(dashboard.panels)],
    }
    return json.dumps(model, indent=2) + "\n"


def every_query(dashboards: tuple[Dashboard, ...] = DASHBOARDS) -> list[str]:
    """Every PromQL expression of the dashboards: the panels' and the series the variables list values of."""
    return [q.expr for d in dashboards for p in d.panels for q in p.queries] + [
        series for d in dashboards for _, series in d.variables]
