"""`npuops monitor render --output DIR`: a node's Prometheus configuration from its instance records.

DIR/prometheus.yml is a configuration Prometheus runs as it is (or whose scrape_configs and rule_files an existing
one copies): one job per kind of target, each reading a file_sd target file that Prometheus re-reads when it
changes (DIR/targets/*.json), and the rule file (DIR/rules/npuops.rules.yml). Relative paths in a Prometheus
configuration are relative to its own directory, so DIR moves as a whole. DIR/dashboards/*.json are Grafana's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from npuops.atomic import write_files_as_one_set
from npuops.errors import BadInputError
from npuops.instance.record import InstanceRecord
from npuops.monitor.dashboards import DASHBOARDS, dashboard_json
from npuops.monitor.rules import LATENCY_FACTOR, rules_file
from npuops.monitor.targets import (
    ENGINES_JOB,
    NODE_JOB,
    NPU_EXPORTER_JOB,
    ROUTERS_JOB,
    Reach,
    TargetGroup,
    engine_targets,
    file_sd,
    node_targets,
    router_targets,
)

CONFIG_FILE = "prometheus.yml"
RULES_FILE = "rules/npuops.rules.yml"
TARGET_FILES = {ENGINES_JOB: "targets/engines.json", ROUTERS_JOB: "targets/routers.json",
                NODE_JOB: "targets/node.json", NPU_EXPORTER_JOB: "targets/npu-exporter.json"}


@dataclass(frozen=True)
class MonitorChoices:
    """Where the node's exporters listen (None: not scraped), where the alerts' runbooks are, the factor over an
    instance's predicted latency that alerts, and how often Prometheus scrapes."""

    node_exporter: str | None = "127.0.0.1:9100"
    npu_exporter: str | None = None
    docs_url: str = ""
    latency_factor: float = LATENCY_FACTOR
    scrape_interval_s: int = 15

    def __post_init__(self) -> None:
        for flag, address in (("--node-exporter", self.node_exporter), ("--npu-exporter", self.npu_exporter)):
            if address is not None and not _is_address(address):
                raise BadInputError(f"{flag} {address!r} is not HOST:PORT", f"give e.g. {flag} 127.0.0.1:9100")
        if not 1.0 < self.latency_factor <= 100:
            raise BadInputError(f"--latency-factor {self.latency_factor:g} is out of range",
                                "give a factor over the prediction between 1 and 100, e.g. 3")


def _is_address(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 1 <= int(port) <= 65535 and not any(c in host for c in " \n\"'{}")


def _config(interval_s: int) -> str:
    jobs = []
    for job, path in TARGET_FILES.items():
        jobs.append({"job_name": job, "file_sd_configs": [{"files": [path], "refresh_interval": "30s"}]})
    config = {"global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
              "rule_files": [RULES_FILE], "scrape_configs": jobs}
    return ("# Rendered by `npuops monitor render`: run Prometheus on it, or copy its rule_files and scrape_configs\n"
            "# into your own (the paths are relative to this file's directory).\n"
            + yaml.safe_dump(config, sort_keys=False))


@dataclass(frozen=True)
class Rendered:
    files: dict[str, str]  # DIR's files by relative path
    unreachable: list[str]  # parts Prometheus cannot scrape from where it runs, and why


def render_hosts(hosts: Sequence[tuple[Reach, Sequence[InstanceRecord]]], choices: MonitorChoices) -> Rendered:
    """Every file of DIR for the instances of each host, as Prometheus reaches that host (pure)."""
    groups: dict[str, list[TargetGroup]] = {job: [] for job in TARGET_FILES}
    unreachable: list[str] = []
    for reach, records in hosts:
        for job, (found, missed) in ((ENGINES_JOB, engine_targets(records, reach)),
                                     (ROUTERS_JOB, router_targets(records, reach))):
            groups[job] += found
            unreachable += missed
        groups[NODE_JOB] += node_targets(choices.node_exporter, reach)
        groups[NPU_EXPORTER_JOB] += node_targets(choices.npu_exporter, reach)
    every_record = [r for _, records in hosts for r in records]
    files = {CONFIG_FILE: _config(choices.scrape_interval_s),
             RULES_FILE: rules_file(every_record, choices.docs_url, choices.latency_factor)}
    for job, path in TARGET_FILES.items():
        files[path] = file_sd(groups[job])
    for dashboard in DASHBOARDS:
        files[f"dashboards/{dashboard.uid}.json"] = dashboard_json(dashboard)
    return Rendered(files, unreachable)


def render_monitoring(records: Sequence[InstanceRecord], host: str, choices: MonitorChoices) -> dict[str, str]:
    """Every file of DIR for this node's instances, Prometheus running on this node (pure)."""
    return render_hosts([(Reach(host), records)], choices).files


def write_monitoring(output: Path, files: dict[str, str]) -> list[Path]:
    """DIR's files as one set (Prometheus reads them at any moment: each is renamed into place whole)."""
    try:
        for relative in files:
            (output / relative).parent.mkdir(parents=True, exist_ok=True)
        return write_files_as_one_set([(output / name, text, 0o644) for name, text in files.items()])
    except OSError as exc:
        raise BadInputError(f"cannot write {exc.filename or output}: {exc.strerror}",
                            "give --output a directory you can write to") from None
