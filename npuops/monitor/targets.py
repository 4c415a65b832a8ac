"""Prometheus targets from the instance records: one file_sd target group per engine's `/metrics`, per router's
metrics port, and the node's exporters (pure: records in, target groups out).

Labels, the same on every series of a target (Prometheus adds them at scrape time): `npuops_instance` (what the
operator launched: a router's replicas carry the router's name), `npuops_part` (the unit's instance: NAME-r0),
`model` (the served name), `role` (engine, replica, prefill, decode, router, node), `host`, `chips` (the device
ids, "" on the CPU engine). The alert rules group by them, and `npuops_instance` is what the rules' fixes name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from npuops.httpclient import client_host
from npuops.instance.record import InstanceRecord

ENGINES_JOB = "npuops-engines"
ROUTERS_JOB = "npuops-routers"
NODE_JOB = "npuops-node"
NPU_EXPORTER_JOB = "npuops-npu-exporter"


@dataclass(frozen=True)
class TargetGroup:
    """One file_sd entry: where to scrape and the labels of what is there."""

    target: str
    labels: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"targets": [self.target], "labels": dict(self.labels)}


def _address(host: str, port: int) -> str:
    where = client_host(host)
    return f"[{where}]:{port}" if ":" in where else f"{where}:{port}"


def _role(record: InstanceRecord) -> str:
    if record.pd_role:
        return str(record.pd_role)
    return "replica" if record.behind else "engine"


def engine_targets(records: Sequence[InstanceRecord], host: str) -> list[TargetGroup]:
    """Each engine's /metrics (its own address and port)."""
    out = []
    for record in sorted(records, key=lambda r: r.name):
        if record.is_router or not record.runs_engine:
            continue
        out.append(TargetGroup(_address(record.host, record.port), {
            "npuops_instance": record.behind or record.name, "npuops_part": record.name,
            "model": record.served_model_name, "role": _role(record), "host": host,
            "chips": ",".join(str(d) for d in record.devices)}))
    return out


def router_targets(records: Sequence[InstanceRecord], host: str) -> list[TargetGroup]:
    """Each router's metrics port (vllm-router's --prometheus-port: launch binds it to 127.0.0.1)."""
    out = []
    for record in sorted(records, key=lambda r: r.name):
        if not record.is_router or not record.metrics_port:
            continue
        out.append(TargetGroup(_address("127.0.0.1", record.metrics_port), {
            "npuops_instance": record.name, "npuops_part": record.name, "model": record.served_model_name,
            "role": "router", "host": host, "chips": "", "replicas": str(len(record.replicas))}))
    return out


def node_targets(address: str | None, host: str) -> list[TargetGroup]:
    return [TargetGroup(address, {"role": "node", "host": host})] if address else []


def file_sd(groups: Sequence[TargetGroup]) -> str:
    """A file_sd target file's text (JSON: Prometheus re-reads it when it changes)."""
    return json.dumps([g.to_json() for g in groups], indent=2) + "\n"
