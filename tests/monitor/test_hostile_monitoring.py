"""Hostile values through `npuops monitor render` (npuops/monitor), read back by their consumers' rules.

Prometheus expands every alert's annotations and labels as Go templates: a name written into one runs there (an
instance called `{{ query "up" }}` queries in every alert's text) or breaks the whole rule file (`x{{`). What another
host answers to `npuops monitor targets --json`, a record on disk and the operator's options are all input: each
value is refused in one line, or written so that the rule file and the configuration pass promtool, no alert's
template holds anything but fixed text and `{{ $labels.x }}`, every target is HOST:PORT, and a hostile label value
shows in an alert's text verbatim (`promtool test rules`). The promtool runs are batched: one call checks many
hostile cases.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from npuops.errors import BadInputError
from npuops.fleet.group_ops import HostAnswer
from npuops.fleet.inventory import InventoryHost
from npuops.instance.record import MANAGER_FOREGROUND, InstanceRecord, write_record
from npuops.monitor.fleet_render import hosts_from_answers
from npuops.monitor.refresh import MONITOR_FILE, refresh_monitoring, saved_render
from npuops.monitor.render import MonitorChoices, render_hosts, render_monitoring, write_monitoring
from npuops.monitor.rules import rules_file
from tests.monitor.test_rules import promtool
from tests.support.instance_records import make_record
from tests.support.paths import REPO

DOCS = "https://docs.example/checks"
PREDICTION = {"ttft_ms": 50.0, "tpot_ms": 20.0, "output_tokens_per_s": 40.0}
# What attackers reach for against a Go template, a PromQL string, YAML, a target address and a terminal.
PIECES = ["{{", "}}", "{{ query \"up\" }}", "{{ (query \"up\") }}", "{{/* c */}}", "{{- ", " -}}", "{{ $labels }}",
          "{{ $value }}", "$value", "{{ define \"t\" }}x{{ end }}", "{{ template \"t\" }}", "`", '"', "'", "\\", "\\n",
          "\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "\ufeff", "\ud800", " ", ":", "/", "[", "]",
          "%", "#", "&", "<", "é", "鍵", "a", "0", "-", ".", "evil host:1/x", "http://", "https://x.example/",
          "file:///", "::1", "[", "10.0.0.9", "node-1"]
HOSTILE = st.one_of(st.text(max_size=40), st.lists(st.sampled_from(PIECES), min_size=1, max_size=10).map("".join))
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | HOSTILE,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(HOSTILE, inner, max_size=3),
                           max_leaves=6)
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The template actions an alert may hold; everything else in it must be fixed text without a brace.
ALLOWED_ACTION = re.compile(r"\{\{ (\$labels\.[a-zA-Z_][a-zA-Z0-9_]*|\$value) \}\}")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
DNS_NAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                      r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def _routed(host: str = "0.0.0.0") -> list[InstanceRecord]:
    """Instance m: two replicas behind a router, bound where Prometheus on another machine reaches them."""
    replicas = [make_record(Path("/state"), f"m-r{i}", host=host, port=9101 + i, behind="m", prediction=PREDICTION)
                for i in range(2)]
    router = make_record(Path("/state"), "m", role="router", port=9100, metrics_port=9103,
                         replicas=("m-r0", "m-r1"))
    return [*replicas, router]


def _answer(records: list[dict[str, Any]], hostname: object = "other-host") -> HostAnswer:
    return HostAnswer("node-b", "ok", {"ok": True, "hostname": hostname, "records": records}, 0)


HOSTS = [InventoryHost("node-a", "10.0.0.1", 22), InventoryHost("node-b", "10.0.0.2", 22)]


def _group(answer: HostAnswer, address: str = "10.0.0.2", choices: MonitorChoices | None = None
           ) -> tuple[dict[str, str], list[str]]:
    """A group render of node-a (benign) and node-b (`answer`, at inventory `address`): the files, and every line
    naming a host or record left out."""
    hosts = [HOSTS[0], dataclasses.replace(HOSTS[1], address=address)]
    benign = _answer([r.to_json() for r in _routed()])
    found, failed = hosts_from_answers(hosts, {"node-a": dataclasses.replace(benign, host="node-a"), "node-b": answer})
    rendered = render_hosts(found, choices or MonitorChoices(docs_url=DOCS))
    return rendered.files, [*failed, *rendered.refused]


REFERENCE, _ = _group(_answer([r.to_json() for r in _routed()]))


def _templates(rules_text: str) -> list[str]:
    """Every Go template of the rule file (the alerts' annotations and labels), its numbers as N (a prediction is
    a number of the record's)."""
    rules = yaml.load(rules_text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return [re.sub(r"\d+(\.\d+)?(e[+-]?\d+)?", "N", text) for group in rules["groups"] for rule in group["rules"]
            if "alert" in rule for text in (*rule["annotations"].values(), *rule["labels"].values())]


def _fixed(template: str) -> bool:
    rest = ALLOWED_ACTION.sub("", template)
    return "{" not in rest and "}" not in rest


ALLOWED = set(_templates(REFERENCE["rules/npuops.rules.yml"]))


def _is_target(text: str) -> bool:
    host, _, port = text.rpartition(":")
    if host.startswith("["):
        host = host[1:-1] if host.endswith("]") else ""
    try:
        ipaddress.ip_address(host)
        address = "%" not in host
    except ValueError:
        address = bool(DNS_NAME.fullmatch(host))
    return address and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535


def _assert_safe(files: dict[str, str], lines: list[str]) -> None:
    """What any render must hold, whatever it was given: alerts of fixed text and label references (the very texts
    of a benign render: nothing given reaches a template), targets Prometheus accepts, the configuration and the
    dashboards a benign render's, and each line about what was left out one printable line."""
    for text in _templates(files["rules/npuops.rules.yml"]):
        assert _fixed(text) and text in ALLOWED, text
    for path, text in files.items():
        if path.startswith("targets/"):
            for group in json.loads(text):
                assert all(_is_target(t) for t in group["targets"]), group["targets"]
                assert all(LABEL_NAME.fullmatch(name) for name in group["labels"]), group["labels"]
        elif not path.startswith("rules/"):
            assert text == REFERENCE[path], path
    for line in lines:
        assert line.isprintable(), line


# --- what another host answers --------------------------------------------------------------------------------

FIELDS = ("name", "behind", "served_model_name", "host", "port", "metrics_port", "replicas", "prediction", "devices",
          "pd_role", "role", "cluster", "unit", "status_file", "instance_dir", "manager", "created_at")


@FAST
@given(field=st.sampled_from(FIELDS), value=st.one_of(HOSTILE, JSON_VALUES), which=st.integers(0, 2))
@example(field="name", value='{{ query "up" }}', which=2)
@example(field="behind", value='{{ query "up" }}', which=0)
@example(field="behind", value="x{{", which=1)
@example(field="host", value="evil host:1/x", which=0)
@example(field="served_model_name", value="a\nb", which=0)
@example(field="prediction", value={"ttft_ms": "fast"}, which=0)
def test_a_hostile_record_in_a_hosts_answer_never_reaches_a_template(field: str, value: Any, which: int) -> None:
    records = [r.to_json() for r in _routed()]
    records[which][field] = value
    files, lines = _group(_answer(records))
    _assert_safe(files, lines)
    if field in ("name", "behind", "host") and isinstance(value, str) and "{{" in value:
        assert any(line.startswith("node-b: ") for line in lines)  # named, with why


@FAST
@given(document=JSON_VALUES, address=HOSTILE, hostname=JSON_VALUES)
@example(document=None, address="evil host:1/x", hostname="x")
@example(document=None, address="10.0.0.2", hostname=["a"])
@example(document=[[]], address="10.0.0.2", hostname="x")
def test_a_hostile_answer_or_inventory_address_is_named_never_rendered(document: Any, address: str,
                                                                       hostname: Any) -> None:
    records = document if document is not None else [r.to_json() for r in _routed()]
    answer = dataclasses.replace(_answer([]), answer={"ok": True, "hostname": hostname, "records": records})
    files, lines = _group(answer, address=address)
    _assert_safe(files, lines)
    if hostname == ["a"]:
        assert "node-b: not an npuops `npuops monitor targets --json` answer: hostname is a list, not a string; fix: " \
            "upgrade npuops there" in lines
    if address == "evil host:1/x" and document is None and isinstance(hostname, str):
        assert [line for line in lines if line.startswith("node-b: ")] == [
            "node-b: not watched: its address 'evil host:1/x' is neither an IP address nor a DNS name; fix: give the "
            "host an IP address or DNS name in the inventory (ansible_host) and a name of printable text"]


def test_an_answer_of_too_many_records_is_refused_whole() -> None:
    one = _routed()[0].to_json()
    _, lines = _group(_answer([one] * 1001))
    assert lines == ["node-b: not an npuops `npuops monitor targets --json` answer: 1001 records, more than the 1000 "
                     "npuops reads; fix: upgrade npuops there"]


# --- promtool on what is accepted -------------------------------------------------------------------------------

LABEL_VALUES = HOSTILE.filter(lambda v: 0 < len(v) and v.isprintable())
DOCS_URLS = st.one_of(HOSTILE, st.lists(st.sampled_from(PIECES), max_size=6).map(lambda p: DOCS + "".join(p)))


def _accepted_docs_urls(urls: list[str]) -> list[str]:
    accepted = []
    for url in urls:
        try:
            MonitorChoices(docs_url=url)
        except BadInputError as exc:
            assert "--docs-url" in exc.problem and "\n" not in exc.one_line()
        else:
            assert not re.search(r"[\s\"'`{}<>\\]", url), url
            accepted.append(url)
    return accepted


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                                HealthCheck.function_scoped_fixture])
@given(names=st.lists(LABEL_VALUES, min_size=5, max_size=25, unique=True),
       served=st.lists(HOSTILE, min_size=5, max_size=15), binds=st.lists(HOSTILE, min_size=5, max_size=15),
       urls=st.lists(DOCS_URLS, min_size=3, max_size=10))
