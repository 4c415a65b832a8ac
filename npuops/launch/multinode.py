"""One multi-node instance rendered host by host: what each host of the serving group gets, and starts in what order.

A plan with a `cluster` (npuops.plan.cluster) becomes, for the group's hosts in inventory order:

- ray: the first host runs a Ray head unit and the engine unit (`npuops run NAME`, vllm serve
  `--distributed-executor-backend ray`, RAY_ADDRESS pointing at the head); every other host runs a Ray worker unit.
- dp: the first host runs the leader engine (the API, `--data-parallel-address` = itself); every other host runs
  a `--headless` follower engine with its `--data-parallel-start-rank`.

Every host gets its own HCCL_IF_IP / VLLM_HOST_IP (its serving address) and GLOO/TP/HCCL_SOCKET_IFNAME (the
interface holding it), and, under Ray, RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1 so Ray leaves the
device mask to vllm-ascend. Pure: the files come back as text with their absolute paths on the host.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError
from npuops.httpclient import base_url
from npuops.instance.membership import ClusterMembership, ClusterNode
from npuops.instance.record import (
    NPU_GROUP,
    RECORD_FILE,
    ROLE_ENGINE,
    ROLE_HEADLESS,
    ROLE_RAY_WORKER,
    InstanceRecord,
)
from npuops.launch.instance_files import (
    GroupRouting,
    InstanceExtras,
    LaunchSpec,
    device_allow,
    render_instances,
    render_pd_engines,
    render_pd_router,
    replica_set,
)
from npuops.plan.cluster import DP_RPC_PORT, RAY_PORT
from npuops.plan.disaggregation import DisaggregatedPlan
from npuops.plan.result import Plan
from npuops.plan.router import RouterOptions
from npuops.templating import render_template

RAY_ENV_FILE = "ray.env"


@dataclass(frozen=True)
class ClusterHost:
    """One host of the serving group: its inventory name, the address the cluster traffic uses, its interface."""

    name: str
    address: str
    ifname: str
    npu_ips: Mapping[int, str] = field(default_factory=dict)  # the inventory's NPU NIC addresses by device id


@dataclass(frozen=True)
class PlacedFile:
    path: Path  # absolute, on the host
    text: str
    mode: int


@dataclass(frozen=True)
class HostPart:
    host: ClusterHost
    rank: int
    role: str  # head | worker (ray); leader | follower (dp); router | replicas (replicas)
    record: InstanceRecord
    files: tuple[PlacedFile, ...]
    units: tuple[str, ...]  # this host's units, in start order

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host.name, "address": self.host.address, "ifname": self.host.ifname,
                "rank": self.rank, "role": self.role, "units": list(self.units),
                "files": [{"path": str(f.path), "mode": f"{f.mode:04o}"} for f in self.files]}


def node_resources(devices: Sequence[int], override: Mapping[str, float] | None) -> dict[str, float]:
    """What each Ray node advertises: Ray's accelerator resource for Ascend NPUs, one "NPU" per chip (the engine's
    placement group asks for one per worker), unless the operator says otherwise."""
    if override is not None:
        return dict(override)
    return {"NPU": float(len(devices))} if devices else {}


def ray_auth_environment(token: str) -> dict[str, str]:
    """Ray's token authentication: every node, the engine (a Ray driver) and npuops' probe present the token."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def ray_unit_name(name: str) -> str:
    return f"npuops-{name}-ray.service"


def ray_runtime_directory(name: str) -> str:
    # Ray puts unix sockets under --temp-dir/session_<date>_<pid>/sockets/: a long instance name would push
    # them past the 107-byte limit, so the directory is named by a short hash of the instance name.
    return "npuops-ray-" + hashlib.sha256(name.encode()).hexdigest()[:8]


