"""`npuops monitor render --output DIR`: a node's Prometheus configuration from its instance records.

DIR/prometheus.yml is a configuration Prometheus runs as it is (or whose scrape_configs and rule_files an existing
one copies): one job per kind of target, each reading a file_sd target file that Prometheus re-reads when it
changes (DIR/targets/*.json), and the rule file (DIR/rules/npuops.rules.yml). Relative paths in a Prometheus
configuration are relative to its own directory, so DIR moves as a whole. DIR/dashboards/*.json are Grafana's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from npuops.atomic import write_files_as_one_set
from npuops.errors import BadInputError
from npuops.instance.record import InstanceRecord
from npuops.monitor.dashboards import DASHBOARDS, dashboard_json
from npuops.monitor.rules import LATENCY_FACTOR, check_docs_url, rules_file
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
    reach_problem,
    router_targets,
)
from npuops.monitor.values import quoted, record_problem, split_address

CONFIG_FILE = "prometheus.yml"
RULES_FILE = "rules/npuops.rules.yml"
TARGET_FILES = {ENGINES_JOB: "targets/engines.json", ROUTERS_JOB: "targets/routers.json",
                NODE_JOB: "targets/node.json", NPU_EXPORTER_JOB: "targets/npu-exporter.json"}


# Seconds between scrapes and rule evaluations (`--scrape-interval`): at 300 s and more a series goes stale
# between two samples (Prometheus' 5-minute lookback) and every `rate(...[5m])` of the rules is empty.
SCRAPE_INTERVAL_S = (1, 300)


@dataclass(frozen=True)
class MonitorChoices:
    """Where the node's exporters listen (None: not scraped), where the alerts' runbooks are, the factor over an
    instance's predicted latency that alerts, and how often Prometheus scrapes. Checked whole (types too: they are
    read back from monitor.json), so what reaches the files is what Prometheus accepts."""

    node_exporter: str | None = "127.0.0.1:9100"
    npu_exporter: str | None = None
    docs_url: str = ""
    latency_factor: float = LATENCY_FACTOR
    scrape_interval_s: int = 15

    def __post_init__(self) -> None:
        for flag, address in (("--node-exporter", self.node_exporter), ("--npu-exporter", self.npu_exporter)):
            if address is not None:
                split_address(address, flag)
        check_docs_url(self.docs_url)
        factor = self.latency_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1.0 < factor <= 100:
            raise BadInputError(f"--latency-factor {quoted(factor)} is out of range",
                                "give a factor over the prediction between 1 and 100, e.g. 3")
        low, high = SCRAPE_INTERVAL_S
        interval = self.scrape_interval_s
        if isinstance(interval, bool) or not isinstance(interval, int) or not low <= interval <= high:
            raise BadInputError(f"--scrape-interval {quoted(interval)} is out of range",
                                f"give whole seconds from {low} to {high}, e.g. 15")


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
    # Hosts and records left out because a value they carry is not one npuops writes into Prometheus' files, and why.
    refused: list[str] = field(default_factory=list)


def trusted_hosts(hosts: Sequence[tuple[Reach, Sequence[InstanceRecord]]]
                  ) -> tuple[list[tuple[Reach, list[InstanceRecord]]], list[str]]:
    """The hosts and records whose every value may reach Prometheus' files, and a line for each left out (pure)."""
    kept: list[tuple[Reach, list[InstanceRecord]]] = []
    refused: list[str] = []
    for reach, records in hosts:
        problem = reach_problem(reach)
        if problem:
            refused.append(f"host {quoted(reach.host)} not watched: {problem}")
            continue
        good = []
        for record in records:
            why = record_problem(record)
            if why:
                refused.append(f"{reach.host}: instance {quoted(record.name)} not watched: {why}")
            else:
                good.append(record)
        kept.append((reach, good))
    return kept, refused


def render_hosts(hosts: Sequence[tuple[Reach, Sequence[InstanceRecord]]], choices: MonitorChoices) -> Rendered:
    """Every file of DIR for the instances of each host, as Prometheus reaches that host (pure). A host or a record
    with a value npuops does not write into Prometheus' files is left out and named (`refused`)."""
    watched, refused = trusted_hosts(hosts)
    groups: dict[str, list[TargetGroup]] = {job: [] for job in TARGET_FILES}
    unreachable: list[str] = []
    for reach, records in watched:
        for job, (found, missed) in ((ENGINES_JOB, engine_targets(records, reach)),
                                     (ROUTERS_JOB, router_targets(records, reach))):
            groups[job] += found
            unreachable += missed
        groups[NODE_JOB] += node_targets(choices.node_exporter, reach)
        groups[NPU_EXPORTER_JOB] += node_targets(choices.npu_exporter, reach)
    every_record = [r for _, records in watched for r in records]
    files = {CONFIG_FILE: _config(choices.scrape_interval_s),
             RULES_FILE: rules_file(every_record, choices.docs_url, choices.latency_factor)}
    for job, path in TARGET_FILES.items():
        files[path] = file_sd(groups[job])
    for dashboard in DASHBOARDS:
        files[f"dashboards/{dashboard.uid}.json"] = dashboard_json(dashboard)
    return Rendered(files, unreachable, refused)


def render_monitoring(records: Sequence[InstanceRecord], host: str, choices: MonitorChoices) -> Rendered:
    """Every file of DIR for this node's instances, Prometheus running on this node (pure)."""
    return render_hosts([(Reach(host), records)], choices)


def write_monitoring(output: Path, files: dict[str, str]) -> list[Path]:
    """DIR's files as one set (Prometheus reads them at any moment: each is renamed into place whole)."""
    try:
        for relative in files:
            (output / relative).parent.mkdir(parents=True, exist_ok=True)
        return write_files_as_one_set([(output / name, text, 0o644) for name, text in files.items()])
    except OSError as exc:
        raise BadInputError(f"cannot write {exc.filename or output}: {exc.strerror}",
                            "give --output a directory you can write to") from None
    except ValueError as exc:  # a path with a NUL byte
        raise BadInputError(f"cannot write into {quoted(str(output))}: {exc}", "give --output a usable path") from None
