"""`npuops launch MODEL -i INVENTORY --group GROUP`: one multi-node instance over a serving group, through Ansible.

1. the group's hosts, in inventory order (the first is the Ray head / data-parallel leader);
2. every host's node model (node-facts.yml): its chips (the plan's hardware) and its interfaces (the address and
   interface HCCL, Gloo and Ray use, per host);
3. the plan for len(hosts) nodes, rendered per host (npuops.launch.multinode) into a private staging directory;
4. launch-group.yml copies the files and starts the units in order, waiting for the Ray cluster and the endpoint.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError, EnvironmentMissingError, UsageError
from npuops.fleet.events import PlaybookEvent
from npuops.fleet.host_results import PlaybookRun
from npuops.fleet.inventory import InventoryHost, read_inventory_group
from npuops.fleet.npu_network import npu_ips_of
from npuops.fleet.runner import run_playbook
from npuops.hardware.node import Node
from npuops.inputfiles import read_api_key_file
from npuops.instance.record import MANAGER_SYSTEMD
from npuops.instance.revisions import LaunchOrigin
from npuops.instance.status import InstanceStatus
from npuops.launch.instance_files import LaunchSpec, pd_shared_path
from npuops.launch.multinode import ClusterHost, HostPart, render_cluster, render_pd_group, render_replica_group
from npuops.launch.prepare import LaunchChoices, exposure_note, vllm_executable
from npuops.launch.revision_store import group_store, keep_group_revision, next_revision
from npuops.plan.disaggregation import EXAMPLE_CONNECTOR
from npuops.plan.inputs import PlanRequest
from npuops.plan.request import plan_pd_over_hosts, plan_request, resolve_target
from npuops.plan.result import Plan
from npuops.plan.router import DEFAULT_POLICY, RouterOptions
from npuops.plan.speculative import require_draft_on_disk
from npuops.settings import Settings
from npuops.wire import WireFormatError

LAUNCH_GROUP_PLAYBOOK = "launch-group.yml"
# Inventory variables a host may set to override what npuops works out from its node model.
ADDRESS_VAR = "npuops_serving_address"
IFNAME_VAR = "npuops_serving_ifname"
# Where provisioning's environment role writes what CANN's set_env.sh scripts export (systemd cannot source them).
ASCEND_ENV_FILE = Path("/etc/npuops/ascend.env")


def choose_serving_interface(host: InventoryHost, node: Node) -> ClusterHost:
    """The address and interface a host's cluster traffic uses: the inventory's override, else the interface that
    holds the host's inventory address. Pure."""
    interfaces = node.host.interfaces
    address = str(host.vars.get(ADDRESS_VAR) or host.address)
    ifname = host.vars.get(IFNAME_VAR)
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        # A DNS name in the inventory: take the first address of the named interface, or of the only one that has one.
        candidates = [i for i in interfaces if i.ipv4 and (ifname is None or i.name == ifname)]
        if ifname is None and len(candidates) != 1:
            raise BadInputError(
                f"host {host.name}: cannot tell which address HCCL and Ray should use ({address} is a name and the "
                f"host has {len(candidates)} interfaces with IPv4 addresses)",
                f"set {ADDRESS_VAR} (and {IFNAME_VAR}) for {host.name} in the inventory") from None
        if not candidates:
            raise BadInputError(f"host {host.name}: interface {ifname} has no IPv4 address",
                                f"set {ADDRESS_VAR} for {host.name}, or fix {IFNAME_VAR}") from None
        address = candidates[0].ipv4[0].split("/")[0]
        ifname = candidates[0].name
    if ifname is None:
        holders = [i.name for i in interfaces if any(a.split("/")[0] == address for a in i.ipv4)]
        if not holders:
            raise BadInputError(
                f"host {host.name}: no interface holds {address} (its interfaces: "
                f"{', '.join(i.name for i in interfaces) or 'none reported'})",
                f"set {ADDRESS_VAR} and {IFNAME_VAR} for {host.name} in the inventory to the address and interface "
                "the hosts reach each other on")
        ifname = holders[0]
    return ClusterHost(host.name, address, str(ifname), npu_ips_of(host.name, host.vars) or {})