def host_environment(host: ClusterHost, *, ray: bool) -> dict[str, str]:
    """The per-host variables HCCL, Gloo and vLLM need to find each other (vllm-ascend tutorial features/ray.md)."""
    env = {
        "HCCL_IF_IP": host.address,
        "VLLM_HOST_IP": host.address,
        "GLOO_SOCKET_IFNAME": host.ifname,
        "TP_SOCKET_IFNAME": host.ifname,
        "HCCL_SOCKET_IFNAME": host.ifname,
    }
    if ray:
        # Ray would otherwise rewrite ASCEND_RT_VISIBLE_DEVICES per actor and break vllm-ascend's own mapping.
        env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] = "1"
    return env


def _check_hosts(plan: Plan, hosts: Sequence[ClusterHost]) -> None:
    cluster = plan.cluster
    if cluster is None:
        raise BadInputError("the plan is for one node", "plan with --nodes N (the group's host count)")
    if len(hosts) != cluster.nodes:
        raise BadInputError(f"the plan uses {cluster.nodes} nodes but the group has {len(hosts)} hosts",
                            f"launch on a group of {cluster.nodes} hosts, or plan for {len(hosts)} with --nodes")
    names = [h.name for h in hosts]
    addresses = [h.address for h in hosts]
    if len(set(names)) != len(names) or len(set(addresses)) != len(addresses):
        raise BadInputError(f"the group's hosts or addresses repeat ({', '.join(addresses)})",
                            "give every host of the group its own address (ansible_host)")


def render_cluster(
    plan: Plan,
    spec: LaunchSpec,
    hosts: Sequence[ClusterHost],
    *,
    group: str,
    ray_command: tuple[str, ...],
    unit_dir: Path,
    ray_port: int = RAY_PORT,
    rpc_port: int = DP_RPC_PORT,
    env_files: tuple[Path, ...] = (),
    ray_resources: Mapping[str, float] | None = None,
    ray_token: str | None = None,
) -> list[HostPart]:
    """Every host's files and units for the plan's cluster, the first host being the head or leader.

    `ray_token`: Ray's token authentication for the cluster (RAY_AUTH_MODE=token). Without it anyone who reaches the
    head's port can run code on every node; with it the token lives only in the 0600 env files."""
    _check_hosts(plan, hosts)
    cluster = plan.cluster
    assert cluster is not None
    ray = cluster.strategy == "ray"
    head = hosts[0]
    roles = [n.role for n in cluster.node_list()]
    ray_unit = ray_unit_name(spec.name)
    ray_address = f"{head.address}:{ray_port}"
    common = ClusterMembership(
        group=group, strategy=cluster.strategy, rank=0, role="",
        nodes=tuple(ClusterNode(h.name, h.address, roles[i], h.ifname, h.npu_ips) for i, h in enumerate(hosts)),
        endpoint_host=head.name, expected_nodes=len(hosts))
    if ray:
        devices = plan.replicas[0].devices if plan.replicas and plan.target.kind == "npu" else ()
        common = replace(common, ray_unit=ray_unit, ray_address=ray_address, ray_command=tuple(ray_command),
                         ray_resources=node_resources(devices, ray_resources),
                         # Where the token is (the file, never the token): `npuops status` reads it as root.
                         ray_auth="token" if ray_token else "none",
                         ray_env_file=str(spec.state_dir / spec.name / RAY_ENV_FILE))
    parts = []
    for rank, host in enumerate(hosts):
        env = host_environment(host, ray=ray)
        if ray and ray_token:
            env.update(ray_auth_environment(ray_token))
        membership = replace(common, rank=rank, role=roles[rank])
        if ray:
            parts.append(_ray_part(plan, spec, host, rank, roles[rank], env, membership, unit_dir, ray_command,
                                   ray_port, ray_address, env_files, ray_resources))
        else:
            changes = cluster.node_changes(rank, leader_address=head.address, rpc_port=rpc_port)
            extras = InstanceExtras(server_changes=changes, environment=env,
                                    role=ROLE_ENGINE if rank == 0 else ROLE_HEADLESS, cluster=membership,
                                    env_files=env_files)
            # Followers serve no API: the key stays on the leader only.
            instance = render_instances(plan, spec if rank == 0 else replace(spec, api_key=None), extras)[0]
            parts.append(HostPart(host, rank, roles[rank], instance.record,
                                  _placed(instance.record, instance.files, unit_dir), (instance.unit_name,)))
    return parts


