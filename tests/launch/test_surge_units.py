"""`rollout --surge` without systemd: one replica behind a router (launch --router-policy), the surge replica's
chips, cores and port, and what a rollout refuses before it touches anything. The surge itself serves under real
systemd in tests/systemd/test_rollout.py."""

from __future__ import annotations

import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from npuops.envfile import parse_env_file
from npuops.errors import BadInputError
from npuops.instance.control import units_on_disk
from npuops.instance.manager import SystemdManager
from npuops.instance.record import ENV_FILE, load_record, write_record
from npuops.instance.revisions import LaunchOrigin
from npuops.launch.install import install
from npuops.launch.instance_files import LaunchSpec, render_instances
from npuops.launch.local import Reporter
from npuops.launch.prepare import LaunchChoices
from npuops.launch.revision_store import keep_revision, with_revision
from npuops.launch.rollout import RolloutRequest, rollout_instance
from npuops.launch.surge import surge_files
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, PlanRequest, Workload
from npuops.plan.planner import make_plan
from npuops.plan.result import Plan
from npuops.plan.target import cpu_target, parse_hardware_spec, restrict_devices
from npuops.settings import Settings
from tests.support.http_server import free_port_run
from tests.support.model_dirs import write_tiny_model
from tests.support.paths import REPO

QWEN = REPO / "tests" / "fixtures" / "models" / "qwen3-8b"


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny-llama")


