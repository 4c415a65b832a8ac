"""Idempotent `npuops provision` re-runs: npuops versus `ansible-playbook` run directly, and 3 hosts versus 1.

Part 1, localhost. The target is this machine with every path in a temp dir (tests/support/provision_target.py's
`Target`), provisioned with the vendor-style `.run` installers the tests build (tests/support/vendor_installers.py,
needs makeself). It is converged once first (driver and firmware -> "reboot" by a new boot id -> CANN, environment,
tuning, the doctor), then idempotent re-runs of the roles preflight,driver,cann,environment,tuning,verify are timed:

    A  python -m npuops provision -i INV --packages DIR --no-hardware-check --tags ... --json
       (wall time of the process: start-up, package checksums, ansible-runner, the report)
    B  ansible-playbook -i INV playbooks/provision.yml --tags ... --forks 10 -e @extravars.json
       (the ansible-playbook beside this interpreter, with the extra vars npuops builds for A --
       npuops.provision.run.plan_provision + build_extravars -- and npuops' npuops.fleet.runner.BASE_ENVVARS)

Both must change nothing (changed=0: from A's JSON report, from B's PLAY RECAP); the output says so. The runs alternate
A B A B ... so drift on a noisy machine hits both; the ratio of the medians is what to read. A's own report splits its
time: its ansible-runner run (duration_s) versus the rest (interpreter, imports, checksums); its artifacts give the
time per role.

Part 2, parallel scaling (needs root: tests/support/ssh_hosts.py starts 3 SSH hosts in namespaces with overlays, so
the installers write the real /usr/local/Ascend inside each host's overlay -- hence NPUOPS_TEST_ALLOW_REAL_PATHS=1 in
npuops_installer_environment, with TMPDIR=/var/tmp, each host's own, for makeself to extract into). The CANN packages
only (toolkit, kernels, NNAL; --tags preflight,cann,environment, --forks 3) are provisioned on 1 host and on 3 hosts,
each converged once, then the idempotent runs are timed, alternating 1 3 1 3 ... Ideal ratio 3 hosts / 1 host: ~1.0
with a core per host (2 cores here). Without root, or if the hosts cannot start, that part is skipped with the reason.

    python benchmarks/provision_overhead.py [--runs 3] [--skip-fleet] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from npuops.fleet.runner import BASE_ENVVARS, resolve_playbook  # noqa: E402
from npuops.provision.run import ProvisionOptions, build_extravars, plan_provision  # noqa: E402
from tests.support.npuops_cli import package_dir  # noqa: E402
from tests.support.provision_target import CANN, NOT_PYTHON, Target  # noqa: E402
from tests.support.ssh_hosts import FleetSetupError, TestFleet, ensure_prerequisites, start_hosts  # noqa: E402
from tests.support.vendor_installers import build_package_set, makeself_available  # noqa: E402

LOCAL_TAGS = NOT_PYTHON  # preflight,driver,cann,environment,tuning,verify
FLEET_TAGS = "preflight,cann,environment"
CLI_FORKS = 10  # `npuops provision --forks` default: B passes the same
FLEET_FORKS = 3
TIMEOUT_S = 900.0
# ansible-playbook's recap line: "localhost : ok=31 changed=0 unreachable=0 failed=0 skipped=12 ..."
_RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


class BenchError(RuntimeError):
    """A run that did not do what the benchmark needs (failed, changed something, no report)."""


@dataclass
class Run:
    seconds: float  # wall time of the process
    changed: dict[str, int]  # per host
    statuses: dict[str, str]  # per host
    runner_s: float | None = None  # A only: npuops' ansible-runner run (the report's duration_s)
    artifacts: Path | None = None  # A only: this run's ansible-runner artifacts


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def npuops_provision(inventory: Path, packages: Path, tags: str, artifacts: Path, *extra: str) -> Run:
    """`python -m npuops provision ... --json` as the CLI runs it (cwd: the repository, like the tests)."""
    argv = [sys.executable, "-m", "npuops", "provision", "-i", str(inventory), "--packages", str(packages),
            "--no-hardware-check", "--tags", tags, "--artifacts", str(artifacts), "--json", *extra]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT_S, check=False)
    seconds = time.perf_counter() - started
    try:
        report = json.loads(proc.stdout)
        hosts: Mapping[str, Any] = report["hosts"]
    except (ValueError, KeyError, TypeError):
        raise BenchError(f"npuops provision gave no report (rc {proc.returncode}):\n"
                         f"{tail(proc.stdout)}\n{tail(proc.stderr)}") from None
    return Run(seconds, {h: int(r["changed"]) for h, r in hosts.items()},
               {h: str(r["status"]) for h, r in hosts.items()}, float(report["duration_s"]), Path(report["artifacts"]))


def ansible_playbook(inventory: Path, playbook: Path, tags: str, vars_file: Path, cwd: Path) -> Run:
    """ansible-playbook run directly, with what npuops would hand it (extra vars, forks, environment)."""
    binary = Path(sys.executable).parent / "ansible-playbook"
    argv = [str(binary), "-i", str(inventory), str(playbook), "--tags", tags, "--forks", str(CLI_FORKS),
            "-e", f"@{vars_file}"]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env={**os.environ, **BASE_ENVVARS},
                          timeout=TIMEOUT_S, check=False)
    seconds = time.perf_counter() - started
    recap = {m.group(1): m for m in _RECAP.finditer(proc.stdout)}
    if proc.returncode != 0 or not recap:
        raise BenchError(f"ansible-playbook exited {proc.returncode}:\n{tail(proc.stdout)}\n{tail(proc.stderr)}")
    return Run(seconds, {h: int(m.group(3)) for h, m in recap.items()},
               {h: "ok" if m.group(4) == m.group(5) == "0" else "failed" for h, m in recap.items()})


def require_idempotent(run: Run, what: str) -> None:
    bad = {h: (run.statuses[h], run.changed[h]) for h in run.changed if run.statuses[h] != "ok" or run.changed[h]}
    if bad or not run.changed:
        raise BenchError(f"{what} was not an idempotent re-run (host: (status, changed)): {bad or 'no hosts'}")


def time_per_role(artifacts: Path) -> tuple[dict[str, float], float]:
    """Task durations of one ansible-runner run, summed per role (facts and tasks outside roles: their own row)."""
    per_role: dict[str, float] = defaultdict(float)
    for path in (artifacts / "job_events").glob("*.json"):
        try:
            event = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if event.get("event") not in ("runner_on_ok", "runner_on_failed", "runner_on_skipped"):
            continue
        data = event.get("event_data") or {}
        duration = data.get("duration")
        if isinstance(duration, (int, float)):
            role = data.get("role") or ("gather facts" if (data.get("task_action") or "").endswith("gather_facts")
                                        or data.get("task") == "Gathering Facts" else "(no role)")
            per_role[role] += float(duration)
    return dict(per_role), sum(per_role.values())


def median(runs: Sequence[Run]) -> float:
    return statistics.median(r.seconds for r in runs)


# --- part 1: localhost, npuops versus ansible-playbook ------------------------------------------------------------


def converge_local(target: Target, packages: Path) -> None:
    rc, host, _ = target.provision(packages, "--tags", LOCAL_TAGS)
    if host.get("status") != "reboot-required":
        raise BenchError(f"first run: expected reboot-required after the driver, got {host.get('status')} "
                         f"(rc {rc}): {host.get('message')}")
    target.reboot()
    rc, host, _ = target.provision(packages, "--tags", LOCAL_TAGS)
    if rc != 0 or host.get("status") != "ok":
        raise BenchError(f"run after the reboot: rc {rc}, {host.get('status')}: {host.get('message')} "
                         f"{host.get('failed_task')}")


def local_part(work: Path, built: Mapping[str, Path], runs: int) -> None:
    target = Target(work / "node")
    packages = package_dir(work, list(built.values()))
    print(f"part 1: idempotent re-run on localhost, --tags {LOCAL_TAGS}; converging the target first ...", flush=True)
    started = time.perf_counter()
    converge_local(target, packages)
    print(f"  converged in {time.perf_counter() - started:.1f} s (driver run, reboot, full run)", flush=True)

    # B's extra vars: what npuops builds from the CLI's options for A.
    options = ProvisionOptions(inventory=target.inventory, artifacts_dir=target.artifacts, packages_dir=packages,
                               tags=tuple(LOCAL_TAGS.split(",")), forks=CLI_FORKS, hardware_check=False)
    plan = plan_provision(options)
    vars_file = work / "extravars.json"
    vars_file.write_text(json.dumps(build_extravars(options, plan.packages, plan.row, plan.roles, plan.networks)),
                         encoding="utf-8")
    playbook = REPO / "playbooks" / "provision.yml"
    if resolve_playbook("provision.yml") != playbook.resolve():
        print(f"  note: npuops runs {resolve_playbook('provision.yml')}, B runs {playbook}")
    b_cwd = work / "b-cwd"  # no ansible.cfg to pick up (ansible-runner runs in a private directory too)
    b_cwd.mkdir()

    a_runs: list[Run] = []
    b_runs: list[Run] = []
    print(f"  {'run':>3}  {'A npuops s':>10}  {'B ansible s':>11}  {'A/B':>5}  {'A runner s':>10}  "
          f"{'changed A/B':>11}", flush=True)
    for i in range(runs):
        a = npuops_provision(target.inventory, packages, LOCAL_TAGS, target.artifacts)
        require_idempotent(a, f"A run {i + 1}")
        b = ansible_playbook(target.inventory, playbook, LOCAL_TAGS, vars_file, b_cwd)
        require_idempotent(b, f"B run {i + 1}")
        a_runs.append(a)
        b_runs.append(b)
        print(f"  {i + 1:>3}  {a.seconds:10.2f}  {b.seconds:11.2f}  {a.seconds / b.seconds:5.2f}  "
              f"{a.runner_s or 0:10.2f}  {sum(a.changed.values()):>5}/{sum(b.changed.values()):<5}", flush=True)

    a_med, b_med = median(a_runs), median(b_runs)
    runner_med = statistics.median(r.runner_s or 0.0 for r in a_runs)
    print(f"  median over {runs} run(s), every run changed=0 (A: its JSON report; B: its PLAY RECAP):")
    print(f"    A  npuops provision:          {a_med:7.2f} s")
    print(f"       of which ansible-runner:   {runner_med:7.2f} s  (the rest, {a_med - runner_med:.2f} s: interpreter, "
          "imports, package checksums, report)")
    print(f"    B  ansible-playbook directly: {b_med:7.2f} s")
    print(f"    ratio A/B: {a_med / b_med:.3f}  (A - B: {a_med - b_med:+.2f} s; ansible-runner vs B: "
          f"{runner_med - b_med:+.2f} s)")
    last = a_runs[-1].artifacts
    if last is not None and last.is_dir():
        per_role, total = time_per_role(last)
        print(f"  where A's last run spends its time (task durations from its artifacts, sum {total:.2f} s of "
              f"{a_runs[-1].runner_s or 0:.2f} s in ansible-runner):")
        for role, seconds in sorted(per_role.items(), key=lambda kv: -kv[1]):
            print(f"    {role:<14} {seconds:6.2f} s")


# --- part 2: 1 host versus 3 hosts ---------------------------------------------------------------------------------


def fleet_inventories(fleet: TestFleet, work: Path) -> tuple[Path, Path]:
    group_vars = {
        # The hosts' own /usr/local/Ascend lies in their overlays: the test installers may write it there. TMPDIR:
        # makeself extracts to $TMPDIR/selfgz<pid> (its $RANDOM is empty under dash), and /tmp is shared by hosts
        # whose PID namespaces hand out the same pids: concurrent installs on two hosts collide there ("cannot
        # create directory /tmp/selfgz3138: File exists"). /var/tmp is each host's own (overlay).
        "npuops_installer_environment": {"NPUOPS_TEST_ALLOW_REAL_PATHS": "1", "TMPDIR": "/var/tmp"},
        "npuops_min_free_gb": 1,  # only a check; keeps the benchmark independent of this disk's size
    }
    three = fleet.inventory_path(work / "inventory-3.yml", group_vars=group_vars)
    data = fleet.inventory(group_vars=group_vars)
    hosts = data["all"]["children"]["fleet"]["hosts"]
    first = fleet.hosts[0].name
    data["all"]["children"]["fleet"]["hosts"] = {first: hosts[first]}
    one = work / "inventory-1.yml"
    one.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return one, three


def converge_fleet(inventory: Path, packages: Path, artifacts: Path, expect: int) -> float:
    run = npuops_provision(inventory, packages, FLEET_TAGS, artifacts, "--forks", str(FLEET_FORKS))
    bad = {h: s for h, s in run.statuses.items() if s != "ok"}
    if bad or len(run.statuses) != expect:
        raise BenchError(f"converging {inventory.name}: host statuses {run.statuses}")
    return run.seconds


def fleet_part(work: Path, built: Mapping[str, Path], runs: int) -> None:
    print(f"part 2: parallel scaling over SSH, CANN only (--tags {FLEET_TAGS} --forks {FLEET_FORKS}), "
          f"{os.cpu_count()} CPU(s) here", flush=True)
    reason = ensure_prerequisites()
    if reason is not None:
        print(f"  skipped: {reason}")
        return
    packages = package_dir(work, [built["toolkit"], built["kernels"], built["nnal"]])
    fleet_dir = work / "fleet"
    fleet_dir.mkdir()
    fleet: TestFleet | None = None
    try:
        try:
            fleet = start_hosts(3, fleet_dir)
        except FleetSetupError as exc:
            print(f"  skipped: the SSH hosts did not start: {exc}")
            return
        print(f"  3 hosts up in {fleet.setup_s or 0:.1f} s: {', '.join(fleet.names)}", flush=True)
        one, three = fleet_inventories(fleet, work)
        artifacts = work / "fleet-artifacts"
        first = converge_fleet(one, packages, artifacts, 1)
        rest = converge_fleet(three, packages, artifacts, 3)
        print(f"  converged: 1 host {first:.1f} s, then all 3 {rest:.1f} s", flush=True)
        one_runs: list[Run] = []
        three_runs: list[Run] = []
        print(f"  {'run':>3}  {'1 host s':>8}  {'3 hosts s':>9}  {'3/1':>5}", flush=True)
        for i in range(runs):
            a = npuops_provision(one, packages, FLEET_TAGS, artifacts, "--forks", str(FLEET_FORKS))
            require_idempotent(a, f"1-host run {i + 1}")
            b = npuops_provision(three, packages, FLEET_TAGS, artifacts, "--forks", str(FLEET_FORKS))
            require_idempotent(b, f"3-host run {i + 1}")
            if len(b.changed) != 3:
                raise BenchError(f"3-host run {i + 1} reported hosts {sorted(b.changed)}")
            one_runs.append(a)
            three_runs.append(b)
            print(f"  {i + 1:>3}  {a.seconds:8.2f}  {b.seconds:9.2f}  {b.seconds / a.seconds:5.2f}", flush=True)
        one_med, three_med = median(one_runs), median(three_runs)
        one_runner = statistics.median(r.runner_s or 0.0 for r in one_runs)
        three_runner = statistics.median(r.runner_s or 0.0 for r in three_runs)
        print(f"  median over {runs} run(s), every host changed=0:")
        print(f"    1 host:  {one_med:7.2f} s  (ansible-runner {one_runner:.2f} s)")
        print(f"    3 hosts: {three_med:7.2f} s  (ansible-runner {three_runner:.2f} s)")
        print(f"    ratio 3 hosts / 1 host: {three_med / one_med:.2f}  (1.0 = perfectly parallel, 3.0 = serial)")
    finally:
        if fleet is not None:
            try:
                fleet.close()
            except FleetSetupError as exc:
                print(f"  warning: {exc}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each variant, alternating (default 3)")
    parser.add_argument("--skip-fleet", action="store_true", help="only part 1 (localhost)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (targets, artifacts)")
    args = parser.parse_args()
    if not makeself_available():
        print("makeself is not installed (apt-get install makeself): the test installers cannot be built",
              file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="npuops-bench-provision-"))
    failed = False
    try:
        built = build_package_set(work / "built", cann=CANN)
        local_part(work, built, args.runs)
        print()
        if args.skip_fleet:
            print("part 2: skipped (--skip-fleet)")
        else:
            fleet_part(work, built, args.runs)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        failed = True
        return 1
    finally:
        if args.keep or failed:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
