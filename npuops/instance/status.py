"""What `npuops status` and `npuops list` report about an instance: the unit's state, the supervisor's stage and
last diagnosis, /health, uptime, and the live figures from /metrics."""

from __future__ import annotations

import time
from typing import Any

from npuops.httpclient import base_url, http_request
from npuops.instance.control import pid_alive
from npuops.instance.endpoint import health_ok
from npuops.instance.manager import SystemdManager
from npuops.instance.metrics import engine_figures, parse_prometheus
from npuops.instance.ray import describe_ray_state, probe_ray_cluster
from npuops.instance.record import MANAGER_SYSTEMD, InstanceRecord, read_status


def summarize(record: InstanceRecord, unit: dict[str, Any] | None, supervisor: dict[str, Any] | None,
              healthy: bool) -> str:
    """One word (and a reason) for the instance: healthy, starting, unhealthy, failed, stopped. Pure."""
    exit_info = (supervisor or {}).get("exit")
    stage = (supervisor or {}).get("stage")
    if unit is not None:
        active = unit.get("active_state")
        if active == "active" and healthy:
            return "healthy"
        if active == "activating":
            return f"starting ({stage or 'gate'})"
        if active == "active":
            return "unhealthy" if stage != "starting" else "starting"
        if active == "failed":
            return "failed"
        if active == "deactivating":
            return "stopping"
        return "stopped" if not exit_info or exit_info.get("reason") == "stopped" else "failed"
    # Foreground: the supervisor's own status file and whether it still runs.
    alive = supervisor is not None and not exit_info and pid_alive(supervisor.get("supervisor_pid"))
    if alive and healthy:
        return "healthy"
    if alive:
        if stage == "stopping":
            return "stopping"
        if stage in ("healthy", "unhealthy"):
            return "unhealthy"
        return f"starting ({stage})"
    if exit_info and exit_info.get("reason") != "stopped":
        return "failed"
    return "stopped"


def instance_status(record: InstanceRecord, manager: SystemdManager | None, *, metrics_interval_s: float = 1.0,
                    ) -> dict[str, Any]:
    url = base_url(record.host, record.port)
    unit = None
    if record.manager == MANAGER_SYSTEMD and manager is not None and manager.unavailable_reason() is None:
        unit = manager.state(record.unit).to_json()
    supervisor = read_status(record)
    if record.serves_api:
        healthy = health_ok(url, timeout=3.0)
    else:
        # A Ray worker or a headless engine answers no HTTP: its unit running (and, for an engine, its
        # supervisor seeing the process) is its health; the group's health is the first host's endpoint.
        healthy = unit is not None and unit.get("active_state") == "active"
    status: dict[str, Any] = {
        "name": record.name, "manager": record.manager, "unit": record.unit if record.manager == MANAGER_SYSTEMD
        else None, "url": url, "model": record.served_model_name, "devices": list(record.devices),
        "healthy": healthy, "unit_state": unit,
        "stage": (supervisor or {}).get("stage"),
        "uptime_s": None, "metrics": None, "diagnosis": None, "exit": None,
    }
    if supervisor is not None:
        exit_info = supervisor.get("exit")
        if exit_info:
            status["exit"] = {k: exit_info.get(k) for k in ("code", "reason", "engine_returncode", "at")}
            status["diagnosis"] = exit_info.get("diagnosis")
        healthy_at = supervisor.get("healthy_at")
        if healthy and isinstance(healthy_at, (int, float)) and not exit_info:
            status["uptime_s"] = round(time.time() - healthy_at, 1)
    if record.cluster:
        status["cluster"] = cluster_status(record)
        status["role"] = record.role
    if healthy and record.serves_api:
        first = http_request(url + "/metrics", timeout=5.0)
        if first is not None and first[0] == 200:
            before = parse_prometheus(first[1].decode("utf-8", "replace"))
            time.sleep(metrics_interval_s)
            second = http_request(url + "/metrics", timeout=5.0)
            if second is not None and second[0] == 200:
                now = parse_prometheus(second[1].decode("utf-8", "replace"))
                status["metrics"] = engine_figures(now, before, metrics_interval_s)
    status["state"] = summarize(record, unit, supervisor, healthy)
    return status


