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
from npuops.monitor.values import LABEL_NAME, WILDCARD_BINDS, host_problem, label_value_problem, split_address

ENGINES_JOB = "npuops-engines"
ROUTERS_JOB = "npuops-routers"
NODE_JOB = "npuops-node"
NPU_EXPORTER_JOB = "npuops-npu-exporter"


@dataclass(frozen=True)
class TargetGroup:
    """One file_sd entry: where to scrape and the labels of what is there."""

    target: str
    labels: dict[str, str]

    def __post_init__(self) -> None:
        # npuops' label names are its own constants: one Prometheus refuses is a bug here, not bad input.
        bad = [name for name in self.labels if not LABEL_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"label names {bad} are not Prometheus label names")

    def to_json(self) -> dict[str, Any]:
        return {"targets": [self.target], "labels": dict(self.labels)}


_LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class Reach:
    """How the Prometheus host reaches one serving host: on it (`here`: loopback binds too), or over the network
    at `address` (a wildcard bind there; a loopback bind cannot be reached from elsewhere)."""

    host: str  # the name the `host` label carries
    address: str = "127.0.0.1"
    here: bool = True

    def where(self, bind: str) -> str | None:
        """Where Prometheus scrapes a server bound to `bind` on that host, or None (loopback elsewhere)."""
        if self.here:
            return client_host(bind)
        if bind in WILDCARD_BINDS:
            return self.address
        return None if bind in _LOOPBACK else bind


def reach_problem(reach: Reach) -> str | None:
    """Why a host's parts cannot be rendered as it is reached, or None: its name is the `host` label, and its
    address (from elsewhere) where Prometheus scrapes."""
    return label_value_problem(reach.host, "host name") or (
        None if reach.here else host_problem(reach.address, "its address"))


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _role(record: InstanceRecord) -> str:
    if record.pd_role:
        return str(record.pd_role)
    return "replica" if record.behind else "engine"


def engine_targets(records: Sequence[InstanceRecord], reach: Reach) -> tuple[list[TargetGroup], list[str]]:
    """Each engine's /metrics (its own address and port), and the parts Prometheus cannot reach from where it runs."""
    out, unreachable = [], []
    for record in sorted(records, key=lambda r: r.name):
        if record.is_router or not record.runs_engine:
            continue
        where = reach.where(record.host)
        if where is None:
            unreachable.append(f"{reach.host}: {record.name} listens on {record.host} only")
            continue
        out.append(TargetGroup(_address(where, record.port), {
            "npuops_instance": record.behind or record.name, "npuops_part": record.name,
            "model": record.served_model_name, "role": _role(record), "host": reach.host,
            "chips": ",".join(str(d) for d in record.devices)}))
    return out, unreachable


def router_targets(records: Sequence[InstanceRecord], reach: Reach) -> tuple[list[TargetGroup], list[str]]:
    """Each router's metrics port (vllm-router's --prometheus-port: launch binds it to 127.0.0.1, so only a
    Prometheus on the router's host reaches it)."""
    out, unreachable = [], []
    for record in sorted(records, key=lambda r: r.name):
        if not record.is_router or not record.metrics_port:
            continue
        where = reach.where("127.0.0.1")
        if where is None:
            unreachable.append(f"{reach.host}: router {record.name}'s metrics listen on 127.0.0.1 only")
            continue
        out.append(TargetGroup(_address(where, record.metrics_port), {
            "npuops_instance": record.name, "npuops_part": record.name, "model": record.served_model_name,
            "role": "router", "host": reach.host, "chips": "", "replicas": str(len(record.replicas))}))
    return out, unreachable


def node_targets(address: str | None, reach: Reach) -> list[TargetGroup]:
    """An exporter of the node (node_exporter, npu-exporter) at `address` as seen on that node: a loopback one is
    reached at the node's address from elsewhere (an exporter meant to be scraped listens beyond loopback)."""
    if not address:
        return []
    bind, port = split_address(address, "the exporter's address")
    where = reach.where(bind) or reach.address
    return [TargetGroup(_address(where, port), {"role": "node", "host": reach.host})]


def file_sd(groups: Sequence[TargetGroup]) -> str:
    """A file_sd target file's text (JSON: Prometheus re-reads it when it changes)."""
    return json.dumps([g.to_json() for g in groups], indent=2) + "\n"
