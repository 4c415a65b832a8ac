"""The Grafana dashboards npuops renders: every query reads a metric a source exposes or a recording npuops
writes, every query is PromQL Prometheus parses (promtool, as a recording rule), every panel has its place, and
the variables the queries use are the dashboard's own."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from npuops.monitor.dashboards import DASHBOARDS, dashboard_json, every_query
from npuops.monitor.rules import PREDICTIONS, RECORDINGS
from npuops.monitor.sources import metric_names, unknown_metrics
from tests.monitor.test_rules import promtool

RECORDED = {r.record for r in RECORDINGS} | {name for name, _, _ in PREDICTIONS}


def test_every_query_reads_a_known_metric_or_an_npuops_recording() -> None:
    for query in every_query():
        assert unknown_metrics(query) == [], query
        assert {n for n in metric_names(query) if n.startswith("npuops:")} <= RECORDED, query


def test_every_query_is_promql_prometheus_parses(tmp_path: Path) -> None:
    # A dashboard variable ($host) is Grafana's: a regex that matches anything in its place.
    queries = [re.sub(r"\$\w+", ".*", q) for q in every_query()]
    rules = {"groups": [{"name": "dashboards", "rules": [{"record": f"npuops:dashboard_query_{i}", "expr": q}
                                                         for i, q in enumerate(queries)]}]}
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules, width=1000))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(queries)} rules found" in done.stdout


def test_each_dashboard_is_a_grafana_model_with_its_panels_placed_and_its_variables_defined() -> None:
    assert len({d.uid for d in DASHBOARDS}) == len(DASHBOARDS)
    for dashboard in DASHBOARDS:
        model = json.loads(dashboard_json(dashboard))
        assert model["uid"] == dashboard.uid and model["title"].startswith("npuops: ")
        variables = {v["name"] for v in model["templating"]["list"]}
        assert "datasource" in variables
        places = set()
        for panel in model["panels"]:
            grid = panel["gridPos"]
            assert (grid["x"], grid["y"]) not in places and grid["x"] + grid["w"] <= 24, panel["title"]
            places.add((grid["x"], grid["y"]))
            assert panel["targets"] and [t["refId"] for t in panel["targets"]] == [
                chr(ord("A") + i) for i in range(len(panel["targets"]))]
            for target in panel["targets"]:
                assert set(re.findall(r"\$(\w+)", target["expr"])) <= variables, (dashboard.uid, target["expr"])
        assert len(model["panels"]) == len(dashboard.panels) and len(dashboard.panels) >= 5


def test_the_instance_dashboard_plots_each_measured_figure_beside_its_prediction() -> None:
    instance = next(d for d in DASHBOARDS if d.uid == "npuops-instance")
    legends = {p.title: [q.legend for q in p.queries] for p in instance.panels}
    beside = [t for t, legend in legends.items() if legend[-1:] == ["predicted"]]
    assert len(beside) == 3 and any("TTFT" in t for t in beside) and any("TPOT" in t for t in beside)
