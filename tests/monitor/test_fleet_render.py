"""`npuops monitor render -i INVENTORY --group GROUP` (npuops/monitor/fleet_render.py): every host's parts for a
Prometheus on the rendering machine. Pure, from hosts' answers: how each part is reached, what cannot be from
here, who did not answer. Real: ansible-runner asks this machine (a local connection) with
playbooks/npuops-command.yml, and the render holds its records."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from npuops.fleet.group_ops import HostAnswer
from npuops.fleet.inventory import InventoryHost
from npuops.instance.record import InstanceRecord
from npuops.launch.install import write_instance
from npuops.launch.instance_files import LaunchSpec, render_instances
from npuops.monitor.fleet_render import hosts_from_answers
from npuops.monitor.render import MonitorChoices, render_hosts
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target
from tests.support.instance_records import keep_status_under
from tests.support.model_dirs import write_tiny_model
from tests.support.npuops_cli import npuops_argv


def _instances(tmp_path: Path, name: str = "m") -> list:  # type: ignore[type-arg]
    model = write_tiny_model(tmp_path / "tiny-llama")
    plan = make_plan(load_model(str(model)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", replicas=2))
    return render_instances(plan, LaunchSpec(name=name, port=9100, state_dir=tmp_path / "state"))


def _answer(host: str, records: list[InstanceRecord], hostname: str) -> HostAnswer:
    return HostAnswer(host, "ok", {"ok": True, "hostname": hostname, "records": [r.to_json() for r in records]}, 0)


def _jobs(files: dict[str, str], job: str) -> list[tuple[str, str, str]]:
    return [(g["targets"][0], g["labels"].get("npuops_part", ""), g["labels"]["host"])
            for g in json.loads(files[f"targets/{job}.json"])]


def test_each_host_is_scraped_where_prometheus_reaches_it(tmp_path: Path) -> None:
    records = [i.record for i in _instances(tmp_path)]
    # The second host's replicas bind every interface (a group's replicas serve the router on the first host).
    wide = [dataclasses.replace(r, host="0.0.0.0") for r in records if r.behind]
    hosts = [InventoryHost("node-a", "10.0.0.1", 22), InventoryHost("node-b", "10.0.0.2", 22),
             InventoryHost("node-c", "10.0.0.3", 22)]
    answers = {"node-a": _answer("node-a", records, hostname="not-this-machine"),
               "node-b": _answer("node-b", wide, hostname="also-not"),
               "node-c": HostAnswer("node-c", "unreachable", None, None, "ssh: connect refused", "check ssh")}
    found, failed = hosts_from_answers(hosts, answers)
    assert failed == ["node-c: ssh: connect refused (check ssh)"]
    rendered = render_hosts(found, MonitorChoices())
    # node-a's parts listen on its loopback: nothing reaches them from here, and the render says so.
    assert rendered.unreachable == ["node-a: m-r0 listens on 127.0.0.1 only", "node-a: m-r1 listens on 127.0.0.1 only",
                                    "node-a: router m's metrics listen on 127.0.0.1 only"]
    assert _jobs(rendered.files, "engines") == [("10.0.0.2:9101", "m-r0", "node-b"),
                                                ("10.0.0.2:9102", "m-r1", "node-b")]
    assert _jobs(rendered.files, "node") == [("10.0.0.1:9100", "", "node-a"), ("10.0.0.2:9100", "", "node-b")]
    bad = {**answers, "node-c": HostAnswer("node-c", "ok", {"ok": True, "hostname": "x", "records": [{"no": 1}]}, 0)}
    _, failed = hosts_from_answers(hosts, bad)
    assert len(failed) == 1 and failed[0].startswith("node-c: its npuops answered no records npuops reads")


def test_a_group_render_asks_every_host_through_ansible(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for instance in _instances(tmp_path):
        write_instance(instance, state)
        keep_status_under(state / instance.name, tmp_path / "var")
    inventory = tmp_path / "inventory.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
             "ansible_host": "127.0.0.1", "npuops_command": str(Path(sys.executable).parent / "npuops")}
    inventory.write_text(json.dumps({"all": {"children": {"serving": {"hosts": {"localhost": local}}}}}))
    out = tmp_path / "monitor"
    done = subprocess.run(npuops_argv("monitor", "render", "--output", str(out), "-i", str(inventory), "--group",
                                      "serving", "--artifacts", str(tmp_path / "art"), "--json"),
                          capture_output=True, text=True, env={**os.environ, "NPUOPS_STATE_DIR": str(state)},
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["hosts"] == ["localhost"] and answer["unreachable"] == [] and answer["failed"] == []
    engines = json.loads((out / "targets" / "engines.json").read_text())
    # This machine (its inventory address is loopback): its parts on loopback, labelled with the inventory name.
    assert [(g["targets"], g["labels"]["host"]) for g in engines] == [(["127.0.0.1:9101"], "localhost"),
                                                                      (["127.0.0.1:9102"], "localhost")]
    assert not (state / "monitor.json").exists()  # a group render is not followed by this node's launches
    human = subprocess.run(npuops_argv("monitor", "render", "--output", str(out), "-i", str(inventory)),
                           capture_output=True, text=True, timeout=60, check=False)
    assert human.returncode == 2 and "-i/--inventory and --group go together" in human.stderr
