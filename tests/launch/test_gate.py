"""The start gate (`npuops run --preflight NAME`, the unit's ExecStartPre) on recorded npu-smi output.

The instance is planned for four 910B2C chips (devices 4-7) and rendered as launch installs it; a fake npu-smi on
PATH replays the real capture of such a node (tests/fixtures/ascend/npu-smi-info_910b2c_4dev_proc_1.txt, where
another process holds 29 GB of NPU 4), or that capture with NPU 4's health cell changed to Alarm (the only edit,
same width). Then the same refusal through the stand-in service manager: launch fails with the gate's verdict.
Which checks the gate runs (by tag) is checked in-process on records of each kind.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from npuops.checks import launch as launch_checks
from npuops.doctor.context import CheckContext, DoctorOptions
from npuops.doctor.model import Status
from npuops.doctor.registry import discover_checks
from npuops.hardware.probe import Probe
from npuops.instance.membership import ClusterMembership
from npuops.instance.ray import RayState
from npuops.instance.record import ROLE_ENGINE, ROLE_HEADLESS, ROLE_RAY_WORKER
from npuops.service.gate import gate_checks, peer_group, render_gate_text, run_gate
from npuops.settings import Settings
from tests.support.captures import capture
from tests.support.fake_commands import write_fake_tool
from tests.support.instance_records import make_record
from tests.support.paths import REPO

B2C = "npu-smi-info_910b2c_4dev_proc_1.txt"
MODEL = REPO / "tests" / "fixtures" / "models" / "qwen3-8b"
PLAN = ("--hardware", "910B2Cx8", "--devices", "4-7", "--tp", "4", "--vllm", "/bin/true")


def sick_capture() -> str:
    text = capture(B2C)
    old = "| 4     910B2C              | OK            |"
    assert old in text
    return text.replace(old, "| 4     910B2C              | Alarm         |", 1)


def npuops(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npuops", *args], env=env, capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, check=False)


def environment(tmp_path: Path, npu_smi_output: str, state: Path, data_root: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    write_fake_tool(bin_dir, "npu-smi", npu_smi_output)
    env = dict(os.environ)
    env.update({"PATH": f"{bin_dir}:{env['PATH']}", "NPUOPS_STATE_DIR": str(state),
                "NPUOPS_SERVICE_DATA_ROOT": str(data_root), "NPUOPS_ASCEND_ROOT": str(tmp_path / "no-ascend")})
    return env


def render(env: dict[str, str], state: Path, name: str) -> None:
    proc = npuops(env, "launch", str(MODEL), *PLAN, "--name", name, "--dry-run", "--output", str(state / name))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("output", "check", "says"), [
    (sick_capture(), "chip-health", "NPU 4 chip 0 (device 4, bus 0000:DA:00.0) is 'Alarm'"),
    (capture(B2C), "hbm-free", "pt_main_thread"),
])
def test_the_gate_refuses_a_sick_or_busy_chip(tmp_path: Path, output: str, check: str, says: str) -> None:
    state, data_root = tmp_path / "state", tmp_path / "var-lib"
    env = environment(tmp_path, output, state, data_root)
    render(env, state, "qwen")

    proc = npuops(env, "run", "--state-dir", str(state), "--preflight", "qwen")
    assert proc.returncode == 1, proc.stderr
    refusal = next(line for line in proc.stderr.splitlines() if line.startswith(f"refused [{check}]"))
    assert says in refusal, proc.stderr
    fix = proc.stderr.splitlines()[proc.stderr.splitlines().index(refusal) + 1]
    assert fix.startswith("  fix: ") and len(fix) > 20
    assert "refuses to start" in proc.stderr.splitlines()[-1]

    report = json.loads(npuops(env, "run", "--state-dir", str(state), "--preflight", "--json", "qwen").stdout)
    assert report["ok"] is False and check in report["blocking"]
    verdicts = {c["id"]: c["status"] for c in report["checks"]}
    # The chips the instance does not use are not its business; the port and model checks ran too.
    assert verdicts["model-directory"] == "pass" and verdicts["port-free"] == "pass"

    # `npuops status` names the refusal and its fix.
    status = json.loads(npuops(env, "status", "qwen", "--json").stdout)["instances"][0]
    assert status["exit"]["reason"] == "gate-refused"
    assert status["diagnosis"]["id"].startswith("gate:") and status["diagnosis"]["fix"]


def test_the_gate_passes_a_healthy_chip_it_uses_and_ignores_the_sick_one_it_does_not(tmp_path: Path) -> None:
    state, data_root = tmp_path / "state", tmp_path / "var-lib"
    env = environment(tmp_path, sick_capture(), state, data_root)
    proc = npuops(env, "launch", str(MODEL), "--hardware", "910B2Cx8", "--devices", "6-7", "--tp", "2",
                  "--vllm", "/bin/true", "--name", "pair", "--dry-run", "--output", str(state / "pair"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(npuops(env, "run", "--state-dir", str(state), "--preflight", "--json", "pair").stdout)
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["hbm-free"]["status"] == "pass"
    # The sick chip is someone else's problem: a warning, not a refusal.
    assert checks["chip-health"]["status"] == "warn"
    assert [(p["npu_id"], p["in_launch"]) for p in checks["chip-health"]["evidence"]["problems"]] == [(4, False)]
    # This fake node has no driver or CANN installed: those refuse, as they would on a bare node.
    assert "driver-installed" in report["blocking"] and "chip-health" not in report["blocking"]


def test_launch_under_the_service_manager_reports_the_gate_refusal(tmp_path: Path) -> None:
    systemctl = Path(sys.executable).parent / "systemctl3.py"
    if not systemctl.exists():
        pytest.fail(f"{systemctl} is missing: install the test extra (pip install -e .[test])")
    root = Path(tempfile.mkdtemp(prefix="sd", dir="/tmp")) / "root"
    try:
        _launch_refused(tmp_path, root, systemctl)
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def _launch_refused(tmp_path: Path, root: Path, systemctl: Path) -> None:
    (root / "etc/systemd/system").mkdir(parents=True)
    env = environment(tmp_path, sick_capture(), root / "etc/npuops", root / "var/lib")
    env.update({"NPUOPS_SYSTEMCTL": f"{systemctl} --root={root}", "NPUOPS_UNIT_DIR": str(root / "etc/systemd/system")})
    proc = npuops(env, "launch", str(MODEL), *PLAN, "--name", "sick", "--service-user", getpass.getuser(),
                  *(["--allow-root"] if getpass.getuser() == "root" else []))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "sick: the service failed" in proc.stderr
    assert "refused [chip-health]" in proc.stderr  # the gate's own lines, from the unit's log
    assert "diagnosis [gate:" in proc.stderr and "Traceback" not in proc.stderr
    status = json.loads(npuops(env, "status", "sick", "--json").stdout)["instances"][0]
    assert status["state"] == "failed" and status["unit_state"]["active_state"] == "failed"
    assert "chip-health" in json.loads((root / "var/lib/npuops-sick/supervisor.json").read_text())["exit"]["blocking"]


# --- which checks the gate runs --------------------------------------------------------------------------------------

# What the gate ran before its checks were selected by tag (its id lists then): the selection must not lose one.
INSTANCE_CHECKS = {"engine-executable", "model-directory", "port-free", "ray-cluster", "pd-kv-ports", "pd-mooncake",
                   "pd-npu-nics", "cpu-compiler"}
HOST_GATE = {"shm-size", "free-memory"} | INSTANCE_CHECKS
NPU_GATE = HOST_GATE | {
    "driver-installed", "npu-smi-runs", "device-nodes", "chip-health", "chip-temperature", "hbm-free",
    "cann-toolkit", "cann-kernels", "nnal-version", "driver-cann-compat", "stack-row", "torch-npu-cann",
    "python-version", "ascend-env", "launch-blocking-graph", "alloc-conf", "cpuset-per-npu"}
RAY_CLUSTER = {"strategy": "ray", "ray_unit": "npuops-demo-ray.service", "ray_address": "10.213.0.11:6379",
               "nodes": [{"name": "h1", "address": "10.213.0.11", "role": "head"}]}


def _tagged(*tags: str) -> set[str]:
    return {c.id for c in discover_checks() if set(c.tags) & set(tags)}


# A host of a multi-node instance also checks the network to the group's other hosts.
GROUP_GATE = {"host-peer-reach", "npu-peer-ping"}


@pytest.mark.parametrize(("kind", "role", "cluster", "expected", "tags", "applies"), [
    ("npu", ROLE_ENGINE, {}, NPU_GATE, ("gate", "gate-npu"), {"port-free"}),
    ("cpu", ROLE_ENGINE, {}, HOST_GATE, ("gate",), {"port-free"}),
    ("cpu", ROLE_ENGINE, RAY_CLUSTER, HOST_GATE | GROUP_GATE, ("gate", "gate-group"),  # a Ray head's engine
     {"port-free", "ray-cluster"}),
    ("npu", ROLE_RAY_WORKER, RAY_CLUSTER, NPU_GATE | GROUP_GATE, ("gate", "gate-npu", "gate-group"), set()),
    ("npu", ROLE_HEADLESS, {"strategy": "dp"}, NPU_GATE | GROUP_GATE, ("gate", "gate-npu", "gate-group"),
     set()),  # a follower
], ids=["npu", "cpu", "ray-head", "ray-worker", "dp-follower"])
def test_the_gate_runs_exactly_the_checks_tagged_for_it(kind: str, role: str, cluster: dict[str, Any],
                                                        expected: set[str], tags: tuple[str, ...],
                                                        applies: set[str], tmp_path: Path, fake_root: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[object] = []

    def whole_cluster(asked_about: ClusterMembership) -> RayState:
        asked.append(asked_about)
        return RayState(complete=True, expected=1, alive=("h1",))

    monkeypatch.setattr(launch_checks, "probe_ray_cluster", whole_cluster)
    membership = ClusterMembership.from_json(cluster) if cluster else None
    # Port 0: the bind test always finds it free, so port-free passes wherever it applies.
    record = make_record(tmp_path / "state", role=role, cluster=membership, target_kind=kind,
                         devices=(0, 1) if kind == "npu" else (), port=0)
    selected = [c.id for c in gate_checks(record)]
    assert set(selected) == _tagged(*tags) == expected and len(selected) == len(expected)
    outcomes = run_gate(record, Settings(root=fake_root)).outcomes
    assert [o.check_id for o in outcomes] == selected  # each once, the instance's own first
    assert set(selected[:len(INSTANCE_CHECKS)]) == INSTANCE_CHECKS
    status = {o.check_id: o.result.status for o in outcomes}
    # The instance's checks that do not apply to this part skip; the others give a verdict.
    assert {i for i in ("port-free", "ray-cluster") if status[i] is not Status.SKIP} == applies
    assert asked == ([membership] if "ray-cluster" in applies else [])


@pytest.mark.parametrize(("kind", "compiled", "environ", "status"), [
    ("cpu", True, {"PATH": "BIN"}, Status.PASS),  # g++ on the engine's PATH
    ("cpu", True, {"PATH": "/nonexistent"}, Status.FAIL),
    ("cpu", True, {"PATH": "/nonexistent", "CXX": "/bin/true"}, Status.PASS),  # $CXX wins, as inductor's own
    ("cpu", False, {"PATH": "/nonexistent"}, Status.SKIP),  # eager: nothing to build
    ("npu", True, {"PATH": "/nonexistent"}, Status.SKIP),
], ids=["g++", "no-compiler", "cxx", "eager", "npu"])
def test_a_compiled_cpu_engine_needs_a_cpp_compiler(kind: str, compiled: bool, environ: dict[str, str],
                                                     status: Status, tmp_path: Path) -> None:
    # The check looks the compiler up on the engine's PATH, as inductor does: an executable g++ there is what counts.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "g++").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "g++").chmod(0o755)
    environ = {k: str(bin_dir) if v == "BIN" else v for k, v in environ.items()}
    record = make_record(tmp_path / "state", target_kind=kind, graph_mode=compiled)
    (check,) = [c for c in discover_checks() if c.id == "cpu-compiler"]
    result = check().run(CheckContext(Probe(Settings(environ=environ)), DoctorOptions(instance=record)))
    assert result.status is status, result.message
    if status is Status.FAIL:
        assert "g++ is not on its PATH" in result.message
        assert "--enforce-eager" in str(result.remediation) and "apt-get install g++" in str(result.remediation)


def _group_record(tmp_path: Path, peer_address: str):  # type: ignore[no-untyped-def]
    cluster = ClusterMembership.from_json({
        "group": "fleet", "strategy": "dp", "rank": 1, "role": "follower", "endpoint_host": "h1",
        "nodes": [{"name": "h1", "address": peer_address, "role": "leader", "npu_ips": {"0": "29.1.0.11"}},
                  {"name": "h2", "address": "127.0.0.1", "role": "follower", "npu_ips": {"0": "29.1.0.12"}}]})
    return make_record(tmp_path / "state", role=ROLE_HEADLESS, cluster=cluster, target_kind="cpu", port=0)


def test_a_group_hosts_gate_checks_its_peers_from_the_membership(tmp_path: Path, fake_root: Path) -> None:
    """The follower's gate reaches the leader at the address launch wrote into its record (a real TCP connect: a
    refused port is a host that is up); the peer checks' passes go to the journal with the verdict line."""
    record = _group_record(tmp_path, "127.0.0.1")
    group = peer_group(record)
    assert group is not None and [(p.name, p.address, dict(p.npu_ips)) for p in group.peers] == [
        ("h1", "127.0.0.1", {0: "29.1.0.11"})]
    assert dict(group.npu_ips) == {0: "29.1.0.12"} and group.ifname is None
    report = run_gate(record, Settings(root=fake_root))
    outcomes = {o.check_id: o for o in report.outcomes}
    assert outcomes["host-peer-reach"].result.status is Status.PASS, outcomes["host-peer-reach"].result
    assert outcomes["npu-peer-ping"].result.status is Status.SKIP  # no NPU here
    text = render_gate_text(report, "dp")
    assert "pass [host-peer-reach] 1 peer host(s) answer from" in text and "h1 (" in text


