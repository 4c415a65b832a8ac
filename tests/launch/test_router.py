"""One endpoint per model, offline: the plan's router (--dp, --router-policy), the files of a router in front of its
replicas, the router process's command line and secrets, and the router's figures in status."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from npuops.envfile import parse_env_file
from npuops.errors import BadInputError
from npuops.instance.metrics import parse_prometheus, router_figures
from npuops.instance.record import ROLE_ROUTER, InstanceRecord
from npuops.instance.status import InstanceStatus, render_status_text, top_level
from npuops.launch.instance_files import LaunchSpec, render_instances
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, PlanRequest, Workload
from npuops.plan.planner import make_plan
from npuops.plan.router import DEFAULT_POLICY, RouterOptions
from npuops.plan.target import cpu_target, parse_hardware_spec
from npuops.service.diagnosis import diagnose
from npuops.service.gate import gate_tags
from npuops.service.router_process import EXIT_CONFIG, read_router_argv
from tests.support.http_server import free_port
from tests.support.model_dirs import write_tiny_model
from tests.support.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "router"


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny-llama")


def _cpu_plan(model: Path, **options: object):  # type: ignore[no-untyped-def]
    return make_plan(load_model(str(model)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", **options))  # type: ignore[arg-type]


def test_dp_forces_replicas_on_the_cpu_target_each_on_its_own_cores(tiny: Path) -> None:
    plan = _cpu_plan(tiny, replicas=2)
    assert plan.replica_count == 2 and [r.cpus for r in plan.replicas] == ["0-1", "2-3"]
    assert plan.router is not None and plan.router.policy == DEFAULT_POLICY
    why = plan.explanation("router_policy").why
    assert "one endpoint for the 2 replicas" in why and "the default" in why
    assert _cpu_plan(tiny).router is None  # one engine: no router


def test_router_policy_as_asked_is_explained_as_asked(tiny: Path) -> None:
    plan = _cpu_plan(tiny, replicas=2, router_policy="round_robin")
    assert plan.router is not None and plan.router.policy == "round_robin"
    assert "as asked" in plan.explanation("router_policy").why


def test_dp_that_does_not_fit_the_chips_or_spans_nodes_is_refused() -> None:
    model = load_model(str(REPO / "tests" / "fixtures" / "models" / "qwen3-8b"))
    with pytest.raises(BadInputError, match="--dp 9") as exc:
        make_plan(model, parse_hardware_spec("910B3x8"), Workload(512, 128), PlanOptions(replicas=9))
    assert "--dp 8 or fewer" in exc.value.fix
    with pytest.raises(BadInputError, match="one node"):
        make_plan(model, parse_hardware_spec("910B3x8", nodes=2), Workload(512, 128), PlanOptions(replicas=2))
    plan = make_plan(model, parse_hardware_spec("910B3x8"), Workload(512, 128, objective="latency"),
                     PlanOptions(replicas=2))
    assert plan.replica_count == 2 and plan.router is not None


def test_unknown_policy_is_refused_by_the_request() -> None:
    with pytest.raises(BadInputError, match="router-policy"):
        PlanRequest(model="x", router_policy="fastest")
    with pytest.raises(ValueError):
        RouterOptions(policy="fastest")


def _rendered(tiny: Path, **spec: object) -> list:  # type: ignore[type-arg]
    values: dict[str, object] = {"name": "m", "port": 9100, "api_key": "sk-router-secret",
                                 "vllm_command": ("/opt/npuops/venv/bin/vllm", "serve")}
    values.update(spec)
    return render_instances(_cpu_plan(tiny, replicas=2), LaunchSpec(**values))  # type: ignore[arg-type]


def test_router_files_front_the_replicas_on_loopback(tiny: Path) -> None:
    r0, r1, router = _rendered(tiny, host="0.0.0.0")
    assert (r0.name, r1.name, router.name) == ("m-r0", "m-r1", "m")
    for n, replica in enumerate((r0, r1)):
        assert replica.record.host == "127.0.0.1" and replica.record.port == 9101 + n
        assert replica.record.behind == "m"
        assert parse_env_file(replica.file("env").text)["VLLM_CPU_OMP_THREADS_BIND"] == ["0-1", "2-3"][n]
    record = router.record
    assert record.role == ROLE_ROUTER and record.host == "0.0.0.0" and record.port == 9100
    assert record.unit == "npuops-m-router.service" and record.replicas == ("m-r0", "m-r1")
    assert record.backends == ("http://127.0.0.1:9101", "http://127.0.0.1:9102") and record.metrics_port == 9103
    assert record.engine_argv == ["/opt/npuops/venv/bin/python", "-m", "npuops.service.router_process",
                                  "/etc/npuops/m/router.json"]
    argv = json.loads(router.file("router.json").text)["argv"]
    assert argv[:3] == ["--worker-urls", "http://127.0.0.1:9101", "http://127.0.0.1:9102"]
    assert argv[argv.index("--policy") + 1] == DEFAULT_POLICY
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    unit = router.file("npuops-m-router.service").text
    assert "Wants=npuops-m-r0.service\nAfter=npuops-m-r0.service" in unit and "Requires=npuops-m" not in unit
    assert "DeviceAllow=/dev/davinci" not in unit and "SupplementaryGroups" not in unit
    # The key only in the router's 0600 env file, never in what is world-readable or on its command line.
    assert parse_env_file(router.file("env").text) == {"VLLM_API_KEY": "sk-router-secret"}
    for f in router.files:
        if f.name != "env":
            assert "sk-router-secret" not in f.text, f.name
    assert gate_tags(record) == ("gate",)
    # The router is judged alive by /liveness (its /health answers 503 while a replica is out), replicas by /health.
    assert record.health_path == "/liveness" and r0.record.health_path == "/health"


def test_router_record_round_trips(tiny: Path) -> None:
    record = _rendered(tiny)[-1].record
    again = InstanceRecord.from_json(json.loads(json.dumps(record.to_json())), "test")
    assert again == record
    with pytest.raises(Exception, match="replicas must be a list"):
        InstanceRecord.from_json({**record.to_json(), "replicas": "m-r0"}, "test")


def test_port_range_counts_the_replicas_and_the_metrics_port(tiny: Path) -> None:
    # The real problem named: the replicas' ports and the router's metrics port run past 65535 (not "out of range").
    with pytest.raises(BadInputError, match=r"--port 65533: the ports of 2 replicas and the router's metrics run "
                                            r"to 65536, past 65535") as refused:
        _rendered(tiny, port=65533)
    assert "--port 65532 or lower" in refused.value.fix
    assert _rendered(tiny, port=65532)[-1].record.metrics_port == 65535


def test_router_process_reads_its_argv_and_refuses_garbage(tmp_path: Path) -> None:
    good = tmp_path / "router.json"
    good.write_text(json.dumps({"argv": ["--worker-urls", "http://127.0.0.1:1"]}))
    assert read_router_argv(str(good)) == ["--worker-urls", "http://127.0.0.1:1"]
    for text, problem in (("{", "not valid JSON"), ('{"argv": "x"}', "no router command line"),
                          ("[]", "no router command line")):
        good.write_text(text)
        with pytest.raises(ValueError, match=problem):
            read_router_argv(str(good))
    # Run as the unit runs it: a one-line error and EX_CONFIG, no traceback.
    done = subprocess.run([sys.executable, "-m", "npuops.service.router_process", str(tmp_path / "missing.json")],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == EXIT_CONFIG and "cannot read" in done.stderr and "Traceback" not in done.stderr
    good.write_text(json.dumps({"argv": ["--worker-urls", "http://127.0.0.1:1"]}))
    try:
        import vllm_router  # noqa: F401
    except ImportError:
        # npuops' own venv has no vllm-router: the unit's diagnosis names the fix.
        done = subprocess.run([sys.executable, "-m", "npuops.service.router_process", str(good)],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == EXIT_CONFIG and "vllm-router is not installed" in done.stderr
        assert diagnose(done.stderr.splitlines(), {"name": "m"}).id == "router-not-installed"  # type: ignore[union-attr]


def test_router_figures_from_a_recorded_exposition() -> None:
    text = (FIXTURES / "metrics.txt").read_text()
    figures = router_figures(parse_prometheus(text))
    workers = figures["workers"]
    assert set(workers) == {"http://127.0.0.1:8101", "http://127.0.0.1:8100"}
    # Recorded after both replicas were stopped: the health checks fail; 8101's breaker opened when it was killed.
    assert all(w["healthy"] is False for w in workers.values())
    assert workers["http://127.0.0.1:8101"]["circuit_open"] is True
    assert workers["http://127.0.0.1:8100"]["circuit_open"] is False
    assert [workers[u]["requests"] for u in sorted(workers)] == [49, 28] and figures["requests_total"] == 65
    assert figures["active_workers"] == 2
    assert router_figures(parse_prometheus("garbage {{{")) == {"requests_total": None, "errors_total": None,
                                                               "active_workers": None, "workers": {}}


def test_status_shows_a_router_with_its_parts_and_round_trips() -> None:
    part = InstanceStatus(name="m-r1", state="restarting (after engine-exited)", healthy=False,
                          url="http://127.0.0.1:9102")
    status = InstanceStatus(name="m", state="degraded (m-r1 not healthy)", healthy=False, url="http://h:9100",
                            role=ROLE_ROUTER, metrics_port=9103, parts=(part,),
                            metrics={"requests_total": 40.0, "errors_total": 1.0, "active_workers": 1.0,
                                     "workers": {"http://127.0.0.1:9102": {"healthy": False, "requests": 19.0,
                                                                         "circuit_open": True}}})
    text = render_status_text(status)
    assert "metrics on 127.0.0.1:9103" in text
    assert re.search(r"m-r1\s+restarting \(after engine-exited\) on http://127.0.0.1:9102: out \(health checks "
                     r"fail\), 19 request\(s\) routed", text), text
    again = InstanceStatus.from_json(json.loads(json.dumps(status.to_json())))
    assert again.parts[0].name == "m-r1" and again.metrics_port == 9103 and again.role == ROLE_ROUTER


def test_status_lists_replicas_under_their_router(tiny: Path) -> None:
    records = [i.record for i in _rendered(tiny)]
    assert [r.name for r in top_level(records)] == ["m"]
    alone = [records[0]]  # a replica whose router record is gone is shown on its own
    assert top_level(alone) == alone


def test_the_test_engine_runs_the_router_version_provisioning_installs() -> None:
    from npuops.provision.run import router_requirement

    script = (REPO / "scripts" / "engine-venv.sh").read_text()
    assert f'ROUTER_SPEC="{router_requirement()}"' in script


def test_the_cli_plans_dp_and_refuses_it_in_the_foreground(tiny: Path) -> None:
    from tests.support.npuops_cli import npuops

    planned = npuops("plan", str(tiny), "--hardware", "cpu", "--dp", "2", "--router-policy", "cache_aware", "--json")
    assert planned.returncode == 0, planned.stderr
    data = json.loads(planned.stdout)
    assert data["config"]["replica_mode"] == "2 replicas behind one router"
    assert data["router"]["policy"] == "cache_aware"
    bad = npuops("plan", str(tiny), "--hardware", "cpu", "--dp", "0")
    assert bad.returncode != 0 and "--dp" in bad.stderr and "Traceback" not in bad.stderr
    foreground = npuops("launch", str(tiny), "--hardware", "cpu", "--dp", "2", "--foreground",
                        "--kv-cache-memory-bytes", "268435456")
    assert foreground.returncode != 0 and "drop --dp" in foreground.stderr, foreground.stderr
    assert "Traceback" not in foreground.stderr


class _RecordingManager:
    """Answers like systemd for units it was told are running, and records what launch asks of it. Only the
    bookkeeping of a re-launch is tested here; tests/systemd/test_router.py runs the units under real systemd."""

    def __init__(self, running: set[str]) -> None:
        self.running = running
        self.calls: list[tuple[str, str]] = []

    def unavailable_reason(self) -> None:
        return None

    def state(self, unit: str) -> Any:
        from npuops.instance.manager import UnitState

        active = "active" if unit in self.running else "inactive"
        return UnitState(active, "running" if active == "active" else "dead", None, "", 0, "success", "enabled",
                         "loaded")

    def _record(self, verb: str, unit: str, **_: object) -> None:
        self.calls.append((verb, unit))
        self.running.discard(unit)

    def stop(self, unit: str, timeout: float | None = None) -> None:
        self._record("stop", unit)

    def disable(self, unit: str) -> None:
        self._record("disable", unit)

    def remove_unit(self, unit: str) -> None:
        self._record("remove", unit)


def test_relaunching_without_replicas_removes_the_router_and_replica_units(tiny: Path, tmp_path: Path) -> None:
    from npuops.launch.install import write_instance
    from npuops.launch.local import Reporter, _stop_previous
    from npuops.settings import Settings

    state_dir = tmp_path / "etc"
    old = _rendered(tiny, state_dir=state_dir)
    for instance in old:
        write_instance(instance, state_dir, unit_dir_file=instance.unit_name)
    units = {i.unit_name for i in old}
    manager = _RecordingManager(set(units))
    (single,) = render_instances(_cpu_plan(tiny), LaunchSpec(name="m", port=9100, state_dir=state_dir))
    _stop_previous([single.record], Settings(state_dir=state_dir), manager, Reporter(as_json=True))  # type: ignore[arg-type]
    assert {u for verb, u in manager.calls if verb == "stop"} == units
    # The new launch installs npuops-m.service: the router's and the replicas' units would come back at boot.
    assert {u for verb, u in manager.calls if verb == "remove"} == units
    assert not (state_dir / "m-r0").exists() and not (state_dir / "m-r1").exists()
    assert (state_dir / "m").is_dir()


def test_a_group_of_replicas_has_its_router_on_the_first_host(tiny: Path) -> None:
    from npuops.launch.multinode import ClusterHost, render_replica_group

    hosts = [ClusterHost("a", "10.0.0.1", "eth0"), ClusterHost("b", "10.0.0.2", "eth0")]
    plan = _cpu_plan(tiny)
    parts = render_replica_group(plan, RouterOptions(policy="round_robin"), LaunchSpec(name="g", port=9200),
                                 hosts, unit_dir=Path("/etc/systemd/system"))
    first, second = parts
    assert (first.role, second.role) == ("router", "replicas")
    assert first.units == ("npuops-g-r0.service", "npuops-g-router.service")
    assert second.units == ("npuops-g-r0.service",)
    assert first.record.backends == ("http://10.0.0.1:9201", "http://10.0.0.2:9201")
    assert first.record.host == "127.0.0.1" and first.record.port == 9200
    assert second.record.role == "replicas" and second.record.replicas == ("g-r0",) and second.record.units == []
    configs = {str(f.path): f.text for f in second.files}
    assert 'host: "10.0.0.2"' in configs["/etc/npuops/g-r0/vllm.yaml"]
    assert "/etc/npuops/g/instance.json" in configs and not any(p.endswith("router.json") for p in configs)
    with pytest.raises(BadInputError, match="repeat"):
        render_replica_group(plan, RouterOptions(policy="round_robin"), LaunchSpec(name="g"), [hosts[0], hosts[0]],
                             unit_dir=Path("/etc/systemd/system"))
    with pytest.raises(BadInputError, match="host by host"):
        make_plan(load_model(str(tiny)), parse_hardware_spec("910B3x8", nodes=2), Workload(128, 32),
                  PlanOptions(multinode="replicas"))


def test_a_replica_set_host_answers_status_stop_and_logs_for_its_replicas(tiny: Path, tmp_path: Path) -> None:
    from npuops.instance.control import select_part, stop_instance
    from npuops.instance.record import load_record
    from npuops.instance.status import instance_status
    from npuops.launch.multinode import ClusterHost, render_replica_group

    state = tmp_path / "etc"
    hosts = [ClusterHost("a", "127.0.0.1", "lo"), ClusterHost("b", "127.0.0.2", "lo")]
    parts = render_replica_group(_cpu_plan(tiny), RouterOptions(policy="round_robin"),
                                 LaunchSpec(name="g", port=free_port(), state_dir=state),
                                 hosts, unit_dir=tmp_path / "units")
    for placed in parts[1].files:
        placed.path.parent.mkdir(parents=True, exist_ok=True)
        placed.path.write_text(placed.text)
    record = load_record(state, "g")
    now = instance_status(record, None, metrics_interval_s=0)
    assert now.role == "replicas" and [p.name for p in now.parts] == ["g-r0"]
    assert now.state == "stopped" and not now.healthy  # nothing runs: the replica is down, so is this host's part
    assert "this host's, behind the router" in render_status_text(now)
    assert [r.name for r in select_part(record, None)] == ["g-r0"] and select_part(record, "r0")[0].name == "g-r0"
    with pytest.raises(BadInputError, match="use --part with one of r0"):
        select_part(record, "router")
    assert stop_instance(record, _RecordingManager(set())) is True  # type: ignore[arg-type]



class _UnitDirManager(_RecordingManager):
    def __init__(self, running: set[str], unit_dir: Path) -> None:
        super().__init__(running)
        self.unit_dir = unit_dir

    def unit_path(self, unit: str) -> Path:
        return self.unit_dir / unit

    def remove_unit(self, unit: str) -> None:
        super().remove_unit(unit)
        self.unit_path(unit).unlink()


def test_a_damaged_replica_record_is_shown_and_its_unit_still_stopped(tiny: Path, tmp_path: Path) -> None:
    """One replica's record corrupt (a port out of range): `stop m` still stops that replica's unit, found in the
    unit directory; `list`/`status` show the record as a row with its problem and fix; an instance that only
    shares the name's prefix is left alone."""
    from npuops.instance.control import stop_by_name
    from npuops.instance.record import UNREADABLE, scan_records
    from npuops.instance.status import wait_for_statuses
    from npuops.launch.install import write_instance

    state, units = tmp_path / "etc", tmp_path / "units"
    units.mkdir()
    alike = render_instances(_cpu_plan(tiny), LaunchSpec(name="m-r5", port=9200, state_dir=state))
    instances = [*_rendered(tiny, state_dir=state), *alike]
    for placed in instances:
        write_instance(placed, state, unit_dir_file=placed.unit_name)
        (units / placed.record.unit).write_text(placed.file(placed.record.unit).text)
    broken = state / "m-r1" / "instance.json"
    broken.write_text(broken.read_text().replace('"port": 9102', '"port": 99999999'))
    running = {"npuops-m-router.service", "npuops-m-r0.service", "npuops-m-r1.service", "npuops-m-r5.service"}
    manager = _UnitDirManager(set(running), units)

    records, unreadable = scan_records(state)
    assert [r.name for r in records] == ["m", "m-r0", "m-r5"]
    assert [(u.name, "port 99999999 is outside 1..65535" in u.problem) for u in unreadable] == [("m-r1", True)]
    rows = {s.name: s for s in wait_for_statuses(state, None, manager)}  # type: ignore[arg-type]
    assert rows["m-r1"].state == UNREADABLE and rows["m-r1"].diagnosis is not None
    shown = render_status_text(rows["m-r1"])
    assert "port 99999999 is outside 1..65535" in shown and "fix       re-create it with `npuops launch`" in shown

    outcome = stop_by_name(state, "m", manager)  # type: ignore[arg-type]
    assert outcome.stopped and outcome.orphans == ("npuops-m-r1.service",)
    assert [unit for verb, unit in manager.calls if verb == "stop"] == [
        "npuops-m-router.service", "npuops-m-r0.service", "npuops-m-r1.service"]
    assert manager.running == {"npuops-m-r5.service"}  # another instance, only named alike
    with pytest.raises(BadInputError, match="no instance named 'gone'"):
        stop_by_name(state, "gone", manager)  # type: ignore[arg-type]

    # `remove m` uninstalls every unit of it, the damaged replica's too, and the files launch wrote; the instance
    # named alike keeps its unit and files; bench results stay.
    from npuops.errors import ServiceManagerError
    from npuops.instance.control import remove_by_name

    (state / "m" / "bench").mkdir()
    (state / "m" / "bench" / "1.json").write_text("{}")
    stubborn = _UnitDirManager({"npuops-m-r0.service", "npuops-m-r1.service"}, units)
    with pytest.raises(BadInputError) as running:
        remove_by_name(state, "m", stubborn)  # type: ignore[arg-type]
    # The damaged replica's unit is found in the unit directory.
    assert running.value.problem == "m is running (npuops-m-r0.service, npuops-m-r1.service)"
    assert running.value.fix == "stop it first (`npuops stop m`), or `npuops remove m --force`"
    assert stubborn.calls == []
    stubborn.stop = lambda unit, timeout=None: stubborn.calls.append(("stop", unit))  # type: ignore[method-assign]
    with pytest.raises(ServiceManagerError, match="m did not stop, so it stays installed"):
        remove_by_name(state, "m", stubborn, force=True)  # type: ignore[arg-type]
    assert (units / "npuops-m-r0.service").exists() and (state / "m-r0" / "instance.json").exists()
    removed = remove_by_name(state, "m", manager)  # type: ignore[arg-type]
    assert removed.units == ("npuops-m-router.service", "npuops-m-r0.service", "npuops-m-r1.service")
    assert [unit for verb, unit in manager.calls if verb in ("disable", "remove")] == [
        u for u in removed.units for _ in ("disable", "remove")]
    assert sorted(p.name for p in units.iterdir()) == ["npuops-m-r5.service"]
    assert removed.instances == ("m", "m-r0", "m-r1") and removed.kept == (str(state / "m"),)
    assert sorted(p.name for p in state.iterdir()) == ["m", "m-r5"]
    assert sorted(p.name for p in (state / "m").iterdir()) == ["bench"]
    assert [r.name for r in scan_records(state)[0]] == ["m-r5"] and scan_records(state)[1] == []
    with pytest.raises(BadInputError, match="no instance named 'm'"):
        remove_by_name(state, "m", manager)  # type: ignore[arg-type]