@example(names=['{{ query "up" }}', "x{{", "}}", "a\"b\\c`d", '{{ define "t" }}{{ end }}'],
         served=['{{ query "up" }}', "x{{"], binds=["evil host:1/x", "[::1]", "a/b"],
         urls=['http://x/{{ query "up" }}', "https://docs.example/a b", DOCS, ""])
def test_every_accepted_value_passes_promtool_and_no_name_reaches_a_template(
        tmp_path_factory: pytest.TempPathFactory, names: list[str], served: list[str], binds: list[str],
        urls: list[str]) -> None:
    work = tmp_path_factory.mktemp("hostile")
    # Rules for instances of any name a label may carry (stricter names come first in npuops: the rule file's
    # escaping holds without them), one file per accepted --docs-url.
    records = [make_record(Path("/state"), f"n{i}", prediction=PREDICTION) for i in range(len(names))]
    records = [dataclasses.replace(r, name=name) for r, name in zip(records, names, strict=True)]
    benign = [make_record(Path("/state"), f"n{i}", prediction=PREDICTION) for i in range(len(names))]
    rule_files = []
    for i, url in enumerate(["", *_accepted_docs_urls(urls)]):
        text = rules_file(records, url)
        # The very templates of instances named n0, n1, ...: no name reaches one.
        assert set(_templates(text)) == set(_templates(rules_file(benign, url)))
        assert all(_fixed(template) for template in _templates(text))
        rule_files.append(work / f"rules-{i}.yml")
        rule_files[-1].write_text(text)
    # Another host's parts with any served name and any bind: what is accepted passes `promtool check config`.
    answer = []
    for i, (model, bind) in enumerate(zip(served, binds, strict=False)):
        answer.append(dataclasses.replace(_routed()[0], name=f"p{i}", behind=None, served_model_name=model,
                                          host=bind, port=9200 + i).to_json())
    files, lines = _group(_answer(answer))
    _assert_safe(files, lines)
    write_monitoring(work / "group", files)
    checked = subprocess.run([promtool(), "check", "rules", *map(str, rule_files)], capture_output=True, text=True,
                             timeout=120)
    assert checked.returncode == 0, (checked.stdout + checked.stderr)[-3000:]
    config = subprocess.run([promtool(), "check", "config", str(work / "group" / "prometheus.yml")],
                            capture_output=True, text=True, timeout=120)
    assert config.returncode == 0, (config.stdout + config.stderr)[-3000:]


