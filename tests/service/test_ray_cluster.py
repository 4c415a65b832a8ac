"""Which Ray nodes of a multi-node instance are alive (npuops.instance.ray), the start gate's wait for them (the
ray-cluster check, checks/launch.py; which of the gate's checks apply by role) and the supervisor's probe of a Ray
head or a headless engine (npuops.service.supervisor.Supervisor._probe).

The node tables are real: tests/fixtures/ray/ray-nodes_*.json are `ray.nodes()` dumps from a Ray 2.60 cluster of
three hosts (10.213.0.11-13); gcs-nodes_*.json are the same cluster's node table through Ray's state API, used here
for the recorded death of a worker (turned into ray.nodes()' key style by `_from_state_api`)."""

from __future__ import annotations

import json
import stat
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from npuops.checks import launch as launch_checks
from npuops.doctor.context import CheckContext, DoctorOptions
from npuops.doctor.model import CheckOutcome, Status
from npuops.doctor.runner import run_checks
from npuops.hardware.probe import Probe
from npuops.instance.membership import ClusterMembership, ClusterNode
from npuops.instance.ray import (
    RAY_NODES_SCRIPT,
    RayNode,
    RayNodesError,
    RayState,
    cluster_state,
    parse_ray_nodes,
    probe_ray_cluster,
    ray_python,
)
from npuops.instance.record import ROLE_ENGINE, ROLE_HEADLESS, ROLE_RAY_WORKER
from npuops.service.gate import run_gate
from npuops.service.notify import Notifier
from npuops.service.supervisor import Supervisor, SupervisorOptions
from npuops.settings import Settings
from tests.support.http_server import Serve
from tests.support.instance_records import make_record
from tests.support.paths import FIXTURES

RAY_FIXTURES = FIXTURES / "ray"
THREE_ALIVE = RAY_FIXTURES / "ray-nodes_3-nodes-alive.json"
H2_DIED = RAY_FIXTURES / "gcs-nodes_h2-sigterm-then-rejoined-then-raylet-sigkilled.json"
HOSTS = (ClusterNode("h1", "10.213.0.11"), ClusterNode("h2", "10.213.0.12"), ClusterNode("h3", "10.213.0.13"))


def _from_state_api(path: Path) -> str:
    """A state-API node table (`ray list nodes`) as ray.nodes() would list the same nodes."""
    return json.dumps([{"NodeManagerAddress": n["node_manager_address"],
                        "NodeManagerHostname": n["node_manager_hostname"],
                        "Alive": n["state"] == "ALIVE", "Resources": n["resources_total"]}
                       for n in json.loads(path.read_text())])


def _compact(*entries: tuple[str, bool]) -> str:
    """What RAY_NODES_SCRIPT prints: one JSON line."""
    return json.dumps([{"address": a, "hostname": "", "alive": alive, "resources": {"CPU": 1.0}}
                       for a, alive in entries])


# --- parse_ray_nodes -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(RAY_FIXTURES.glob("ray-nodes_*.json")), ids=lambda p: p.name)
def test_every_recorded_ray_nodes_dump_parses(path: Path) -> None:
    raw = json.loads(path.read_text())
    nodes = parse_ray_nodes(path.read_text())
    assert len(nodes) == len(raw) > 0
    for node, entry in zip(nodes, raw, strict=True):
        assert node.address == entry["NodeManagerAddress"]
        assert node.alive is entry["Alive"]
        assert node.hostname == entry["NodeManagerHostname"]
        assert dict(node.resources) == {k: float(v) for k, v in entry["Resources"].items()}


def test_three_alive_nodes_recorded() -> None:
    nodes = parse_ray_nodes(THREE_ALIVE.read_text())
    assert [(n.address, n.hostname, n.alive) for n in nodes] == [
        ("10.213.0.11", "npuops-test-h1", True), ("10.213.0.12", "npuops-test-h2", True),
        ("10.213.0.13", "npuops-test-h3", True)]
    assert nodes[0].resources["node:__internal_head__"] == 1.0 and nodes[1].resources["CPU"] == 1.0


def test_the_compact_form_after_log_lines() -> None:
    text = ("2026-11-29 14:20:01,123 INFO worker.py:1832 -- Connecting to existing Ray cluster at 10.213.0.11:6379\n"
            + json.dumps([{"address": "10.213.0.11", "hostname": "h1", "alive": True, "resources": {"NPU": 8}},
                          {"address": "10.213.0.12", "hostname": "h2", "alive": False, "resources": {}}]) + "\n")
    assert parse_ray_nodes(text) == [RayNode("10.213.0.11", True, {"NPU": 8.0}, "h1"),
                                      RayNode("10.213.0.12", False, {}, "h2")]
    assert parse_ray_nodes("[]") == []


