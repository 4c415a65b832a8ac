"""`npuops rollout NAME -i INVENTORY --group GROUP --stack ROW`: a new vllm-ascend row on a serving group, host by
host, the endpoint serving on the other hosts throughout.

For each host (`--max-unavailable` hosts at a time), in order:

1. drain-hosts.yml: its replicas out of the router, the doctor's verdict before anything changes (the verify role),
   then `npuops stop NAME` there (each replica drains);
2. provision.yml with the existing roles, limited to those hosts: the row's pins into the venv the replicas run
   from (the python role; with a CANN toolkit in --packages also the cann and environment roles), then the verify
   role's doctor;
3. the verdict: provisioning converged and the doctor fails no check it passed before (what already failed there
   is not the row's doing: on a node without its NPUs, the chip checks);
4. rollout-host.yml: the instance's files (planned again from the kept request) installed as the new revision,
   each replica started, followed to healthy, asked a first request and compared with --verify-golden, and put
   back into the router.

A host that fails any step stays out of the router with its replicas stopped (its venv may be half changed: it
must not serve), and the rollout stops there with the reason, the hosts after it untouched. The driver and
firmware are never touched here: a driver change needs a reboot (`npuops provision --allow-reboot`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from npuops.fleet.events import PlaybookEvent
from npuops.fleet.runner import run_playbook
from npuops.instance.revisions import OUTCOME_ROLLING_OUT, OUTCOME_SERVING, OUTCOME_STOPPED, LaunchOrigin
from npuops.launch.group import GroupLaunch
from npuops.launch.group_rollout import (
    GroupRolloutAsk,
    GroupRolloutResult,
    HostOutcome,
    current_group_revision,
    host_by_host,
    plan_group_revision,
    replica_files,
    replica_urls,
    switch_hosts,
)
from npuops.launch.multinode import HostPart
from npuops.launch.revision_store import finish_revision, keep_group_revision, next_revision
from npuops.provision.run import ProvisionOptions, plan_provision, run_provisioning
from npuops.settings import Settings

DRAIN_PLAYBOOK = "drain-hosts.yml"
# `--stack inventory`: the pins each host's inventory sets (npuops_stack_pins), as `npuops provision` without
# --stack uses them: a site's own builds.
INVENTORY_ROW = "inventory"


@dataclass(frozen=True)
class StackChoice:
    """What `--stack` installs and how the provisioning run may go."""

    row: str  # a compat.toml row (its vllm-ascend version or name), or INVENTORY_ROW
    packages_dir: Path | None = None  # --packages: a wheelhouse, and CANN packages to install with the row
    hardware_check: bool = True

    def describe(self, row: Mapping[str, Any] | None) -> str:
        if row is None:
            return "stack: each host's npuops_stack_pins from the inventory"
        return f"stack: row {row['name']} (vllm-ascend {row['vllm_ascend']}, CANN {row['cann']})"


def _doctor_failures(data: Mapping[str, Any] | None) -> tuple[bool, set[str], str]:
    """From a host's `npuops_provision.doctor` (the verify role's report): whether it ran, its failed check ids,
    and why it did not run."""
    doctor = ((data or {}).get("npuops_provision") or {}).get("doctor") or {}
    if doctor.get("ok") is None:
        return False, set(), str(doctor.get("skipped") or "the verify role did not report")
    return True, {str(i) for i in doctor.get("failed") or []}, ""


def stack_verdict(host: str, drained: Mapping[str, Any] | None, provisioned: Mapping[str, Any] | None) -> str:
    """Why `host` must not serve on the new stack, or "" (pure). `drained`: its drain-hosts.yml result (status,
    message, data); `provisioned`: its provisioning report (npuops.provision.run.host_report)."""
    if drained is None or drained["status"] != "ok":
        return f"not drained: {(drained or {}).get('message') or 'not reached'}"
    ran_before, before, _ = _doctor_failures(drained.get("data"))
    if provisioned is None:
        return "not provisioned: not reached"
    if provisioned["status"] != "ok":
        failed = provisioned.get("failed_task") or {}
        where = f" ({failed.get('role')}: {failed.get('task')})" if failed.get("task") else ""
        return f"provisioning {provisioned['status']}{where}: {provisioned.get('message') or 'no message'}"
    doctor = provisioned.get("doctor") or {}
    if doctor.get("ok") is None:
        return f"the doctor did not run after provisioning: {doctor.get('skipped') or 'no report'}"
    new = sorted(set(doctor.get("failed") or []) - (before if ran_before else set()))
    if new:
        return f"the doctor fails {', '.join(new)} after the new stack" + (" (not before)" if ran_before else "")
    return ""


def _venv(choices: Mapping[str, Any]) -> str | None:
    """The venv the replicas run from: the launch's --vllm's, else the python role's default."""
    vllm = choices.get("vllm")
    return str(Path(vllm).parent.parent) if vllm else None