def _cpu_plan(model: Path, **options: object) -> Plan:
    return make_plan(load_model(str(model)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", **options))  # type: ignore[arg-type]


def _npu_plan(replicas: int, router_policy: str | None = None) -> Plan:
    return make_plan(load_model(str(QWEN)), parse_hardware_spec("910B3x8"), Workload(512, 128, objective="latency"),
                     PlanOptions(replicas=replicas, router_policy=router_policy))


def _install(plan: Plan, tmp_path: Path, name: str = "m", port: int = 9100) -> tuple[Settings, SystemdManager]:
    state_dir, unit_dir, run_dir = tmp_path / "etc", tmp_path / "units", tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    manager = SystemdManager(["/bin/true"], unit_dir, run_dir=run_dir)
    spec = LaunchSpec(name=name, port=port, state_dir=state_dir)
    instances = [with_revision(i, 1) for i in render_instances(plan, spec)]
    install(instances, state_dir, manager)
    return Settings(state_dir=state_dir, unit_dir=unit_dir), manager


def test_one_replica_with_a_router_policy_gets_a_router_and_one_without_does_not(tiny: Path) -> None:
    plan = _cpu_plan(tiny, router_policy="round_robin")
    assert plan.replica_count == 1 and plan.router is not None and plan.router.policy == "round_robin"
    assert "`rollout --surge` can then switch it" in plan.explanation("router_policy").why
    replica, router = render_instances(plan, LaunchSpec(name="m", port=9100))
    assert (replica.name, replica.record.behind, replica.record.host, replica.record.port) == (
        "m-r0", "m", "127.0.0.1", 9101)
    assert router.record.is_router and router.record.replicas == ("m-r0",) and router.record.port == 9100
    assert [i.name for i in render_instances(_cpu_plan(tiny), LaunchSpec(name="m", port=9100))] == ["m"]


NODE_CHIPS = tuple(range(8))


def _one_replica_behind_a_router(tmp_path: Path, port: int) -> tuple[Plan, Settings, tuple[int, ...]]:
    """m: one replica behind a router, launched on chips 0-3 of the 8-chip node (--devices 0-3), and the chips
    it leaves free."""
    plan = make_plan(load_model(str(QWEN)), restrict_devices(parse_hardware_spec("910B3x8"), "0-3"),
                     Workload(512, 128, objective="latency"), PlanOptions(replicas=1, router_policy="round_robin"))
    (replica,) = plan.replicas
    settings, _ = _install(plan, tmp_path, port=port)
    spare = tuple(d for d in NODE_CHIPS if d not in replica.devices)
    assert len(spare) >= len(replica.devices), plan.replicas  # room for one more replica on this node
    return plan, settings, spare


def test_a_surge_replica_takes_chips_no_instance_holds_and_the_first_free_port_after_the_block(
        tmp_path: Path) -> None:
    base = free_port_run(6)
    plan, settings, spare = _one_replica_behind_a_router(tmp_path, base)
    width = len(plan.replicas[0].devices)
    router = load_record(settings.state_dir, "m")
    # The block is the router's port, the replica's, the router's metrics: the next one, unless it is busy.
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", base + 3))
        busy.listen(1)
        surge = surge_files(settings.state_dir, plan, LaunchSpec(name="m", port=base, state_dir=settings.state_dir),
                            router, 3, NODE_CHIPS)
    assert surge.name == "m-surge" and surge.record.behind == "m" and surge.record.revision == 3
    assert surge.record.port == base + 4 and surge.record.host == "127.0.0.1"
    assert surge.record.devices == spare[:width]
    env = parse_env_file(surge.file(ENV_FILE).text)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(map(str, spare[:width]))
    assert surge.unit_name == "npuops-m-surge.service"


def test_a_surge_with_no_chip_free_is_refused_with_the_fix(tmp_path: Path) -> None:
    plan, settings, spare = _one_replica_behind_a_router(tmp_path, 9100)
    # Another instance of the node holds the spare chips.
    other = _npu_plan(replicas=1)
    manager = SystemdManager(["/bin/true"], settings.unit_dir, run_dir=tmp_path / "run")
    install(render_instances(other, LaunchSpec(name="other", port=9300, state_dir=settings.state_dir)),
            settings.state_dir, manager)
    write_record(replace(load_record(settings.state_dir, "other"), devices=spare))
    with pytest.raises(BadInputError) as refused:
        surge_files(settings.state_dir, plan, LaunchSpec(name="m", port=9100, state_dir=settings.state_dir),
                    load_record(settings.state_dir, "m"), 2, NODE_CHIPS)
    assert f"--surge needs {len(plan.replicas[0].devices)} free chip(s) for a temporary replica of m" in (
        refused.value.problem)
    assert "has 0 (none) not held by an instance" in refused.value.problem
    assert "roll out without --surge" in refused.value.fix


def test_on_the_cpu_engine_a_surge_replica_shares_the_first_replicas_cores(tiny: Path, tmp_path: Path) -> None:
    plan = _cpu_plan(tiny, replicas=2)
    settings, _ = _install(plan, tmp_path)
    surge = surge_files(settings.state_dir, plan, LaunchSpec(name="m", port=9100, state_dir=settings.state_dir),
                        load_record(settings.state_dir, "m"), 2, NODE_CHIPS)
    assert parse_env_file(surge.file(ENV_FILE).text)["VLLM_CPU_OMP_THREADS_BIND"] == plan.replicas[0].cpus
    assert surge.record.devices == ()


def _kept(tiny: Path, tmp_path: Path, **options: object) -> tuple[Settings, SystemdManager]:
    plan = _cpu_plan(tiny, **options)
    settings, manager = _install(plan, tmp_path)
    request = PlanRequest(model=str(tiny), hardware="cpu", workload=Workload(128, 32), fixed={"dtype": "float32"},
                          **options)  # type: ignore[arg-type]
    instances = [with_revision(i, 1) for i in render_instances(plan, LaunchSpec(name="m", port=9100,
                                                                                state_dir=settings.state_dir))]
    keep_revision(settings.state_dir, "m", 1, LaunchOrigin(request.to_json(), LaunchChoices(port=9100).to_json()),
                  instances)
    return settings, manager


def _refusal(settings: Settings, manager: SystemdManager, **ask: object) -> BadInputError:
    with pytest.raises(BadInputError) as refused:
        rollout_instance(settings, manager, RolloutRequest(name="m", **ask), Reporter(True))  # type: ignore[arg-type]
    return refused.value


def test_what_a_surge_cannot_help_is_refused_before_anything_changes(tiny: Path, tmp_path: Path) -> None:
    settings, manager = _kept(tiny, tmp_path)  # one engine on its own port
    before = sorted(p for p in tmp_path.rglob("*") if p.suffix != ".lock")
    alone = _refusal(settings, manager, surge=True)
    assert alone.problem == "--surge: m has no router on this host to send requests to a surge replica"
    assert "--router-policy POLICY" in alone.fix
    single = _refusal(settings, manager)
    assert "--router-policy" in single.fix and "--surge" in single.fix and "--allow-downtime" in single.fix
    assert sorted(p for p in tmp_path.rglob("*") if p.suffix != ".lock") == before


def test_one_replica_behind_a_router_needs_a_surge(tiny: Path, tmp_path: Path) -> None:
    settings, manager = _kept(tiny, tmp_path, router_policy="round_robin")
    only = _refusal(settings, manager)
    assert only.problem == "m's only replica would leave its router with nothing to send requests to"
    assert only.fix.startswith("roll it out with --surge")
    both = _refusal(settings, manager, surge=True, max_unavailable=2)
    assert both.problem == "--max-unavailable 2 would take all 2 replicas of m (its surge replica too) out at once"
    # With a surge, the one replica may leave: past the checks, the replica is found not running (/bin/true).
    down = _refusal(settings, manager, surge=True)
    assert down.problem.startswith("m-r0 of m not running"), down.problem


def test_surge_over_a_group_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "npuops", "rollout", "m", "--surge", "-i", str(tmp_path / "inv"),
                           "--group", "g"], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "NPUOPS_STATE_DIR": str(tmp_path / "etc")})
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--surge starts a temporary replica on one node" in done.stderr, done.stderr


def test_a_surge_unit_a_killed_rollout_left_belongs_to_its_instance(tmp_path: Path) -> None:
    for unit in ("npuops-m-surge.service", "npuops-m-r0.service", "npuops-mx-surge.service"):
        (tmp_path / unit).write_text("")
    assert units_on_disk("m", tmp_path, set()) == ["npuops-m-r0.service", "npuops-m-surge.service"]