# Names no launch allows, as another host's labels may carry them: the alert's text shows each as it is.
SHOWN_VERBATIM = ['{{ query "up" }}', "x{{", "}}{{", '{{ define "t" }}a{{ end }}{{ template "t" }}', "$value",
                  "{{ $labels }}", 'a"b\\c`d', "é 鍵"]


def _series(metric: str, labels: dict[str, str]) -> str:
    # JSON's string escapes are Go's (PromQL parses series with Go's rules).
    return metric + "{" + ",".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in labels.items()) + "}"


def test_a_hostile_label_value_shows_in_the_alert_verbatim_never_executed(tmp_path: Path) -> None:
    records = [dataclasses.replace(make_record(tmp_path, "n", prediction=PREDICTION), name=name)
               for name in SHOWN_VERBATIM]
    (tmp_path / "npuops.rules.yml").write_text(rules_file(records, DOCS))
    metric = "vllm:time_to_first_token_seconds_bucket"
    series = [{"series": _series(metric, {"npuops_instance": name, "npuops_part": "p", "le": le}), "values": values}
              for name in SHOWN_VERBATIM for le, values in (("0.01", "0x40"), ("1", "0+10x40"), ("+Inf", "0+10x40"))]
    series.append({"series": _series("node_timex_offset_seconds", {"host": SHOWN_VERBATIM[0]}), "values": "0.8x40"})
    expected_ttft = [{"exp_labels": {"npuops_instance": name, "severity": "warning"}, "exp_annotations": {
        "summary": f"{name}'s TTFT p99 is over 3x its prediction",
        "description": f"the plan predicted 50 ms for {name}'s workload: compare `npuops bench {name}` with `npuops "
                       "plan`; a slower node or a heavier workload than planned",
        "runbook_url": f"{DOCS}/instances-healthy.md"}} for name in SHOWN_VERBATIM]
    skew = {"exp_labels": {"host": SHOWN_VERBATIM[0], "severity": "warning"}, "exp_annotations": {
        "summary": f"{SHOWN_VERBATIM[0]}'s clock is more than 0.5 s off",
        "description": "collective operations and logs across hosts disagree: fix the node's NTP (chrony); "
                       "`npuops doctor -i INVENTORY` measures the skew across a fleet"}}
    tests = {"rule_files": ["npuops.rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "alert_rule_test": [
            {"eval_time": "40m", "alertname": "NpuopsTTFTAbovePrediction", "exp_alerts": expected_ttft},
            {"eval_time": "40m", "alertname": "NodeClockSkew", "exp_alerts": [skew]}]}]}
    (tmp_path / "npuops.test.yml").write_text(yaml.safe_dump(tests, sort_keys=False, width=1000, allow_unicode=True))
    done = subprocess.run([promtool(), "test", "rules", str(tmp_path / "npuops.test.yml")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]


# --- the options --------------------------------------------------------------------------------------------------

@FAST
@given(address=HOSTILE)
@example(address="evil host:1/x")
@example(address="a/b:9100")
@example(address="host:１２")
@example(address="::1:9100")
def test_an_exporter_address_is_host_port_or_refused_in_one_line(address: str) -> None:
    try:
        choices = MonitorChoices(node_exporter=address)
    except BadInputError as exc:
        assert "--node-exporter" in exc.problem and "\n" not in exc.one_line()
        return
    files = render_monitoring([], "node-1", choices).files
    assert all(_is_target(t) for g in json.loads(files["targets/node.json"]) for t in g["targets"]), address


@pytest.mark.parametrize(("choice", "flag"), [
    ({"scrape_interval_s": -5}, "--scrape-interval"), ({"scrape_interval_s": 0}, "--scrape-interval"),
    ({"scrape_interval_s": 301}, "--scrape-interval"), ({"scrape_interval_s": True}, "--scrape-interval"),
    ({"scrape_interval_s": "15"}, "--scrape-interval"), ({"scrape_interval_s": 1.5}, "--scrape-interval"),
    ({"latency_factor": float("nan")}, "--latency-factor"), ({"latency_factor": "3"}, "--latency-factor"),
    ({"latency_factor": True}, "--latency-factor"), ({"docs_url": 'http://x/{{ query "up" }}'}, "--docs-url"),
    ({"docs_url": "javascript:alert(1)"}, "--docs-url"), ({"docs_url": "https://x/a b"}, "--docs-url"),
    ({"docs_url": "https://x/\n"}, "--docs-url"), ({"docs_url": 5}, "--docs-url"),
    ({"node_exporter": 9100}, "--node-exporter"), ({"npu_exporter": "host:0"}, "--npu-exporter"),
])
def test_an_option_out_of_range_is_refused_in_one_line(choice: dict[str, Any], flag: str) -> None:
    with pytest.raises(BadInputError) as caught:
        MonitorChoices(**choice)
    assert caught.value.problem.startswith(flag) and "\n" not in caught.value.one_line()


def test_the_scrape_interval_is_1_to_300_seconds_each_passing_promtool(tmp_path: Path) -> None:
    for refused in (0, 301):
        with pytest.raises(BadInputError, match="--scrape-interval"):
            MonitorChoices(scrape_interval_s=refused)
    configs = []
    for interval in (1, 300):
        rendered = render_monitoring(_routed("127.0.0.1"), "node-1", MonitorChoices(scrape_interval_s=interval))
        write_monitoring(tmp_path / str(interval), rendered.files)
        configs.append(str(tmp_path / str(interval) / "prometheus.yml"))
    done = subprocess.run([promtool(), "check", "config", *configs], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# --- the records on this node ---------------------------------------------------------------------------------

def test_a_local_record_with_a_hostile_value_is_left_out_and_named(tmp_path: Path) -> None:
    records = _routed("127.0.0.1")
    bad = dataclasses.replace(records[0], served_model_name="m\n{{ query \"up\" }}",
                              prediction={"ttft_ms": "fast", "tpot_ms": float("inf")})
    rendered = render_monitoring([bad, *records[1:]], "node-1", MonitorChoices(docs_url=DOCS))
    assert rendered.refused == ["node-1: instance 'm-r0' not watched: served model name 'm\\n{{ query \"up\" }}' "
                                "holds a control or unprintable character"]
    engines = json.loads(rendered.files["targets/engines.json"])
    assert [g["labels"]["npuops_part"] for g in engines] == ["m-r1"]
    # A prediction that is not a number is no prediction: nothing to alert on, nothing broken.
    odd = dataclasses.replace(records[0], prediction={"ttft_ms": "fast", "tpot_ms": float("inf"), "x": None})
    rules = render_monitoring([odd], "node-1", MonitorChoices()).files["rules/npuops.rules.yml"]
    assert "AbovePrediction" not in rules and "npuops:predicted_" not in rules


# --- monitor.json and the state directory -------------------------------------------------------------------------

SAVED = {"output": "/tmp/npuops-monitor", "choices": {"node_exporter": "127.0.0.1:9100", "npu_exporter": None,
                                                      "docs_url": DOCS, "latency_factor": 3.0,
                                                      "scrape_interval_s": 15}}


@pytest.mark.parametrize("document", [
    "{not json", "[]", '"x"', "null", "[" * 100_000,
    json.dumps({**SAVED, "output": 5}), json.dumps({**SAVED, "output": "relative/dir"}),
    json.dumps({**SAVED, "output": "/tmp/a\u0000b"}), json.dumps({**SAVED, "choices": []}),
    *(json.dumps({**SAVED, "choices": {**SAVED["choices"], key: value}}) for key, value in (
        ("node_exporter", 5), ("node_exporter", "evil host:1/x"), ("npu_exporter", ["a"]), ("docs_url", 5),
        ("docs_url", "http://x/{{ query \"up\" }}"), ("latency_factor", "3"), ("latency_factor", True),
        ("scrape_interval_s", "15"), ("scrape_interval_s", -5), ("scrape_interval_s", 1.5))),
])
def test_a_monitor_json_that_is_not_npuops_is_one_line_and_the_refresh_is_skipped(tmp_path: Path,
                                                                                  document: str) -> None:
    (tmp_path / MONITOR_FILE).write_text(document)
    with pytest.raises(BadInputError) as caught:
        saved_render(tmp_path)
    assert "npuops monitor render --output DIR" in caught.value.fix
    line = refresh_monitoring(tmp_path, "node-1")
    assert line is not None and line.startswith("warning: monitoring not refreshed: ") and "\n" not in line


def _npuops(*args: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "NPUOPS_STATE_DIR": str(state_dir)}, timeout=120, check=False)


def test_stop_succeeds_and_says_the_refresh_was_skipped_when_monitor_json_is_wrong(tmp_path: Path) -> None:
    state = tmp_path / "state"
    write_record(make_record(state, "m", manager=MANAGER_FOREGROUND))
    (state / MONITOR_FILE).write_text(json.dumps({**SAVED, "choices": {"node_exporter": 5}}))
    done = _npuops("stop", "m", state_dir=state)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"warning: monitoring not refreshed: {state / MONITOR_FILE} is not what `npuops monitor render` writes "
        "(choices.node_exporter is a number, not a string); fix: run `npuops monitor render --output DIR` again "
        "(it rewrites monitor.json)")


def test_monitor_render_with_the_state_dir_a_file_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("not a directory\n")
    done = _npuops("monitor", "render", "--output", str(tmp_path / "out"), state_dir=state)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert f"the state directory {state} is not a directory" in done.stderr and "NPUOPS_STATE_DIR" in done.stderr
    assert not (tmp_path / "out").exists()