def check_same_hardware(nodes: Mapping[str, Node]) -> tuple[str, int, int | None]:
    """(chip name, chips per host, device memory MB) shared by every host, or an error naming the odd ones."""
    shapes: dict[str, tuple[str, int, int | None]] = {}
    for name, node in nodes.items():
        if not node.chips:
            shapes[name] = ("", 0, None)
            continue
        first = node.chips[0]
        shapes[name] = (first.smi.name, len(node.chips), first.device_memory_total_mb or None)
    distinct = {(s[0], s[1]) for s in shapes.values()}
    if len(distinct) > 1:
        listing = "; ".join(f"{n}: {s[1]} x {s[0] or 'no NPU'}" for n, s in shapes.items())
        raise BadInputError(f"the group's hosts differ ({listing})",
                            "serve a group of identical nodes (`npuops doctor -i INVENTORY` shows the differences)")
    return next(iter(shapes.values()))


@dataclass
class GroupLaunch:
    """What a group launch did, for the report and --json."""

    group: str
    name: str
    plan: Plan
    parts: list[HostPart]
    run: PlaybookRun | None = None
    # The first host's instance status (its `npuops status NAME --json`) at the end of the launch.
    endpoint_status: InstanceStatus | None = None
    staging: Path | None = None
    notes: list[str] = field(default_factory=list)
    strategy: str | None = None  # "replicas"; None: the plan's cluster says (ray or dp)

    @property
    def strategy_name(self) -> str | None:
        return self.strategy or (self.plan.cluster.strategy if self.plan.cluster else None)

    @property
    def ok(self) -> bool:
        healthy = self.endpoint_status is not None and self.endpoint_status.healthy
        return self.run is not None and self.run.ok and healthy

    def host_results(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for part in self.parts:
            result = self.run.hosts.get(part.host.name) if self.run is not None else None
            status = result.status if result is not None else ("not run" if self.run is None else "skipped")
            out[part.host.name] = {**part.to_json(), "status": status,
                                   "message": result.message if result is not None else ""}
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "name": self.name, "group": self.group,
            "strategy": self.strategy_name,
            "hosts": self.host_results(),
            "endpoint": self.endpoint_status.to_json() if self.endpoint_status is not None else None,
            "artifacts": str(self.run.artifacts) if self.run is not None else None,
            "notes": list(self.notes), "plan": self.plan.to_json(),
        }


def resolve_group(inventory: Path, group: str, *, artifacts_dir: Path, forks: int,
                  on_event: Callable[[PlaybookEvent], None] | None = None
                  ) -> tuple[list[InventoryHost], dict[str, Node]]:
    """The group's hosts in order and each one's node model; an error naming every host that gave none."""
    from npuops.fleet.facts import collect_node_models

    hosts = read_inventory_group(inventory, group)
    facts = collect_node_models(inventory=inventory, artifacts_dir=artifacts_dir, limit=group, forks=forks,
                                on_event=on_event)
    bad = [f"{name}: {h.status} ({h.message}; fix: {h.fix})" for name, h in facts.hosts.items() if h.node is None]
    if bad:
        raise EnvironmentMissingError("cannot read the node model of " + "; ".join(bad),
                                      "fix those hosts (or take them out of the group) and launch again")
    nodes = facts.nodes()
    missing = [h.name for h in hosts if h.name not in nodes]
    if missing:
        raise EnvironmentMissingError(f"no node model came back from {', '.join(missing)}",
                                      "check the hosts with `npuops node -i INVENTORY --limit GROUP`")
    return hosts, nodes


