"""npuops' Prometheus rules, one typed description each: the recording rules the dashboards and alerts share, and
the alerts with a summary, a description that names the fix (a doctor check or an npuops command) and a runbook.

The latency alerts are per instance: an instance's TTFT or TPOT p99 above its own plan's prediction by a factor
means something for that model on that hardware, where one fixed threshold would be noise for a 400B model and
silence for a tiny one.

Escaping belongs to each consumer's syntax. Everything is rendered through yaml.safe_dump (a name never reaches the
file as YAML syntax); an instance name inside an expression is a PromQL string (`_promql_string`). Prometheus
expands every alert's annotations and labels as Go templates, so no name is ever written into one: a template
holds fixed text and `{{ $labels.x }}` / `{{ $value }}` only (`Alert` refuses anything else), and the name reaches
the alert's text as the value of a label its expression selects, which Prometheus prints and never executes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from npuops.errors import BadInputError
from npuops.instance.record import InstanceRecord
from npuops.monitor.targets import ENGINES_JOB, ROUTERS_JOB
from npuops.monitor.values import predicted, quoted

# The alerts' default thresholds (the doctor's own for chip temperature: npuops/data/doctor_thresholds.toml).
LATENCY_FACTOR = 3.0
KV_CACHE_HIGH = 0.9
DOCTOR_STALE_S = 1800
CLOCK_SKEW_S = 0.5
# The runbook of the alerts on an instance: the doctor check that reads every instance's state (status, logs, the
# supervisor's diagnosis, a group's parts).
INSTANCE_PAGE = "instances-healthy"
CHIP_TEMPERATURE_C = 85


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)

    def to_yaml(self) -> dict[str, Any]:
        return {"record": self.record, "expr": self.expr, **({"labels": dict(self.labels)} if self.labels else {})}


@dataclass(frozen=True)
class Alert:
    """One alert: the condition, how long it must hold, and what the operator reads when it fires."""

    name: str
    expr: str
    summary: str
    description: str  # what is wrong and the fix: an npuops command or a doctor check id
    severity: str = "warning"
    for_: str = "5m"
    runbook: str = ""  # the doctor check whose page (docs_url/ID.md, `npuops doctor --explain ID`) is the runbook
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for text in (self.summary, self.description, self.runbook, *self.labels.values()):
            if not is_fixed_template(text):
                raise ValueError(f"alert {self.name}: {text!r} holds more than fixed text and label references")

    def to_yaml(self, docs_url: str) -> dict[str, Any]:
        annotations = {"summary": self.summary, "description": self.description}
        if self.runbook and docs_url:
            annotations["runbook_url"] = f"{check_docs_url(docs_url).rstrip('/')}/{self.runbook}.md"
        return {"alert": self.name, "expr": self.expr, "for": self.for_,
                "labels": {"severity": self.severity, **self.labels}, "annotations": annotations}


# The only template actions npuops writes: a label of the alert's series, or its value.
_ACTION = re.compile(r"\{\{ (\$labels\.[a-zA-Z_][a-zA-Z0-9_]*|\$value) \}\}")


def is_fixed_template(text: str) -> bool:
    """Whether Go's text/template reads `text` as fixed text and `{{ $labels.x }}` / `{{ $value }}` actions only
    (no brace outside them: a single one could begin an action beside another)."""
    rest = _ACTION.sub("", text)
    return "{" not in rest and "}" not in rest


# A runbook URL's characters: RFC 3986's, less the quotes (and no space, brace or control character, so nothing in
# it opens a template action or ends a YAML or HTML attribute).
_URL = re.compile(r"(https?://[A-Za-z0-9.-]|file:///)[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]*")
MAX_URL = 2048


def check_docs_url(url: str) -> str:
    """--docs-url: an http(s) or file URL of plain URL characters (percent-encode the rest), or "" for no runbook
    links; else BadInputError."""
    if not isinstance(url, str) or len(url) > MAX_URL or not (url == "" or _URL.fullmatch(url)):
        raise BadInputError(f"--docs-url {quoted(url)} is not an http(s) or file URL of plain URL characters",
                            "give the URL of the check pages, e.g. https://example.com/npuops/checks/docs "
                            "(spaces, quotes and braces percent-encoded), or '' for no runbook links")
    return url


def _p99(metric: str, matcher: str = "") -> str:
    return (f"histogram_quantile(0.99, sum by (le, npuops_instance) "
            f"(rate({metric}_bucket{{{matcher}}}[5m])))")


RECORDINGS: tuple[Recording, ...] = (
    Recording("npuops:ttft_seconds:p99", _p99("vllm:time_to_first_token_seconds")),
    Recording("npuops:tpot_seconds:p99", _p99("vllm:request_time_per_output_token_seconds")),
    Recording("npuops:itl_seconds:p99", _p99("vllm:inter_token_latency_seconds")),
    Recording("npuops:generation_tokens:rate5m",
              "sum by (npuops_instance) (rate(vllm:generation_tokens_total[5m]))"),
    Recording("npuops:requests:rate5m", "sum by (npuops_instance) (rate(vllm:request_success_total[5m]))"),
    Recording("npuops:kv_cache_usage:max", "max by (npuops_instance) (vllm:kv_cache_usage_perc)"),
    Recording("npuops:requests_waiting:sum", "sum by (npuops_instance) (vllm:num_requests_waiting)"),
)

_PART = "{{ $labels.npuops_part }}"
_INSTANCE = "{{ $labels.npuops_instance }}"
_CHIP = "chip {{ $labels.id }} on {{ $labels.host }}"


def _doctor(check_id: str) -> str:
    return f"`npuops doctor --only {check_id}` on the node; `npuops doctor --explain {check_id}` for the fix"


# The alerts every node gets, whatever it serves.
ALERTS: tuple[Alert, ...] = (
    Alert("NpuopsEngineDown", f'up{{job="{ENGINES_JOB}"}} == 0', f"{_PART} does not answer /metrics",
          f"the engine of {_PART} ({_INSTANCE}) is down or hung: `npuops status {_INSTANCE}`, "
          f"`npuops logs {_INSTANCE}` (systemd restarts it; the supervisor's diagnosis names the cause)",
          severity="critical", for_="1m", runbook=INSTANCE_PAGE),
    Alert("NpuopsEngineRestarting", f'changes(process_start_time_seconds{{job="{ENGINES_JOB}"}}[30m]) >= 2',
          f"{_PART} restarted twice or more in 30 minutes",
          f"the engine of {_PART} keeps restarting (a crash loop ends at StartLimitBurst=): `npuops logs "
          f"{_INSTANCE}` for the cause, `npuops doctor` on the node", for_="0m", runbook=INSTANCE_PAGE),
    Alert("NpuopsStartLimitHit", "npuops_unit_start_limit_hit == 1",
          "systemd stopped restarting {{ $labels.npuops_part }} (its start limit)",
          f"{{{{ $labels.unit }}}} failed 5 starts in 15 minutes and stays down: `npuops logs {_INSTANCE}` for the "
          "cause; once fixed, `systemctl reset-failed {{ $labels.unit }}` and `systemctl start {{ $labels.unit }}`",
          severity="critical", for_="0m", runbook=INSTANCE_PAGE),
    Alert("NpuopsGateRefusing", "npuops_unit_gate_refused == 1",
          "the start gate refuses to start {{ $labels.npuops_part }}",
          f"a level-1 check fails for the instance's chips, CANN or stack: `npuops status {_INSTANCE}` names it, "
          "`npuops doctor --explain ID` gives its fix", severity="critical", for_="0m", runbook=INSTANCE_PAGE),
    Alert("NpuopsRouterDown", f'up{{job="{ROUTERS_JOB}"}} == 0', f"the router of {_INSTANCE} does not answer",
          f"no request reaches {_INSTANCE}'s replicas: `npuops status {_INSTANCE}`, `npuops logs {_INSTANCE}`",
          severity="critical", for_="1m", runbook=INSTANCE_PAGE),
    Alert("NpuopsReplicaOutOfRouter", "vllm_router_worker_health == 0",
          "{{ $labels.worker }} is out of router {{ $labels.npuops_instance }}",
          f"the router sends {{{{ $labels.worker }}}} nothing (its health check fails): `npuops status {_INSTANCE}` "
          "names the replica and its state", for_="2m", runbook=INSTANCE_PAGE),
    Alert("NpuopsKvCacheHigh", f"vllm:kv_cache_usage_perc > {KV_CACHE_HIGH}",
          f"{_PART}'s KV cache is over {KV_CACHE_HIGH:.0%} full",
          f"requests of {_INSTANCE} queue or get preempted: plan more KV cache or replicas (`npuops plan`, "
          f"`npuops rollout {_INSTANCE} --max-num-seqs N`)", for_="10m", runbook=INSTANCE_PAGE),
    Alert("NpuopsQueueGrowing", "vllm:num_requests_waiting > 0 and deriv(vllm:num_requests_waiting[10m]) > 0",
          f"requests wait at {_PART}, more every minute",
          f"{_INSTANCE} gets more than it serves: add replicas (`npuops launch --dp N`) or check `npuops bench "
          f"{_INSTANCE}` against the plan's prediction", for_="10m", runbook=INSTANCE_PAGE),
    Alert("NpuopsRequestErrors", 'sum by (npuops_instance, npuops_part) (rate(http_requests_total{status="5xx"}[5m])) '
          '> 0 or sum by (npuops_instance, npuops_part) (rate(vllm:request_success_total{finished_reason="error"}'
          "[5m])) > 0", f"{_PART} answers with errors",
          f"requests to {_INSTANCE} fail: `npuops logs {_INSTANCE}`", for_="5m", runbook=INSTANCE_PAGE),
    Alert("NpuopsRouterErrors", "sum by (npuops_instance) (rate(vllm_router_request_errors_total[5m])) > 0",
          f"router {_INSTANCE} answers with errors",
          f"requests through {_INSTANCE}'s router fail: `npuops status {_INSTANCE}`, `npuops logs {_INSTANCE}`",
          runbook=INSTANCE_PAGE),
    Alert("NpuChipUnhealthy", "npu_chip_info_health_status == 0", f"{_CHIP} is not healthy",
          f"npu-smi reports the chip's health not OK: {_doctor('chip-health')}", severity="critical", for_="1m",
          runbook="chip-health"),
    Alert("NpuChipHot", f"npu_chip_info_temperature > {CHIP_TEMPERATURE_C}",
          f"{_CHIP} is over {CHIP_TEMPERATURE_C} C", f"the chip runs hot (throttling, then faults): "
          f"{_doctor('chip-temperature')}", runbook="chip-temperature"),
    Alert("NpuHbmEccErrors", "increase(npu_chip_info_hbm_ecc_double_bit_error_cnt[30m]) > 0",
          f"{_CHIP} has new HBM double-bit ECC errors",
          f"uncorrectable memory errors: drain the node's instances (`npuops stop NAME`) and have the chip "
          f"checked; {_doctor('chip-health')}", severity="critical", for_="0m", runbook="chip-health"),
    Alert("NpuopsDoctorCheckFailing", "npuops_check_status == 2",
          "doctor check {{ $labels.id }} fails on {{ $labels.host }}",
          "`npuops doctor --only {{ $labels.id }}` on the node says why; `npuops doctor --explain {{ $labels.id }}` "
          "for the fix", for_="10m", runbook="{{ $labels.id }}"),
    Alert("NpuopsDoctorStale", f'time() - node_textfile_mtime_seconds{{file=~".*npuops.*[.]prom"}} > {DOCTOR_STALE_S}',
          f"the doctor's textfile on {{{{ $labels.host }}}} is over {DOCTOR_STALE_S // 60} minutes old",
          "the npuops-doctor timer has not written it: `systemctl status npuops-doctor.timer "
          "npuops-doctor.service` on the node", for_="5m"),
    Alert("NodeClockSkew", f"abs(node_timex_offset_seconds) > {CLOCK_SKEW_S}",
          f"{{{{ $labels.host }}}}'s clock is more than {CLOCK_SKEW_S:g} s off",
          "collective operations and logs across hosts disagree: fix the node's NTP (chrony); "
          "`npuops doctor -i INVENTORY` measures the skew across a fleet", for_="10m"),
)


# What a plan predicts, by the recording the dashboards plot beside the measured figure.
PREDICTIONS = (("npuops:predicted_ttft_seconds", "ttft_ms", 1e-3), ("npuops:predicted_tpot_seconds", "tpot_ms", 1e-3),
               ("npuops:predicted_output_tokens_per_second", "output_tokens_per_s", 1.0))


def _instances(records: Sequence[InstanceRecord]) -> dict[str, InstanceRecord]:
    """One engine record per instance (a router's first replica speaks for the router's instance)."""
    out: dict[str, InstanceRecord] = {}
    for record in sorted(records, key=lambda r: r.name):
        if not record.is_router and record.runs_engine:
            out.setdefault(record.behind or record.name, record)
    return out


def prediction_recordings(records: Sequence[InstanceRecord]) -> list[Recording]:
    """Each instance's plan prediction as constant series (`vector(x)` labelled with the instance: a recording's
    labels are written as they are, never expanded)."""
    out = []
    for name, record in _instances(records).items():
        for recorded, key, scale in PREDICTIONS:
            value = predicted(record, key) * scale
            if value > 0:
                out.append(Recording(recorded, f"vector({value:.6g})", {"npuops_instance": name}))
    return out


def latency_alerts(records: Sequence[InstanceRecord], factor: float = LATENCY_FACTOR) -> list[Alert]:
    """For each instance with a prediction, TTFT and TPOT p99 above `factor` times its plan's prediction. The
    instance's name is in the expression only (a PromQL string); its series carry it as `npuops_instance`, which
    the alert's text refers to."""
    out: list[Alert] = []
    for name, record in _instances(records).items():
        for what, key, recorded in (("TTFT", "ttft_ms", "npuops:ttft_seconds:p99"),
                                    ("TPOT", "tpot_ms", "npuops:tpot_seconds:p99")):
            predicted_s = predicted(record, key) / 1000
            if predicted_s <= 0:
                continue
            limit = round(predicted_s * factor, 6)
            out.append(Alert(
                f"Npuops{what}AbovePrediction", f'{recorded}{{npuops_instance="{_promql_string(name)}"}} > {limit}',
                f"{_INSTANCE}'s {what} p99 is over {factor:g}x its prediction",
                f"the plan predicted {predicted_s * 1000:g} ms for {_INSTANCE}'s workload: compare `npuops bench "
                f"{_INSTANCE}` with `npuops plan`; a slower node or a heavier workload than planned", for_="15m",
                runbook=INSTANCE_PAGE))
    return out