def _placed(record: InstanceRecord, files: Sequence[Any], unit_dir: Path) -> tuple[PlacedFile, ...]:
    """Units go to the unit directory, everything else to the instance's directory."""
    out = []
    for f in files:
        directory = unit_dir if f.name.endswith(".service") else record.directory
        out.append(PlacedFile(directory / f.name, f.text, f.mode))
    return tuple(out)


def _ray_part(plan: Plan, spec: LaunchSpec, host: ClusterHost, rank: int, role: str, env: dict[str, str],
              membership: ClusterMembership, unit_dir: Path, ray_command: tuple[str, ...], ray_port: int,
              ray_address: str, env_files: tuple[Path, ...],
              ray_resources: Mapping[str, float] | None) -> HostPart:
    ray_unit = ray_unit_name(spec.name)
    # The engine unit on the head: the plan's files, pointed at the local Ray node.
    engine_env = {**env, "RAY_ADDRESS": ray_address}
    extras = InstanceExtras(environment=engine_env, role=ROLE_ENGINE, cluster=membership, requires_units=(ray_unit,),
                            env_files=env_files)
    instance = render_instances(plan, spec, extras)[0]
    record = instance.record
    # The Ray node's environment: what the engine's workers (Ray actors it starts) need, without the API key.
    node_env = {k: v for k, v in instance.environment.items() if k not in ("VLLM_API_KEY", "RAY_ADDRESS")}
    if rank == 0:
        # Stopped, a Ray head first tries to drain itself through its own control store, which is going away with
        # it: 30 s of "Timed out while waiting for GCS" by default, for nothing (the engine stopped before it).
        node_env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    runtime = ray_runtime_directory(spec.name)
    state_directory = f"npuops-{spec.name}-ray"
    argv = [*ray_command, "start", "--block", "--node-ip-address", host.address, "--temp-dir", f"/run/{runtime}",
            "--disable-usage-stats"]
    if rank == 0:
        argv += ["--head", "--port", str(ray_port), "--include-dashboard=false"]
    else:
        argv += ["--address", ray_address]
    devices = list(record.devices)
    resources = node_resources(devices, ray_resources)
    if resources:
        argv += ["--resources", json.dumps(resources, separators=(",", ":"))]
    ray_env_path = record.directory / RAY_ENV_FILE
    data_dir = spec.service_data_root / state_directory
    unit_text = render_template("ray-node.service.j2", {
        "name": spec.name,
        "role": "head" if rank == 0 else "worker",
        "served_model_name": record.served_model_name,
        "ray_port": ray_port,
        "service_user": spec.service_user,
        "service_group": spec.service_user,
        "supplementary_groups": [NPU_GROUP] if devices else [],
        "env_file": ray_env_path,
        "extra_env_files": list(env_files),
        "working_directory": data_dir,
        "exec_start": argv,
        "runtime_directory": runtime,
        "state_directory": state_directory,
        "read_write_paths": [] if spec.service_data_root == Path("/var/lib") else [data_dir],
        "device_allow": device_allow(tuple(devices)),
    })
    ray_env_text = render_template("service.env.j2", {"name": f"{spec.name} (Ray node)", "environment": node_env})
    ray_files = (PlacedFile(ray_env_path, ray_env_text, 0o600), PlacedFile(unit_dir / ray_unit, unit_text, 0o644))
    if rank == 0:
        files = _placed(record, instance.files, unit_dir) + ray_files
        return HostPart(host, rank, role, record, files, (ray_unit, instance.unit_name))
    worker = replace(record, role=ROLE_RAY_WORKER, unit=ray_unit, cluster=membership, api_key=False)
    record_file = PlacedFile(record.directory / RECORD_FILE, json.dumps(worker.to_json(), indent=2) + "\n", 0o644)
    return HostPart(host, rank, role, worker, (record_file, *ray_files), (ray_unit,))