def stage_files(parts: Sequence[HostPart], staging: Path) -> dict[str, list[dict[str, str]]]:
    """Write every host's files into a private staging directory; the playbook's copy manifest."""
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True, mode=0o700)
    manifest: dict[str, list[dict[str, str]]] = {}
    for part in parts:
        directory = staging / part.host.name
        directory.mkdir(mode=0o700)
        entries = []
        for index, placed in enumerate(part.files):
            source = directory / f"{index:02d}-{placed.path.name}"
            # 0600 here whatever the target mode: env files may hold the API key.
            fd = os.open(source, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(placed.text)
            entries.append({"src": str(source), "dest": str(placed.path), "mode": f"{placed.mode:04o}"})
        manifest[part.host.name] = entries
    return manifest


def network_peers(parts: Sequence[HostPart], hosts: Sequence[InventoryHost],
                  nodes: Mapping[str, Node]) -> dict[str, str]:
    """Each host's `npuops doctor --peers` JSON for the launch's network check: the fleet doctor's peers, but at the
    serving addresses (the ones HCCL and Gloo will use) and from each host's serving interface. Pure."""
    from npuops.fleet.doctor import build_peers

    serving = {p.host.name: p.host for p in parts}
    members = [replace(h, address=serving[h.name].address) for h in hosts if h.name in serving]
    peers = build_peers(members, nodes)
    return {name: json.dumps({**value, "ifname": serving[name].ifname}, separators=(",", ":"))
            for name, value in peers.items()}


def launch_extravars(name: str, group: str, parts: Sequence[HostPart], manifest: Mapping[str, Any], *,
                     service_user: str, cluster_wait_s: int, ready_wait_s: int,
                     peers: Mapping[str, str] | None = None, strategy: str | None = None) -> dict[str, Any]:
    first = parts[0]
    return {
        "npuops_peers": dict(peers or {}),
        "npuops_group": group,
        "npuops_instance": name,
        "npuops_first_host": first.host.name,
        "npuops_strategy": strategy or (first.record.cluster.strategy if first.record.cluster is not None else None),
        "npuops_files": dict(manifest),
        "npuops_units": {p.host.name: list(p.units) for p in parts},
        "npuops_engine_unit": first.record.unit,
        "npuops_service_user": service_user,
        "npuops_cluster_wait_s": cluster_wait_s,
        "npuops_ready_wait_s": ready_wait_s,
    }


def render_group(plan: Plan, spec: LaunchSpec, hosts: Sequence[InventoryHost], nodes: Mapping[str, Node],
                 *, group: str, ray_command: tuple[str, ...], unit_dir: Path,
                 ray_resources: Mapping[str, float] | None = None, ray_token: str | None = None) -> list[HostPart]:
    cluster_hosts = [choose_serving_interface(h, nodes[h.name]) for h in hosts]
    env_files = (ASCEND_ENV_FILE,) if plan.rules.needs_cann else ()
    return render_cluster(plan, spec, cluster_hosts, group=group, ray_command=ray_command, unit_dir=unit_dir,
                          env_files=env_files, ray_resources=ray_resources, ray_token=ray_token)


def parse_ray_resources(text: str | None) -> dict[str, float] | None:
    """`--ray-node-resources '{"NPU": 8}'`: the resources each Ray node advertises. Pure."""
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        raise BadInputError(f"--ray-node-resources {text!r} is not JSON", 'write it like \'{"NPU": 8}\'') from None
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and k and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for k, v in data.items()):
        raise BadInputError("--ray-node-resources must map resource names to non-negative numbers",
                            'write it like \'{"NPU": 8}\'')
    if {"CPU", "GPU"} & set(data):
        raise BadInputError("--ray-node-resources cannot set CPU or GPU (Ray counts those itself)",
                            "name accelerator or custom resources only, e.g. NPU")
    return {k: float(v) for k, v in data.items()}


def run_group_launch(launch: GroupLaunch, inventory: Path, *, artifacts_dir: Path, forks: int, service_user: str,
                     cluster_wait_s: int, ready_wait_s: int, peers: Mapping[str, str] | None = None,
                     on_event: Callable[[PlaybookEvent], None] | None = None) -> GroupLaunch:
    assert launch.staging is not None
    manifest = stage_files(launch.parts, launch.staging)
    try:
        run = run_playbook(
            LAUNCH_GROUP_PLAYBOOK, inventory=inventory, artifacts_dir=artifacts_dir, limit=launch.group,
            extravars=launch_extravars(launch.name, launch.group, launch.parts, manifest, service_user=service_user,
                                       cluster_wait_s=cluster_wait_s, ready_wait_s=ready_wait_s, peers=peers,
                                       # A PD instance starts as replicas do: every host's engines, then the router.
                                       strategy="replicas" if launch.strategy == "pd" else launch.strategy),
            forks=forks, on_event=on_event)
    finally:
        # The staged env files may hold the API key: nothing is left behind on the controller.
        shutil.rmtree(launch.staging, ignore_errors=True)
    launch.run = run
    first = run.hosts.get(launch.parts[0].host.name)
    status = first.data.get("npuops_status") if first is not None else None
    try:
        launch.endpoint_status = InstanceStatus.from_json(status) if status else None
    except WireFormatError:
        # Not a status (the playbook read an empty or foreign answer): the launch reports no endpoint.
        launch.endpoint_status = None
    return launch