def _promql_string(value: str) -> str:
    """A value inside a PromQL double-quoted string, Go's escapes (instance names are [a-z0-9-]; escaped all the
    same): a backslash and a quote escaped, a control character as its code point."""
    return "".join("\\" + c if c in '\\"' else f"\\u{ord(c):04x}" if c < " " or c == "\x7f" else c for c in value)


def rules_file(records: Sequence[InstanceRecord], docs_url: str, factor: float = LATENCY_FACTOR) -> str:
    """The rule file: the recordings, the node's alerts and each instance's latency alerts (YAML)."""
    check_docs_url(docs_url)
    alerts = [*ALERTS, *latency_alerts(records, factor)]
    rendered = [alert.to_yaml(docs_url) for alert in alerts]
    recordings = [*RECORDINGS, *prediction_recordings(records)]
    groups = [{"name": "npuops-recordings", "rules": [r.to_yaml() for r in recordings]},
              {"name": "npuops-alerts", "rules": rendered}]
    return "# Rendered by `npuops monitor render`: edits are overwritten.\n" + yaml.safe_dump(
        {"groups": groups}, sort_keys=False, width=1000, allow_unicode=True)


def every_expression(records: Sequence[InstanceRecord]) -> list[str]:
    """Every PromQL expression the rules hold (for the metric-name test)."""
    return ([r.expr for r in (*RECORDINGS, *prediction_recordings(records))]
            + [a.expr for a in (*ALERTS, *latency_alerts(records))])
