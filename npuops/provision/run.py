"""`npuops provision`: verify the packages, pick the stack row, run playbooks/provision.yml through ansible-runner,
and turn its per-host results into the report (status, counts, versions before -> after, the failure's message).

The report's JSON names are fixed (scripts depend on them):
{"ok", "artifacts", "hosts": {HOST: {"status": "ok"|"failed"|"unreachable"|"reboot-required", "ok", "changed",
 "failed", "skipped", "versions": {COMPONENT: {"before", "after"}}, "message", "npu_network": {"ok", "check",
 "changed", "ports": [{"device", "before", "after", "changed", "commands", "link", "health", "reaches_detect",
 "problem", "fix"}]}, ...}}}.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuops.datafiles import load_data_toml
from npuops.errors import BadInputError
from npuops.fleet.events import PlaybookEvent
from npuops.fleet.host_results import HostResult, PlaybookRun
from npuops.fleet.inventory import read_inventory_group
from npuops.fleet.npu_network import HostNpuNetwork, fleet_npu_network
from npuops.fleet.runner import run_playbook
from npuops.hardware.versions import parse_ascend_version
from npuops.plan.environment import FINAL, parse_release
from npuops.provision.packages import PackageSet, check_wheelhouse, verify_packages

PLAYBOOK = "provision.yml"
# The roles by their tags (npu_network's tag is npu-network), in the order provision.yml runs them.
ROLES = ("preflight", "users", "driver", "npu-network", "cann", "environment", "python", "tuning", "monitoring",
         "verify")
NPU_NETWORK = "npu-network"


@dataclass(frozen=True)
class ProvisionOptions:
    inventory: Path | Sequence[str]
    artifacts_dir: Path
    packages_dir: Path | None = None
    stack: str | None = None
    tags: tuple[str, ...] = ()
    limit: str | None = None
    install_path: Path | None = None
    check: bool = False
    diff: bool = False
    forks: int = 5
    allow_reboot: bool = False
    hardware_check: bool = True
    arch: str | None = None
    extravars: Mapping[str, Any] = field(default_factory=dict)


def stack_rows() -> list[dict[str, Any]]:
    return list(load_data_toml("compat.toml")["stack"])


def stack_pins(row: Mapping[str, Any]) -> list[str]:
    """The row's exact pins, in install order (torch first: torch_npu and vllm want that exact torch)."""
    pins = [f"torch=={row['torch']}", f"torch-npu=={row['torch_npu']}", f"vllm=={row['vllm']}",
            f"vllm-ascend=={row['vllm_ascend']}"]
    if row.get("triton_ascend"):
        pins.append(f"triton-ascend=={row['triton_ascend']}")
    return pins


def router_requirement() -> str:
    """The router `npuops launch` puts in front of a model's replicas, pinned (compat.toml [router])."""
    return f"vllm-router=={load_data_toml('compat.toml')['router']['vllm_router']}"


def wanted_requirements(options: ProvisionOptions, row: Mapping[str, Any] | None) -> list[str]:
    """What the python role installs that npuops knows on the controller: the row's pins (when npuops chose the row)
    and the router (unless the run's extravars empty npuops_router_requirement)."""
    router = str(options.extravars.get("npuops_router_requirement", router_requirement()) or "")
    return (stack_pins(row) if row is not None else []) + ([router] if router else [])


def choose_row(stack: str | None, cann_version: str | None) -> dict[str, Any] | None:
    """The row named by --stack (its vllm-ascend version), else the newest row for the CANN being installed."""
    rows = stack_rows()
    if stack:
        for row in rows:
            if stack in (row["name"], row["vllm_ascend"], f"vllm-ascend=={row['vllm_ascend']}"):
                return row
        raise BadInputError(f"no stack row {stack!r}", f"use one of: {', '.join(r['name'] for r in rows)}")
    if cann_version:
        wanted = parse_ascend_version(cann_version)
        matching = [r for r in rows if wanted is not None and parse_ascend_version(r["cann"]) == wanted]
        # compat.toml lists the newest first; a release candidate only when --stack names it (an operator's
        # default is the newest final release).
        final = [r for r in matching if parse_release(str(r["vllm_ascend"])).stage == FINAL]
        if matching:
            return (final or matching)[0]
    return None


def npu_networks(options: ProvisionOptions, roles: Sequence[str]) -> dict[str, HostNpuNetwork]:
    """The NPU ports the inventory gives its hosts, checked across the whole inventory (an address used twice is
    refused whatever --limit says), when the npu-network role runs. Hosts named with --host give none."""
    if NPU_NETWORK not in roles:
        return {}
    networks: dict[str, HostNpuNetwork] = {}
    if isinstance(options.inventory, Path):
        hosts = read_inventory_group(options.inventory, "all")
        networks = fleet_npu_network((host.name, host.vars) for host in hosts)
    if not networks and NPU_NETWORK in options.tags:
        raise BadInputError("--tags npu-network, but no host of the inventory gives NPU port addresses",
                            "set npuops_npu_ips (or npuops_npu_ip_base) and npuops_npu_netmask for the hosts in the "
                            "inventory (playbooks/roles/npu_network/defaults/main.yml shows them)")
    return networks