GATE_IN_A_NETNS = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from tests.launch.test_gate import _group_record
from npuops.service.gate import run_gate
from npuops.settings import Settings
report = run_gate(_group_record(Path(sys.argv[1]), "10.213.7.11"), Settings(root=Path(sys.argv[2])))
print(json.dumps({o.check_id: o.result.message for o in report.blocking}))
"""


def test_a_group_hosts_gate_refuses_to_start_when_a_peer_cannot_be_reached(tmp_path: Path, fake_root: Path) -> None:
    """The follower's gate in a network namespace of its own (`unshare -n`: a host cut off from the group's network)
    cannot reach the leader: it refuses, naming the peer and its address, before the engine would wait for it until
    HCCL_CONNECT_TIMEOUT."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a network namespace")
    done = subprocess.run(["unshare", "-n", sys.executable, "-c", GATE_IN_A_NETNS, str(tmp_path), str(fake_root),
                           str(REPO)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # (The record's made-up engine and model refuse too: the peer is one more reason, named with its address.)
    refusals = json.loads(done.stdout)
    assert "h1 10.213.7.11:22: network is unreachable" in refusals.get("host-peer-reach", ""), refusals
    reachable = run_gate(_group_record(tmp_path, "127.0.0.1"), Settings(root=fake_root))
    assert "host-peer-reach" not in {o.check_id for o in reachable.blocking}
    assert peer_group(make_record(tmp_path / "single")) is None  # a single-node instance has no peers