def cluster_status(record: InstanceRecord) -> dict[str, Any]:
    """This host's part of a multi-node instance and, under Ray, which hosts' nodes are alive."""
    cluster = record.cluster
    out: dict[str, Any] = {key: cluster.get(key) for key in ("group", "strategy", "rank", "role", "endpoint_host")}
    out["nodes"] = [dict(n) for n in cluster.get("nodes") or []]
    if cluster.get("strategy") == "ray":
        out["ray"] = probe_ray_cluster(cluster)
    return out


def _fmt(value: Any, scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value * scale:.{digits}f}{unit}"


def render_status_text(status: dict[str, Any]) -> str:
    lines = [f"{status['name']}: {status['state']}  ({status['model']} on {status['url']})"]
    unit = status.get("unit_state")
    if unit:
        restarts = f", {unit['restarts']} restart(s)" if unit.get("restarts") else ""
        lines.append(f"  unit      {status['unit']}: {unit['active_state']}/{unit['sub_state']}"
                     f"{', since ' + unit['since'] if unit.get('since') else ''}{restarts}")
    elif status["manager"] != MANAGER_SYSTEMD:
        lines.append("  manager   foreground supervisor (no unit)")
    if status.get("stage"):
        lines.append(f"  stage     {status['stage']}")
    if status.get("uptime_s") is not None:
        lines.append(f"  uptime    {status['uptime_s']:.0f} s")
    if status.get("devices"):
        lines.append(f"  devices   {','.join(map(str, status['devices']))}")
    metrics = status.get("metrics")
    if metrics:
        lines.append(f"  requests  {_fmt(metrics['requests_running'], digits=0)} running, "
                     f"{_fmt(metrics['requests_waiting'], digits=0)} waiting")
        lines.append(f"  KV cache  {_fmt(metrics['kv_cache_usage'], 100, '%')} used"
                     + (f" of {metrics['kv_cache_tokens']:,} tokens" if metrics.get("kv_cache_tokens") else ""))
        lines.append(f"  tokens/s  {_fmt(metrics.get('generation_tokens_per_s'))} generated, "
                     f"{_fmt(metrics.get('prompt_tokens_per_s'))} prompt "
                     f"(totals {_fmt(metrics['generation_tokens_total'], digits=0)} / "
                     f"{_fmt(metrics['prompt_tokens_total'], digits=0)})")
        for key, label in (("ttft_s", "TTFT"), ("itl_s", "ITL")):
            q = metrics[key]
            lines.append(f"  {label:<9} p50 {_fmt(q['p50'], 1000, ' ms')}, p90 {_fmt(q['p90'], 1000, ' ms')}, "
                         f"p99 {_fmt(q['p99'], 1000, ' ms')}")
    cluster = status.get("cluster")
    if cluster:
        lines.append(f"  cluster   {cluster['strategy']} group {cluster['group']}: this host is {cluster['role']} "
                     f"(rank {cluster['rank']}), endpoint on {cluster['endpoint_host']}")
        ray = cluster.get("ray")
        if ray:
            lines.append(f"  ray       {describe_ray_state(ray)}")
    diagnosis = status.get("diagnosis")
    if diagnosis:
        exit_info = status.get("exit") or {}
        lines.append(f"  last exit {exit_info.get('reason')} (status {exit_info.get('code')})")
        lines.append(f"  diagnosis [{diagnosis['id']}] {diagnosis['cause']}")
        if diagnosis.get("line"):
            lines.append(f"  seen      {diagnosis['line']}")
        lines.append(f"  fix       {diagnosis['fix']}")
    return "\n".join(lines)