def build_extravars(options: ProvisionOptions, packages: PackageSet | None, row: Mapping[str, Any] | None,
                    roles: Sequence[str], networks: Mapping[str, HostNpuNetwork] | None = None) -> dict[str, Any]:
    extravars: dict[str, Any] = {
        "npuops_packages": {kind: {"src": str(p.path), "name": p.path.name, "sha256": p.sha256,
                                   "version": p.file.version}
                            for kind, p in (packages.packages.items() if packages else ())},
        "npuops_allow_reboot": options.allow_reboot,
        "npuops_hardware_check": options.hardware_check,
        # The python role's default npuops_router_requirement; an inventory may empty it for a host.
        "npuops_router_pin": router_requirement(),
        # Each host's NPU ports, checked on this side (npuops.fleet.npu_network); the npu_network role sets them.
        "npuops_npu_ports_by_host": {host: network.to_json() for host, network in (networks or {}).items()},
    }
    if options.install_path is not None:
        extravars["npuops_install_path"] = str(options.install_path)
    if row is not None:
        extravars["npuops_stack_pins"] = stack_pins(row)
    if packages is not None and packages.wheels:
        extravars["npuops_wheelhouse"] = str(packages.directory)
    extravars.update(options.extravars)
    return extravars


@dataclass(frozen=True)
class ProvisionPlan:
    """Everything that is checked before any host is touched: the packages, the row, the roles, the NPU ports."""

    packages: PackageSet | None
    row: dict[str, Any] | None
    roles: list[str]
    networks: dict[str, HostNpuNetwork]


def plan_provision(options: ProvisionOptions) -> ProvisionPlan:
    """Check everything that can be checked before any host is touched."""
    unknown = [t for t in options.tags if t not in ROLES]
    if unknown:
        raise BadInputError(f"no role {unknown[0]!r}", f"use --tags with: {', '.join(ROLES)}")
    roles = list(options.tags) or list(ROLES)
    packages = verify_packages(options.packages_dir, arch=options.arch) if options.packages_dir else None
    toolkit = packages.packages.get("toolkit") if packages else None
    row = choose_row(options.stack, toolkit.file.version if toolkit else None)
    if packages is not None and "python" in roles:
        check_wheelhouse(packages, wanted_requirements(options, row))
    # Without a row the python role stops on the hosts that have none set in the inventory (npuops_stack_pins).
    return ProvisionPlan(packages, row, roles, npu_networks(options, roles))


# --- the report (pure) -------------------------------------------------------------------------------------------

def host_report(result: HostResult) -> dict[str, Any]:
    data = result.data.get("npuops_provision") if isinstance(result.data, Mapping) else None
    data = data if isinstance(data, Mapping) else {}
    status: str = result.status
    message = result.message
    reboot = bool(data.get("reboot_required"))
    if status == "failed" and reboot:
        status = "reboot-required"
    report: dict[str, Any] = {
        "status": status,
        "ok": result.stats.ok,
        "changed": result.stats.changed,
        "failed": result.stats.failed,
        "skipped": result.stats.skipped,
        "versions": dict(data.get("versions") or {}),
        "message": message,
        "reboot_required": reboot,
    }
    if data.get("doctor") is not None:
        report["doctor"] = data["doctor"]
    if isinstance(data.get("doctor_timer"), Mapping):
        report["doctor_timer"] = dict(data["doctor_timer"])  # the monitoring role: npuops-doctor.timer, or why not
    if isinstance(data.get("npu_network"), Mapping):
        # Each NPU port before and after (in check mode: what it would be), the hccn_tool calls, the verification.
        report["npu_network"] = data["npu_network"]
    would_run = data.get("would_run")
    if isinstance(would_run, Mapping):
        # check mode: the installers that would run, in the order they would (driver role first, then CANN).
        report["would_run"] = [name for role in ("driver", "cann") for name in would_run.get(role) or []]
    if result.failures:
        last = result.failures[-1]
        report["failed_task"] = {"role": last.role, "task": last.task, "rc": last.rc}
    return report


@dataclass(frozen=True)
class ProvisionReport:
    run: PlaybookRun
    hosts: Mapping[str, Mapping[str, Any]]
    packages: Mapping[str, str]
    stack: str | None
    check: bool

    @property
    def ok(self) -> bool:
        return self.run.ok and all(h["status"] == "ok" for h in self.hosts.values())

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "artifacts": str(self.run.artifacts), "check": self.check,
                "packages": dict(self.packages), "stack": self.stack, "duration_s": round(self.run.duration_s, 2),
                "errors": list(self.run.errors), "hosts": {name: dict(h) for name, h in self.hosts.items()}}


def run_provisioning(options: ProvisionOptions, on_event: Callable[[PlaybookEvent], None] | None = None,
              envvars: Mapping[str, str] | None = None) -> ProvisionReport:
    plan = plan_provision(options)
    packages, row = plan.packages, plan.row
    extravars = build_extravars(options, packages, row, plan.roles, plan.networks)
    # What changed, per host (the tasks' names).
    changed_tasks: dict[str, list[str]] = {}

    def collect(event: PlaybookEvent) -> None:
        if event.host and event.kind == "changed":
            changed_tasks.setdefault(event.host, []).append(event.task or "")
        if on_event is not None:
            on_event(event)

    run = run_playbook(PLAYBOOK, inventory=options.inventory, artifacts_dir=options.artifacts_dir,
                       limit=options.limit, extravars=extravars, tags=list(options.tags) or None,
                       check=options.check, diff=options.diff, forks=options.forks, on_event=collect,
                       envvars=envvars)
    hosts = {}
    for name, result in sorted(run.hosts.items()):
        report = host_report(result)
        report["changed_tasks"] = changed_tasks.get(name, [])
        hosts[name] = report
    return ProvisionReport(run, hosts, packages.versions() if packages else {}, row["name"] if row else None,
                           options.check)