def render_group_text(launch: GroupLaunch) -> str:
    data = launch.to_json()
    lines = [f"{launch.name}: {data['strategy']} over group {launch.group} ({len(launch.parts)} hosts)"]
    for name, host in data["hosts"].items():
        message = f": {host['message']}" if host["message"] else ""
        lines.append(f"  {name:<20} {host['role']:<9} {host['address']:<16} {', '.join(host['units'])}  "
                     f"{host['status']}{message}")
    endpoint = launch.endpoint_status
    if endpoint is not None:
        lines.append(f"endpoint: {endpoint.url} on {launch.parts[0].host.name}: {endpoint.state}")
        ray = endpoint.cluster.ray if endpoint.cluster is not None else None
        if ray is not None:
            lines.append(f"ray: {ray.describe()}")
    for note in launch.notes:
        lines.append(f"note: {note}")
    if launch.run is not None:
        for error in launch.run.errors:
            lines.append(f"ansible: {error}")
        lines.append(("launched" if launch.ok else "NOT launched") + f"; artifacts in {launch.run.artifacts}")
    return "\n".join(lines)


def dump_parts(parts: Sequence[HostPart], output: Path) -> dict[str, list[str]]:
    """--dry-run: every host's files under OUTPUT/<host>/ (paths on the host kept in a manifest)."""
    from npuops.atomic import write_text_atomic

    written: dict[str, list[str]] = {}
    for part in parts:
        paths = []
        for placed in part.files:
            target = output / part.host.name / placed.path.name
            write_text_atomic(target, placed.text, mode=placed.mode)
            paths.append(str(target))
        manifest = {"host": part.host.name, "role": part.role, "units": list(part.units),
                    "files": {Path(p).name: str(f.path) for p, f in zip(paths, part.files, strict=True)}}
        write_text_atomic(output / part.host.name / "manifest.json", json.dumps(manifest, indent=2) + "\n",
                          mode=0o644)
        written[part.host.name] = paths
    return written


@dataclass(frozen=True)
class GroupChoices:
    """Where and how a group instance is launched (`npuops launch -i INVENTORY --group GROUP`)."""

    inventory: Path
    group: str
    artifacts_dir: Path
    forks: int = 10
    cluster_wait_s: int = 300
    ray_node_resources: Mapping[str, float] | None = None


def prepare_group(settings: Settings, request: PlanRequest, choices: LaunchChoices, group: GroupChoices, *,
                  on_event: Callable[[PlaybookEvent], None] | None = None, served_name: str | None = None
                  ) -> tuple[GroupLaunch, list[InventoryHost], dict[str, Node]]:
    """Plan the group's instance from its hosts' own node models and render every host's files; nothing starts.
    Returns the launch with its parts, the hosts in order and their node models (for the network check).
    `served_name`: the name the model is served under (a rollout keeps the one clients use)."""
    hosts, nodes = resolve_group(group.inventory, group.group, artifacts_dir=group.artifacts_dir, forks=group.forks,
                                 on_event=on_event)
    ordered = {h.name: nodes[h.name] for h in hosts}
    if request.hardware.strip().lower() == "auto":
        check_same_hardware(ordered)
    first = ordered[hosts[0].name]
    if request.pd is not None:
        launch = _prepare_pd_group(settings, request, choices, group, hosts, ordered)
        return launch, hosts, ordered
    replicas = request.multinode == "replicas"
    # Replicas behind a router: every host serves the one-node plan; otherwise one plan over all the hosts.
    sized = replace(request, nodes=1, multinode="auto") if replicas else replace(request, nodes=len(hosts))
    plan = plan_request(settings, sized, target=resolve_target(settings, sized, node=first, host=first.host))
    require_draft_on_disk(plan.speculative)
    if served_name:
        plan = replace(plan, server=replace(plan.server, served_model_name=served_name))
    if plan.cluster is None and not replicas:
        raise UsageError(f"the plan for {plan.model.served_name} uses one node of the group",
                         "launch it on one host without -i, or ask for --multinode dp/ray/replicas")
    api_key = read_api_key_file(choices.api_key_file) if choices.api_key_file else None
    vllm = vllm_executable(settings, choices.vllm)
    spec = LaunchSpec(
        name=choices.name, host=choices.host, port=choices.port, api_key=api_key, service_user=choices.service_user,
        vllm_command=(vllm, "serve"),
        npuops_command=(str(hosts[0].vars.get("npuops_command") or settings.venv / "bin" / "npuops"),),
        state_dir=settings.state_dir, service_data_root=settings.service_data_root, manager=MANAGER_SYSTEMD,
        start_timeout_s=choices.start_timeout_s, watchdog_s=choices.watchdog_s, extra_env=dict(choices.extra_env))
    if replicas:
        router = plan.router or RouterOptions(policy=request.router_policy or DEFAULT_POLICY)
        serving = [choose_serving_interface(h, ordered[h.name]) for h in hosts]
        parts = render_replica_group(plan, router, spec, serving, unit_dir=settings.unit_dir,
                                     env_files=(ASCEND_ENV_FILE,) if plan.rules.needs_cann else ())
    else:
        # A new token per launch: Ray's token authentication, so only the group's own processes join the cluster.
        parts = render_group(plan, spec, hosts, ordered, group=group.group,
                             ray_command=(str(Path(vllm).parent / "ray"),), unit_dir=settings.unit_dir,
                             ray_resources=group.ray_node_resources, ray_token=secrets.token_hex(32))
    launch = GroupLaunch(group=group.group, name=choices.name, plan=plan, parts=parts,
                         strategy="replicas" if replicas else None)
    launch.notes.extend(plan.model.notes)  # what the model directory lacks (no tokenizer files, ...)
    launch.notes.extend(note for note in (exposure_note(choices.host, api_key), choices.root_note) if note)
    return launch, hosts, ordered