def _tree(*roots: Path) -> dict[str, bytes | None]:
    return {str(p): (p.read_bytes() if p.is_file() else None) for root in roots for p in sorted(root.rglob("*"))}


def test_a_routed_launch_is_written_as_one_set_or_not_at_all(tiny: Path, tmp_path: Path) -> None:
    """The router and its replicas are one launch: when one file of any of them cannot be written, no instance's
    files change (the old single engine stays whole) and no new instance directory or unit is left behind."""
    from npuops.instance.manager import SystemdManager
    from npuops.launch.install import install

    state_dir, unit_dir = tmp_path / "etc", tmp_path / "units"
    manager = SystemdManager(["/bin/true"], unit_dir)  # every systemctl call answers 0: no systemd needed
    (single,) = render_instances(_cpu_plan(tiny), LaunchSpec(name="m", port=9100, state_dir=state_dir))
    written = install([single], state_dir, manager)
    assert [p.name for p in written["m"]] == [f.name for f in single.files if f.name != single.unit_name] + [
        "npuops-m.service"]
    (unit_dir / "npuops-m-r1.service").mkdir()  # the last replica's unit cannot be put in place
    before = _tree(state_dir, unit_dir)
    routed = _rendered(tiny, state_dir=state_dir)
    with pytest.raises(BadInputError) as refused:
        install(routed, state_dir, manager)
    assert refused.value.problem == f"cannot write {unit_dir}/npuops-m-r1.service: Is a directory"
    assert "unit directory" in refused.value.fix
    assert _tree(state_dir, unit_dir) == before  # nothing renamed, no temporaries, no m-r0 or m-r1 directory

    (unit_dir / "npuops-m-r1.service").rmdir()
    written = install(routed, state_dir, manager)
    assert set(written) == {"m", "m-r0", "m-r1"}
    assert {p.name for p in unit_dir.iterdir()} == {"npuops-m.service", "npuops-m-router.service",
                                                   "npuops-m-r0.service", "npuops-m-r1.service"}
    assert (state_dir / "m" / "router.json") in written["m"] and (state_dir / "m-r1" / "vllm.yaml").is_file()
    assert not [p for p in state_dir.rglob(".*.tmp")]