@pytest.mark.parametrize("text", [
    "", "   \n", "not json", "Traceback (most recent call last):\n  ...\nConnectionError: GCS", "{}", "null", "[1]",
    '[{"alive": true}]', '[{"address": 1, "alive": true}]', '[{"address": "10.0.0.1", "alive": "yes"}]',
    '[{"address": "10.0.0.1"}]',
], ids=repr)
def test_garbage_is_a_ray_nodes_error(text: str) -> None:
    with pytest.raises(RayNodesError):
        parse_ray_nodes(text)


def test_the_state_api_table_is_not_a_ray_nodes_listing() -> None:
    with pytest.raises(RayNodesError, match="lacks its address or alive flag"):
        parse_ray_nodes((RAY_FIXTURES / "gcs-nodes_3-nodes-alive.json").read_text())


@pytest.mark.parametrize("resources", ['5', '"CPU"', '{"CPU": "lots"}', '{"CPU": null}'])
def test_malformed_resources_are_a_ray_nodes_error(resources: str) -> None:
    with pytest.raises(RayNodesError):
        parse_ray_nodes(f'[{{"address": "10.0.0.1", "alive": true, "resources": {resources}}}]')


# --- cluster_state -------------------------------------------------------------------------------------------------


def test_all_alive_is_complete() -> None:
    state = cluster_state(HOSTS, parse_ray_nodes(THREE_ALIVE.read_text()))
    assert state.to_json() == {"complete": True, "short": [], "alive": ["h1", "h2", "h3"], "missing": [], "lost": [],
                               "unexpected": [], "nodes": 3, "expected": 3}


def test_a_node_that_offers_too_little_keeps_the_cluster_incomplete() -> None:
    """The recorded nodes offer 1 CPU and no NPU: a cluster whose engine needs {"NPU": 8} per node is not ready,
    and every such host is named; one that needs a CPU each is."""
    nodes = parse_ray_nodes(THREE_ALIVE.read_text())
    state = cluster_state(HOSTS, nodes, {"NPU": 8})
    assert state.complete is False and state.short == ("h1", "h2", "h3",) and state.missing == ()
    assert cluster_state(HOSTS, nodes, {"CPU": 1}).complete is True


def test_a_host_whose_node_died_is_missing_and_lost() -> None:
    nodes = parse_ray_nodes(_from_state_api(H2_DIED))
    # The recording: h2 stopped (SIGTERM), rejoined with a new node id, then its raylet was killed: two dead entries.
    assert [n.alive for n in nodes if n.address == "10.213.0.12"] == [False, False]
    state = cluster_state(HOSTS, nodes)
    assert state.complete is False
    assert state.alive == ("h1", "h3",) and state.missing == ("h2",) and state.lost == ("h2",)
    assert (state.nodes, state.expected) == (2, 3)


def test_a_host_that_died_and_came_back_is_alive() -> None:
    nodes = parse_ray_nodes(_compact(("10.213.0.11", True), ("10.213.0.12", False), ("10.213.0.13", True),
                                     ("10.213.0.12", True)))
    state = cluster_state(HOSTS, nodes)
    assert state.complete is True
    assert state.alive == ("h1", "h2", "h3",) and state.missing == () and state.lost == ()


def test_a_node_that_never_joined_is_missing_but_not_lost() -> None:
    expected = (*HOSTS, ClusterNode("h4", "10.213.0.14"))
    state = cluster_state(expected, parse_ray_nodes(THREE_ALIVE.read_text()))
    assert state.complete is False
    assert state.missing == ("h4",) and state.lost == ()
    assert (state.nodes, state.expected) == (3, 4)


def test_unexpected_live_nodes_are_reported() -> None:
    state = cluster_state(HOSTS[:2], parse_ray_nodes(THREE_ALIVE.read_text()))
    assert state.complete is True and state.unexpected == ("10.213.0.13",)
    # A dead stranger is nobody's business.
    dead_stranger = parse_ray_nodes(_compact(("10.213.0.11", True), ("10.213.0.12", True), ("10.9.9.9", False)))
    assert cluster_state(HOSTS[:2], dead_stranger).unexpected == ()