def _group_spec(settings: Settings, choices: LaunchChoices, hosts: Sequence[InventoryHost]) -> LaunchSpec:
    api_key = read_api_key_file(choices.api_key_file) if choices.api_key_file else None
    return LaunchSpec(
        name=choices.name, host=choices.host, port=choices.port, api_key=api_key, service_user=choices.service_user,
        vllm_command=(vllm_executable(settings, choices.vllm), "serve"),
        npuops_command=(str(hosts[0].vars.get("npuops_command") or settings.venv / "bin" / "npuops"),),
        state_dir=settings.state_dir, service_data_root=settings.service_data_root, manager=MANAGER_SYSTEMD,
        start_timeout_s=choices.start_timeout_s, watchdog_s=choices.watchdog_s, extra_env=dict(choices.extra_env))


def _prepare_pd_group(settings: Settings, request: PlanRequest, choices: LaunchChoices, group: GroupChoices,
                      hosts: Sequence[InventoryHost], nodes: Mapping[str, Node]) -> GroupLaunch:
    """`--pd P:D` over the group: P prefill hosts, then D decode hosts, the PD router on the first."""
    first = nodes[hosts[0].name]
    sized = replace(request, nodes=1, multinode="auto")
    pd, why = plan_pd_over_hosts(settings, sized, target=resolve_target(settings, sized, node=first, host=first.host))
    spec = _group_spec(settings, choices, hosts)
    serving = [choose_serving_interface(h, nodes[h.name]) for h in hosts]
    plan = pd.decode.plan
    parts = render_pd_group(pd, spec, serving, unit_dir=settings.unit_dir,
                            env_files=(ASCEND_ENV_FILE,) if plan.rules.needs_cann else ())
    launch = GroupLaunch(group=group.group, name=choices.name, plan=plan, parts=parts, strategy="pd")
    launch.notes.extend([*plan.model.notes, why])
    if pd.connector == EXAMPLE_CONNECTOR:
        launch.notes.append(f"ExampleConnector over hosts: {pd_shared_path(pd, spec)} must be one shared file system "
                            "(NFS) on every host of the group, or the decode engines never find the prompts' KV")
    launch.notes.extend(note for note in (exposure_note(choices.host, spec.api_key), choices.root_note) if note)
    return launch


def start_group(launch: GroupLaunch, hosts: Sequence[InventoryHost], nodes: Mapping[str, Node],
                choices: LaunchChoices, group: GroupChoices, *,
                on_event: Callable[[PlaybookEvent], None] | None = None,
                origin: LaunchOrigin | None = None) -> GroupLaunch:
    """Copy every host's files and start the units in order (launch-group.yml), waiting for the endpoint.
    `origin`: what the launch was made from, kept on this controller as the group instance's next revision
    (beside the Ansible artifacts: `npuops rollout NAME -i ... --group ...` starts from it)."""
    launch.staging = group.artifacts_dir / f"staging-{launch.name}-{os.getpid()}"
    ready_wait = choices.start_timeout_s or max(p.record.timeout_start_s for p in launch.parts)
    done = run_group_launch(launch, group.inventory, artifacts_dir=group.artifacts_dir, forks=group.forks,
                            service_user=choices.service_user, cluster_wait_s=group.cluster_wait_s,
                            ready_wait_s=ready_wait, peers=network_peers(launch.parts, hosts, nodes), on_event=on_event)
    if origin is not None and done.run is not None:
        store = group_store(group.artifacts_dir, group.group)
        keep_group_revision(store, launch.name, next_revision(store, launch.name), origin,
                            str(Path(launch.plan.model.path or "").resolve()), launch.plan.server.served_model_name
                            or launch.plan.model.served_name, [p.host.name for p in launch.parts])
    return done