def render_replica_group(plan: Plan, router: RouterOptions, spec: LaunchSpec, hosts: Sequence[ClusterHost], *,
                         unit_dir: Path, env_files: tuple[Path, ...] = ()) -> list[HostPart]:
    """`--multinode replicas`: every host runs the one-node plan's replicas on its serving address, the first host
    also the router in front of all of them (on the instance's --host/--port). Pure."""
    names = [h.name for h in hosts]
    addresses = [h.address for h in hosts]
    if len(set(names)) != len(names) or len(set(addresses)) != len(addresses):
        raise BadInputError(f"the group's hosts or addresses repeat ({', '.join(addresses)})",
                            "give every host of the group its own address (ansible_host)")
    per_host = len(plan.replicas) or 1
    backends = tuple(base_url(h.address, spec.port + 1 + i) for h in hosts for i in range(per_host))
    parts = []
    for rank, host in enumerate(hosts):
        routing = GroupRouting(router, host.address, backends if rank == 0 else None)
        instances = render_instances(plan, spec, InstanceExtras(env_files=env_files), routing)
        files = tuple(f for i in instances for f in _placed(i.record, i.files, unit_dir))
        parts.append(HostPart(host, rank, "router" if rank == 0 else "replicas", instances[-1].record, files,
                              tuple(i.unit_name for i in instances if i.unit_name)))
    return parts


def render_pd_group(pd: DisaggregatedPlan, spec: LaunchSpec, hosts: Sequence[ClusterHost], *, unit_dir: Path,
                    env_files: tuple[Path, ...] = ()) -> list[HostPart]:
    """`launch --pd P:D -i INVENTORY --group GROUP`: the first P hosts run the prefill pool's engines, the next D
    the decode pool's, each on its serving address on the ports after --port; the first host also runs vllm-router
    in PD mode in front of all of them. Pure."""
    wanted = pd.shape.prefill + pd.shape.decode
    if len(hosts) != wanted:
        raise BadInputError(f"--pd {pd.shape} over a group runs one pool per host: {wanted} hosts, but the group "
                            f"has {len(hosts)}",
                            f"use --pd P:D with P + D = {len(hosts)} (the first P hosts prefill, the rest decode)")
    addresses = [h.address for h in hosts]
    if len(set(addresses)) != len(addresses):
        raise BadInputError(f"the group's hosts or addresses repeat ({', '.join(addresses)})",
                            "give every host of the group its own address (ansible_host)")
    engines_of: list[list[Any]] = []
    for rank, host in enumerate(hosts):
        pool = pd.prefill if rank < pd.shape.prefill else pd.decode
        host_index = rank if rank < pd.shape.prefill else rank - pd.shape.prefill
        # The address a connector gives its peers (vLLM's get_ip(): VLLM_HOST_IP before the default route's).
        extras = InstanceExtras(env_files=env_files, environment={"VLLM_HOST_IP": host.address})
        engines_of.append(render_pd_engines(pd, spec, pool, address=host.address, first_port=spec.port + 1,
                                            host_index=host_index, extras=extras))
    urls: dict[str, list[str]] = {"prefill": [], "decode": []}
    for engines in engines_of:
        for engine in engines:
            urls[str(engine.record.pd_role)].append(base_url(engine.record.host, engine.record.port))
    parts = []
    for rank, (host, engines) in enumerate(zip(hosts, engines_of, strict=True)):
        records = [e.record for e in engines]
        own = (render_pd_router(pd, spec, records, tuple(urls["prefill"]), tuple(urls["decode"])) if rank == 0
               else replica_set(spec, records, host.address))
        instances = [*engines, own]
        files = tuple(f for i in instances for f in _placed(i.record, i.files, unit_dir))
        parts.append(HostPart(host, rank, "router" if rank == 0 else "replicas", own.record, files,
                              tuple(i.unit_name for i in instances if i.unit_name)))
    return parts