# --- probe_ray_cluster ---------------------------------------------------------------------------------------------


def _fake_python(directory: Path, body: str) -> list[str]:
    """A `python` beside a `ray` in directory (what probe_ray_cluster runs); returns the ray_command."""
    directory.mkdir(parents=True, exist_ok=True)
    python = directory / "python"
    python.write_text("#!/bin/sh\n" + body)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return [str(directory / "ray")]


def _cluster(ray_command: list[str], hosts: tuple[ClusterNode, ...] = HOSTS, **more: Any) -> ClusterMembership:
    return ClusterMembership("serve", "ray", 0, "head",
                             tuple(replace(h, role="head" if i == 0 else "worker") for i, h in enumerate(hosts)),
                             "h1", len(hosts), ray_unit="npuops-demo-ray.service", ray_address="10.213.0.11:6379",
                             ray_command=tuple(ray_command), **more)


def test_probe_reads_a_recorded_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.1.1.1:6379")  # the engine's; the probe must not inherit it
    seen = tmp_path / "seen"
    ray_command = _fake_python(tmp_path / "venv" / "bin", f'printf "%s\\n" "$@" > "{seen}.args"\n'
                                                          f'echo "RAY_ADDRESS=${{RAY_ADDRESS-unset}}" > "{seen}.env"\n'
                                                          f'cat "{THREE_ALIVE}"\n')
    assert ray_python(ray_command) == str(tmp_path / "venv" / "bin" / "python")
    state = probe_ray_cluster(_cluster(ray_command))
    assert state.to_json() == {"complete": True, "short": [], "alive": ["h1", "h2", "h3"], "missing": [], "lost": [],
                               "unexpected": [], "nodes": 3, "expected": 3, "address": "10.213.0.11:6379"}
    args = (tmp_path / "seen.args").read_text().split("\n")
    assert args[0] == "-c" and args[-2] == "10.213.0.11:6379"
    assert (tmp_path / "seen.env").read_text().strip() == "RAY_ADDRESS=unset"


def test_probe_runs_the_real_script_against_a_stand_in_ray(tmp_path: Path) -> None:
    """RAY_NODES_SCRIPT itself, with a `ray` module that answers ray.nodes() from the recording."""
    stand_in = tmp_path / "stand-in"
    stand_in.mkdir()
    # The state-API recording turned into ray.nodes()' keys, as in _from_state_api.
    (stand_in / "ray.py").write_text(
        "import json\n"
        "def init(address, **kwargs):\n"
        f"    open({str(tmp_path / 'init.json')!r}, 'w').write(json.dumps([address, kwargs]))\n"
        "def nodes():\n"
        f"    table = json.load(open({str(H2_DIED)!r}))\n"
        "    return [{'NodeManagerAddress': n['node_manager_address'], 'Alive': n['state'] == 'ALIVE',\n"
        "             'NodeManagerHostname': n['node_manager_hostname'], 'Resources': n['resources_total']}\n"
        "            for n in table]\n")
    ray_command = _fake_python(tmp_path / "bin", f'PYTHONPATH="{stand_in}" exec "{sys.executable}" "$@"\n')
    state = probe_ray_cluster(_cluster(ray_command))
    assert state.error is None, state
    assert state.alive == ("h1", "h3",) and state.missing == ("h2",) and state.lost == ("h2",)
    address, kwargs = json.loads((tmp_path / "init.json").read_text())
    assert address == "10.213.0.11:6379" and kwargs["log_to_driver"] is False
    assert "ray.nodes()" in RAY_NODES_SCRIPT


def test_probe_names_why_the_head_cannot_be_asked(tmp_path: Path) -> None:
    ray_command = _fake_python(tmp_path / "bin", "echo 'some noise' >&2\n"
                                                 "echo 'ConnectionError: could not reach GCS at 10.213.0.11:6379' >&2\n"
                                                 "exit 1\n")
    state = probe_ray_cluster(_cluster(ray_command))
    assert state.complete is False
    assert state.error == ("cannot reach the Ray head at 10.213.0.11:6379: "
                              "ConnectionError: could not reach GCS at 10.213.0.11:6379")
    assert state.missing == ("h1", "h2", "h3",) and state.alive == () and state.nodes == 0


def test_probe_without_the_interpreter(tmp_path: Path) -> None:
    state = probe_ray_cluster(_cluster([str(tmp_path / "nowhere" / "ray")]))
    assert state.complete is False
    assert state.error == f"{tmp_path / 'nowhere' / 'python'} does not exist (the Ray venv of the instance)"