def _drain(ask: GroupRolloutAsk, launch: GroupLaunch, batch: Sequence[HostPart], venv: str | None,
           on_event: Callable[[PlaybookEvent], None] | None) -> dict[str, dict[str, Any] | None]:
    files = {p.host.name: replica_files(p, ask.name) for p in batch}
    extravars: dict[str, Any] = {"npuops_instance": ask.name, "npuops_router_host": launch.parts[0].host.name,
                                 "npuops_rollout_hosts": [p.host.name for p in batch],
                                 "npuops_worker_urls": [u for f in files.values() for u in replica_urls(f)],
                                 "npuops_replicas_by_host": {host: sorted(f) for host, f in files.items()}}
    if venv:
        extravars["npuops_venv"] = venv
    run = run_playbook(DRAIN_PLAYBOOK, inventory=ask.where.inventory, artifacts_dir=ask.where.artifacts_dir,
                       limit=ask.where.group, forks=ask.where.forks, on_event=on_event, extravars=extravars)
    out = {}
    for part in batch:
        result = run.hosts.get(part.host.name)
        out[part.host.name] = ({"status": result.status, "message": result.message, "data": dict(result.data)}
                               if result is not None else None)
    return out


def _provision(options: ProvisionOptions, batch: Sequence[HostPart],
               on_event: Callable[[PlaybookEvent], None] | None) -> dict[str, Any]:
    limited = replace(options, limit=",".join(p.host.name for p in batch))
    return dict(run_provisioning(limited, on_event=on_event).hosts)


def provisioning_options(ask: GroupRolloutAsk, stack: StackChoice, venv: str | None) -> ProvisionOptions:
    """The provisioning run of each step: the row's roles, checked (packages, row, wheelhouse) before any host is
    drained."""
    roles = ["python", "verify"]
    options = ProvisionOptions(inventory=ask.where.inventory, artifacts_dir=ask.where.artifacts_dir,
                               packages_dir=stack.packages_dir,
                               stack=None if stack.row == INVENTORY_ROW else stack.row, tags=tuple(roles),
                               forks=ask.where.forks, hardware_check=stack.hardware_check,
                               extravars={"npuops_venv": venv} if venv else {})
    plan = plan_provision(options)
    if plan.packages is not None and "toolkit" in plan.packages.packages:
        # The row's CANN comes with it: the toolkit, kernels and NNAL, and the environment they export.
        options = replace(options, tags=("cann", "environment", *roles))
    return options


def rollout_group_stack(settings: Settings, ask: GroupRolloutAsk, stack: StackChoice,
                        on_event: Callable[[PlaybookEvent], None] | None = None) -> GroupRolloutResult:
    store, current, kept = current_group_revision(ask)
    launch, _ = plan_group_revision(settings, ask, current, kept, on_event)
    venv = _venv(kept["choices"])
    options = provisioning_options(ask, stack, venv)
    row = plan_provision(options).row
    origin = LaunchOrigin(kept["request"], kept["choices"], "rollout --stack", (stack.describe(row),))
    number = next_revision(store, ask.name)
    result = GroupRolloutResult(ask.name, ask.where.group, current.number, number, origin.changes)
    keep_group_revision(store, ask.name, number, origin, current.model_path, current.served_model_name,
                        current.parts, outcome=OUTCOME_ROLLING_OUT)
    staging = ask.where.artifacts_dir / f"staging-stack-{ask.name}-{os.getpid()}"
    host_by_host(ask, launch, result, staging,
                 lambda batch: _step(ask, options, launch, batch, number, venv, staging, on_event))
    finish_revision(store, ask.name, number, OUTCOME_SERVING if result.ok else OUTCOME_STOPPED, result.reason)
    return result


def _step(ask: GroupRolloutAsk, options: ProvisionOptions, launch: GroupLaunch,
          batch: Sequence[HostPart], number: int, venv: str | None, staging: Path,
          on_event: Callable[[PlaybookEvent], None] | None) -> list[HostOutcome]:
    drained = _drain(ask, launch, batch, venv, on_event)
    reachable = [p for p in batch if (drained.get(p.host.name) or {}).get("status") == "ok"]
    provisioned = _provision(options, reachable, on_event) if reachable else {}
    verdicts = {p.host.name: stack_verdict(p.host.name, drained.get(p.host.name), provisioned.get(p.host.name))
                for p in batch}
    ready = [p for p in batch if not verdicts[p.host.name]]
    switched = ({o.host: o for o in switch_hosts(ask, launch, ready, number, staging, on_event, put_back=False)}
                if ready else {})
    outcomes = []
    for part in batch:
        name = part.host.name
        report = provisioned.get(name) or {}
        details = {"versions": report.get("versions"), "doctor": report.get("doctor")}
        if verdicts[name]:
            outcomes.append(HostOutcome(name, False, f"{verdicts[name]}; its replicas stay stopped, out of the "
                                        "router", None, details))
        else:
            done = switched[name]
            outcomes.append(HostOutcome(name, done.ok, done.message, done.switch, details))
    return outcomes