def test_probe_with_unreadable_output(tmp_path: Path) -> None:
    state = probe_ray_cluster(_cluster(_fake_python(tmp_path / "bin", "echo 'Ray is not installed'\n")))
    assert state.complete is False and state.error == "the Ray node listing is not JSON"


def test_probe_with_malformed_resources_reports_an_error(tmp_path: Path) -> None:
    listing = '[{"address": "10.213.0.11", "alive": true, "resources": {"CPU": null}}]'
    state = probe_ray_cluster(_cluster(_fake_python(tmp_path / "bin", f"echo '{listing}'\n")))
    assert state.complete is False and state.error


def test_probe_that_hangs_times_out(tmp_path: Path) -> None:
    state = probe_ray_cluster(_cluster(_fake_python(tmp_path / "bin", "exec sleep 30\n")), timeout_s=0.3)
    assert state.complete is False and "did not answer within" in state.error


# --- the start gate ------------------------------------------------------------------------------------------------


def _ray_record(tmp_path: Path, role: str = ROLE_ENGINE, **overrides: Any) -> Any:
    return make_record(tmp_path / "state", role=role, cluster=_cluster(["/opt/ray/bin/ray"]), **overrides)


def check_ray_cluster(record: Any, *, wait_s: float, probe: Any) -> CheckOutcome:
    """The start gate's ray-cluster check on record, run as the gate runs it, waiting at most wait_s and asking the
    cluster through probe (instead of a Ray head)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch_checks, "RAY_JOIN_WAIT_S", wait_s)
        patch.setattr(launch_checks, "probe_ray_cluster", probe)
        context = CheckContext(Probe(Settings()), DoctorOptions(instance=record))
        return run_checks([launch_checks.RayCluster], context).outcomes[0]


def _fixed_probe(*states: RayState) -> tuple[list[ClusterMembership], Any]:
    calls: list[ClusterMembership] = []

    def probe(cluster: ClusterMembership) -> RayState:
        calls.append(cluster)
        return states[min(len(calls), len(states)) - 1]

    return calls, probe


def _unreachable(error: str) -> RayState:
    return RayState(complete=False, expected=3, missing=("h1", "h2", "h3"), error=error)


def test_gate_passes_a_complete_cluster(tmp_path: Path) -> None:
    record = _ray_record(tmp_path)
    calls, probe = _fixed_probe(cluster_state(HOSTS, parse_ray_nodes(THREE_ALIVE.read_text())))
    outcome = check_ray_cluster(record, wait_s=0, probe=probe)
    assert outcome.check_id == "ray-cluster" and outcome.result.status is Status.PASS
    assert outcome.result.evidence["alive"] == ["h1", "h2", "h3"]
    assert calls == [record.cluster]


def test_gate_fails_naming_the_missing_hosts_and_the_ray_unit(tmp_path: Path) -> None:
    record = _ray_record(tmp_path)
    calls, probe = _fixed_probe(cluster_state(HOSTS, parse_ray_nodes(_from_state_api(H2_DIED))))
    outcome = check_ray_cluster(record, wait_s=0, probe=probe)
    assert outcome.result.status is Status.FAIL
    assert (outcome.result.evidence["missing"], outcome.result.evidence["error"]) == (["h2"], None)
    # The fix: the Ray unit's commands on the missing host, then the group's network check.
    remediation = outcome.result.remediation or ""
    assert "on each of h2: `systemctl status npuops-demo-ray.service`" in remediation
    assert "`npuops doctor -i INVENTORY --group serve`" in remediation
    assert len(calls) == 1


def test_gate_says_when_the_cluster_cannot_be_asked(tmp_path: Path) -> None:
    record = _ray_record(tmp_path)
    _, probe = _fixed_probe(_unreachable("python3 does not exist"))
    outcome = check_ray_cluster(record, wait_s=0, probe=probe)
    assert outcome.result.status is Status.FAIL
    assert outcome.result.evidence["error"] == "python3 does not exist"


def test_gate_waits_for_a_late_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_checks, "_RAY_POLL_S", 0.0)
    record = _ray_record(tmp_path)
    partial = cluster_state(HOSTS, parse_ray_nodes(_compact(("10.213.0.11", True), ("10.213.0.13", True))))
    whole = cluster_state(HOSTS, parse_ray_nodes(THREE_ALIVE.read_text()))
    calls, probe = _fixed_probe(partial, partial, whole)
    outcome = check_ray_cluster(record, wait_s=3600, probe=probe)
    assert outcome.result.status is Status.PASS and len(calls) == 3


@pytest.mark.parametrize(("role", "strategy", "port_free", "ray_cluster"), [
    (ROLE_ENGINE, None, True, False),  # a single-node instance
    (ROLE_ENGINE, "ray", True, True),  # the Ray head's engine
    (ROLE_RAY_WORKER, "ray", False, False),
    (ROLE_ENGINE, "dp", True, False),  # the data-parallel leader
    (ROLE_HEADLESS, "dp", False, False),  # a follower: no API, no port of its own
])
def test_run_gate_picks_the_checks_by_role(role: str, strategy: str | None, port_free: bool, ray_cluster: bool,
                                           tmp_path: Path, fake_root: Path, closed_port: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    asked, probe = _fixed_probe(RayState(complete=True, expected=2, alive=("h1", "h2")))
    monkeypatch.setattr(launch_checks, "probe_ray_cluster", probe)
    monkeypatch.setattr(launch_checks, "RAY_JOIN_WAIT_S", 0.0)
    cluster = (ClusterMembership.from_json({"strategy": strategy, "ray_unit": "npuops-demo-ray.service"})
               if strategy == "ray" else ClusterMembership.from_json({"strategy": strategy}) if strategy else None)
    record = make_record(tmp_path / "state", role=role, cluster=cluster, port=closed_port)
    outcomes = run_gate(record, Settings(root=fake_root)).outcomes
    ids = [o.check_id for o in outcomes]
    ran = {o.check_id for o in outcomes if o.result.status is not Status.SKIP}
    assert ids[:2] == ["engine-executable", "model-directory"]
    # Every gate check is in the report; the ones that do not apply to this part skip.
    assert {"port-free", "ray-cluster"} <= set(ids)
    assert ("port-free" in ran) is port_free
    assert ("ray-cluster" in ran) is ray_cluster
    assert asked == ([record.cluster] if ray_cluster else [])


# --- the supervisor's probe ----------------------------------------------------------------------------------------


def _supervisor(record: Any, **options: Any) -> Supervisor:
    options.setdefault("health_timeout_s", 5.0)
    return Supervisor(record, {}, SupervisorOptions(**options), notifier=Notifier(None))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_supervisor_ray_head_is_healthy_while_the_cluster_is_whole(tmp_path: Path, serve: Serve) -> None:
    url, seen = serve({"/health": (200, b"")})
    record = _ray_record(tmp_path, port=_port(url))
    calls, probe = _fixed_probe(cluster_state(HOSTS, parse_ray_nodes(THREE_ALIVE.read_text())))
    supervisor = _supervisor(record, cluster_probe=probe, cluster_interval_s=3600)
    # Before the first healthy answer the cluster is not asked (the start gate did that).
    assert supervisor._probe(False) == (True, "")
    assert calls == []
    assert supervisor._probe(True) == (True, "")
    assert supervisor._probe(True) == (True, "")
    assert len(calls) == 1  # at most once per cluster_interval_s while all is well
    assert [s.path for s in seen] == ["/health"] * 3
    assert supervisor._state.cluster == cluster_state(HOSTS, parse_ray_nodes(THREE_ALIVE.read_text()))


def test_supervisor_ray_head_is_unhealthy_naming_the_lost_host(tmp_path: Path, serve: Serve) -> None:
    url, _ = serve({"/health": (200, b"")})
    record = _ray_record(tmp_path, port=_port(url))
    lost = cluster_state(HOSTS, parse_ray_nodes(_from_state_api(H2_DIED)))
    whole = cluster_state(HOSTS, parse_ray_nodes(THREE_ALIVE.read_text()))
    calls, probe = _fixed_probe(lost, lost, whole)
    supervisor = _supervisor(record, cluster_probe=probe, cluster_interval_s=3600)
    assert supervisor._probe(True) == (False, "Ray node(s) lost on h2")
    assert supervisor._state.cluster is not None and supervisor._state.cluster.lost == ("h2",)
    # While a problem stands the cluster is asked on every probe, so recovery is seen at once.
    assert supervisor._probe(True) == (False, "Ray node(s) lost on h2")
    assert supervisor._probe(True) == (True, "")
    assert len(calls) == 3


def test_supervisor_ray_head_when_the_cluster_cannot_be_asked(tmp_path: Path, serve: Serve) -> None:
    url, _ = serve({"/health": (200, b"")})
    record = _ray_record(tmp_path, port=_port(url))
    _, probe = _fixed_probe(_unreachable("the head is gone"))
    healthy, problem = _supervisor(record, cluster_probe=probe)._probe(True)
    assert not healthy and problem == "the Ray cluster cannot be asked (the head is gone)"


def test_supervisor_ray_head_without_health_does_not_ask_the_cluster(tmp_path: Path, closed_port: int) -> None:
    record = _ray_record(tmp_path, port=closed_port)
    calls, probe = _fixed_probe(RayState(complete=True, expected=3))
    assert _supervisor(record, cluster_probe=probe, health_timeout_s=1.0)._probe(True) == (
        False, "/health stopped answering")
    assert calls == []


def test_supervisor_dp_leader_never_asks_ray(tmp_path: Path, serve: Serve) -> None:
    url, _ = serve({"/health": (200, b"")})
    record = make_record(tmp_path / "state", port=_port(url), cluster=ClusterMembership.from_json({"strategy": "dp"}))
    calls, probe = _fixed_probe(RayState(complete=False, expected=2, missing=("h2",)))
    assert _supervisor(record, cluster_probe=probe)._probe(True) == (True, "")
    assert calls == []


def test_supervisor_headless_engine_is_up_once_settled_without_http(tmp_path: Path, serve: Serve) -> None:
    url, seen = serve({"/health": (200, b"")})
    record = make_record(tmp_path / "state", role=ROLE_HEADLESS, port=_port(url),
                         cluster=ClusterMembership.from_json({"strategy": "dp"}))
    calls, probe = _fixed_probe(RayState(complete=False, expected=2))
    settling = _supervisor(record, cluster_probe=probe, headless_settle_s=3600)
    assert settling._probe(False) == (False, "the headless engine is starting")
    settled = _supervisor(record, cluster_probe=probe, headless_settle_s=0)
    assert settled._probe(False)[0] is True and settled._probe(True)[0] is True
    assert seen == [] and calls == []



def test_ray_auth_env_comes_from_the_environment_or_the_env_file(tmp_path: Path) -> None:
    from npuops.instance.ray import ray_auth_env

    env_file = tmp_path / "ray.env"
    env_file.write_text('# the instance\'s Ray node environment\nRAY_AUTH_MODE="token"\nRAY_AUTH_TOKEN="t0k"\n')
    cluster = _cluster([], ray_auth="token", ray_env_file=str(env_file))
    assert ray_auth_env(_cluster([], ray_auth="none"), {}) == {}
    assert ray_auth_env(cluster, {}) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "t0k"}
    # The supervisor has it in its own environment (its env file): that wins, the file is not read.
    from_env = ray_auth_env(replace(cluster, ray_env_file="/nonexistent"), {"RAY_AUTH_TOKEN": "e"})
    assert isinstance(from_env, dict) and from_env["RAY_AUTH_TOKEN"] == "e"
    unreadable = ray_auth_env(replace(cluster, ray_env_file=str(tmp_path / "missing.env")), {})
    assert isinstance(unreadable, str) and "cannot read the cluster's Ray token" in unreadable
    env_file.write_text('RAY_AUTH_MODE="token"\n')
    assert "holds no RAY_AUTH_TOKEN" in str(ray_auth_env(cluster, {}))


def test_the_probe_passes_the_token_in_its_environment_only(tmp_path: Path) -> None:
    env_file = tmp_path / "ray.env"
    env_file.write_text('RAY_AUTH_MODE="token"\nRAY_AUTH_TOKEN="t0k"\n')
    seen = tmp_path / "seen"
    ray_command = _fake_python(tmp_path / "venv" / "bin", f'printf "%s\\n" "$@" > "{seen}.args"\n'
                                                          f'echo "$RAY_AUTH_MODE $RAY_AUTH_TOKEN" > "{seen}.env"\n'
                                                          f'cat "{THREE_ALIVE}"\n')
    state = probe_ray_cluster(_cluster(ray_command, ray_auth="token", ray_env_file=str(env_file)))
    assert state.complete is True
    assert (tmp_path / "seen.env").read_text().strip() == "token t0k"
    assert "t0k" not in (tmp_path / "seen.args").read_text()
    failed = probe_ray_cluster(_cluster(ray_command, ray_auth="token", ray_env_file=str(tmp_path / "x")))
    assert failed.complete is False and "cannot read the cluster's Ray token" in str(failed.error)
