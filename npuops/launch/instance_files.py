"""From a plan and the operator's launch choices to the files of each instance (one per replica)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from npuops.atomic import write_files_as_one_set
from npuops.errors import BadInputError
from npuops.hardware.host import CONTROL_DEVICE_NODES
from npuops.httpclient import base_url
from npuops.instance.membership import ClusterMembership
from npuops.instance.record import (
    CONFIG_FILE,
    ENV_FILE,
    FILE_MODES,
    MANAGER_FOREGROUND,
    MANAGER_SYSTEMD,
    PROFILES_DIR,
    RECORD_FILE,
    ROLE_ENGINE,
    ROLE_REPLICAS,
    ROLE_ROUTER,
    ROUTER_CONFIG_FILE,
    ROUTER_UNIT_SUFFIX,
    STATUS_FILE,
    UNIT_SUFFIX,
    InstanceRecord,
    service_status_dir,
    validate_instance_name,
)
from npuops.plan.disaggregation import EXAMPLE_CONNECTOR, DisaggregatedPlan, PdPool
from npuops.plan.result import Plan
from npuops.plan.router import DEFAULT_POLICY, RouterOptions
from npuops.plan.rules import Replica
from npuops.plan.server_options import ServerOptions
from npuops.settings import DEFAULT_VENV
from npuops.templating import env_quote, render_template

SERVICE_USER = "npuops"
# What a router unit's supervisor runs with the serving venv's interpreter (npuops is installed there too).
ROUTER_MODULE = "npuops.service.router_process"
# The driver's group: members may open /dev/davinci* (provisioning creates it, as Huawei's ascend-deployer does).
# Weight loading reads at a few hundred MB/s from local disk on Atlas servers; graph capture adds minutes.
_LOAD_BYTES_PER_S = 200 * 1024 * 1024
_BASE_START_S = 300
_GRAPH_CAPTURE_S = 300


# A hung engine is restarted after this long without an answer from /health (WatchdogSec=).
DEFAULT_WATCHDOG_S = 60
DEFAULT_STOP_TIMEOUT_S = 60


@dataclass(frozen=True)
class RenderedFile:
    name: str
    text: str
    mode: int


@dataclass(frozen=True)
class InstanceFiles:
    """What one instance's part on a host is made of: its files (the unit among them) and its record."""

    name: str
    files: tuple[RenderedFile, ...]
    unit_name: str
    record: InstanceRecord
    environment: dict[str, str] = field(default_factory=dict)  # what the env file holds (it may hold the API key)

    def file(self, name: str) -> RenderedFile:
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(name)


def write_instance_files(directory: Path, files: InstanceFiles) -> list[Path]:
    """Write the instance's files as one set (all to temporaries, then renamed; an error, SIGINT or SIGTERM
    before that leaves the old set whole and no temporary behind); returns the paths written."""
    return write_files_as_one_set([(directory / f.name, f.text, f.mode) for f in files.files])


@dataclass(frozen=True)
class LaunchSpec:
    name: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    service_user: str = SERVICE_USER
    vllm_command: tuple[str, ...] = (str(DEFAULT_VENV / "bin" / "vllm"), "serve")
    # The npuops the unit runs as its supervisor (`npuops run NAME`) and start gate.
    npuops_command: tuple[str, ...] = (str(DEFAULT_VENV / "bin" / "npuops"),)
    state_dir: Path = Path("/etc/npuops")
    service_data_root: Path = Path("/var/lib")
    ascend_env: dict[str, str] = field(default_factory=dict)
    manager: str = MANAGER_SYSTEMD  # or MANAGER_FOREGROUND: the supervisor runs in a terminal, no unit
    start_timeout_s: int | None = None  # None: from the plan (model size, graph capture)
    watchdog_s: int = DEFAULT_WATCHDOG_S
    stop_timeout_s: int = DEFAULT_STOP_TIMEOUT_S
    # The operator's own variables (`launch --env KEY=VALUE`), laid over everything npuops sets but the API key.
    extra_env: dict[str, str] = field(default_factory=dict)
    profiling: bool = False  # `launch --profiling`: vLLM's profiler, its traces under the status directory


@dataclass(frozen=True)
class InstanceExtras:
    """What one host of a multi-node instance adds to the plan's files (npuops.launch.cluster renders these)."""

    # The ServerOptions fields this host changes (ClusterPlan.node_changes: data-parallel ranks, --headless).
    server_changes: Mapping[str, Any] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)  # per-host: HCCL_IF_IP, *_SOCKET_IFNAME, RAY_ADDRESS
    role: str = ROLE_ENGINE
    cluster: ClusterMembership | None = None
    requires_units: tuple[str, ...] = ()  # units the engine unit needs running first (the host's Ray node)
    env_files: tuple[Path, ...] = ()  # read before the instance's own env file (the host's CANN environment)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by npuops itself from other options; an --env of these would be silently contradicted.
_RESERVED_ENV = frozenset({"VLLM_API_KEY", "HF_HUB_OFFLINE"})


def parse_env_assignments(items: Sequence[str]) -> dict[str, str]:
    """`KEY=VALUE` strings (launch --env) to a dict; a bad name or a reserved one is refused. Pure."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.fullmatch(key):
            raise BadInputError(f"--env {item!r} is not KEY=VALUE", "write it like --env HCCL_CONNECT_TIMEOUT=1200")
        if key in _RESERVED_ENV:
            raise BadInputError(f"--env {key} is set by npuops", "use --api-key-file for the key; models are local")
        env_quote(value, f"--env {key}: the value")  # refuses a control character (a newline would add a line)
        out[key] = value
    return out


def timeout_start_sec(plan: Plan) -> int:
    weights = plan.model.weight_bytes or plan.memory.weights_bytes
    graph = 0 if plan.server.enforce_eager else _GRAPH_CAPTURE_S
    return int(_BASE_START_S + graph + weights / _LOAD_BYTES_PER_S)


def _model_argument(plan: Plan) -> str:
    if plan.model.path is None:
        raise BadInputError(f"{plan.model.served_name!r} is a catalog name, not a model directory",
                            "download the weights and pass the directory to launch (plan works with either)")
    if plan.model.launch_problems:  # what the engine would fail on minutes in (config.json), refused now
        problem, fix = plan.model.launch_problems[0]
        raise BadInputError(problem, fix)
    # The unit runs in its own working directory: a path relative to the operator's shell would break there.
    return str(Path(plan.model.path).resolve())


def _environment(plan: Plan, spec: LaunchSpec, extras: InstanceExtras, replica: Replica | None) -> dict[str, str]:
    """The env file's variables, in the order they override each other."""
    environment: dict[str, str] = {}
    environment.update(spec.ascend_env)
    environment.update(plan.env)
    if replica is not None and replica.devices:
        environment["ASCEND_RT_VISIBLE_DEVICES"] = replica.visible_devices
    if replica is not None and replica.cpus:
        # Engines sharing a CPU host each get their own cores (vLLM's CPU engine binds its OpenMP threads there).
        environment["VLLM_CPU_OMP_THREADS_BIND"] = replica.cpus
    environment.update(extras.environment)
    environment.update(spec.extra_env)
    # A local model directory: never reach for a hub from a production node.
    environment["HF_HUB_OFFLINE"] = "1"
    if spec.api_key:
        environment["VLLM_API_KEY"] = spec.api_key
    return environment


def device_allow(devices: tuple[int, ...]) -> list[str]:
    """The device nodes a unit may open: its chips' /dev/davinciN and the driver's control nodes."""
    if not devices:
        return []
    return [f"/dev/davinci{d}" for d in devices] + [f"/dev/{n}" for n in CONTROL_DEVICE_NODES]


def _unit_variables(record: InstanceRecord, spec: LaunchSpec, extras: InstanceExtras) -> dict[str, Any]:
    state_directory = f"npuops-{record.name}"
    data_dir = spec.service_data_root / state_directory
    npuops_state = ["--state-dir", str(spec.state_dir)]
    return {
        "name": record.name,
        "served_model_name": record.served_model_name,
        "service_user": spec.service_user,
        "service_group": spec.service_user,
        "supplementary_groups": list(record.supplementary_groups),
        "env_file": record.env_file,
        "working_directory": data_dir,
        # The gate runs with full privileges ("+"): npu-smi and the process table need them; it only reads.
        "exec_start_pre": [*spec.npuops_command, "run", *npuops_state, "--preflight", record.name],
        "exec_start": [*spec.npuops_command, "run", *npuops_state, record.name],
        "watchdog_sec": spec.watchdog_s,
        # The supervisor gives up on a start itself (with a diagnosis) before systemd would.
        "timeout_start_sec": record.timeout_start_s + 60,
        # Above the supervisor's own wait (the drain and the engine's exit): systemd kills only what is left.
        "timeout_stop_sec": record.stop_timeout_s + 15,
        "state_directory": state_directory,
        "read_write_paths": [] if spec.service_data_root == Path("/var/lib") else [data_dir],
        "device_allow": device_allow(record.devices),
        "requires_units": list(extras.requires_units),
        "wants_units": [],
        "role": record.role,
        "extra_env_files": list(extras.env_files),
        # A disaggregated instance's prefill and decode engines share their KV directory (the CPU engine's
        # ExampleConnector): one more state directory, the same in every unit of the instance.
        "extra_state_directories": [Path(record.kv_shared_path).name] if record.kv_shared_path else [],
    }


def _draft_directory(server: ServerOptions) -> str | None:
    """The draft model's directory when speculative_config names one (a hub id is not a path)."""
    draft = (server.speculative_config or {}).get("model")
    return str(draft) if isinstance(draft, str) and draft.startswith("/") else None


def _status_dir(spec: LaunchSpec, name: str) -> Path:
    """Where the supervisor keeps its state: the unit's StateDirectory, or the instance directory in a terminal."""
    if spec.manager == MANAGER_FOREGROUND:
        return spec.state_dir / name
    return service_status_dir(spec.service_data_root, name)  # what a record read is held to (record.py)




def _profiler_config(spec: LaunchSpec, name: str) -> dict[str, Any] | None:
    """vLLM's torch profiler with its traces in the status directory (the unit may write there), for `npuops
    profile`: gzip'd, without Python stacks, and only the engine's side (the API server's profiler cannot stop
    after a number of steps, and records the whole range): `profile --steps` bounds what a trace holds."""
    if not spec.profiling:
        return None
    return {"profiler": "torch", "torch_profiler_dir": str(_status_dir(spec, name) / PROFILES_DIR),
            "torch_profiler_with_stack": False, "ignore_frontend": True}


def _record(plan: Plan, spec: LaunchSpec, extras: InstanceExtras, server: ServerOptions, name: str,
            devices: tuple[int, ...]) -> InstanceRecord:
    instance_dir = spec.state_dir / name
    status_file = _status_dir(spec, name) / STATUS_FILE
    return InstanceRecord(
        name=name, manager=spec.manager, unit=f"npuops-{name}{UNIT_SUFFIX}", model_path=str(server.model),
        served_model_name=str(server.served_model_name), host=str(server.host or spec.host),
        port=int(server.port or spec.port),
        devices=devices, target_kind=plan.target.kind, hardware_label=plan.target.label,
        vllm_command=tuple(spec.vllm_command), instance_dir=str(instance_dir), status_file=str(status_file),
        timeout_start_s=spec.start_timeout_s or timeout_start_sec(plan), watchdog_s=spec.watchdog_s,
        # A stop first waits for the engine's drain (vLLM's --shutdown-timeout), then for its own exit.
        stop_timeout_s=spec.stop_timeout_s + int(server.shutdown_timeout or 0),
        gpu_memory_utilization=float(server.gpu_memory_utilization or 0.9),
        graph_mode=not server.enforce_eager, api_key=bool(spec.api_key), dtype=str(server.dtype or ""),
        stream_interval=int(server.stream_interval or 1), prediction=dict(plan.prediction.as_dict()),
        perf_inputs=plan.perf.to_json(), role=extras.role,
        cluster=extras.cluster, draft_model_path=_draft_directory(server),
        service_user=spec.service_user if spec.manager == MANAGER_SYSTEMD else None,
        supervisor_command=tuple(spec.npuops_command) if spec.manager == MANAGER_SYSTEMD else ())


def _render_files(record: InstanceRecord, spec: LaunchSpec, config: RenderedFile, environment: dict[str, str],
                  unit_variables: dict[str, Any]) -> InstanceFiles:
    files: tuple[RenderedFile, ...] = (
        config,
        RenderedFile(ENV_FILE, render_template("service.env.j2", {"name": record.name, "environment": environment}),
                     FILE_MODES[ENV_FILE]),
        RenderedFile(RECORD_FILE, json.dumps(record.to_json(), indent=2) + "\n", 0o644),
    )
    if spec.manager == MANAGER_SYSTEMD:
        files += (RenderedFile(record.unit, render_template("vllm.service.j2", unit_variables), 0o644),)
    return InstanceFiles(record.name, files, record.unit, record, environment)


def replica_name(instance: str, index: int) -> str:
    """Replica N of a model behind a router (or of independent replicas): NAME-rN."""
    return f"{instance}-r{index}"


@dataclass(frozen=True)
class GroupRouting:
    """One host's part of a model served by replicas on every host of a group behind one router on the first host
    (`launch -i INVENTORY --group GROUP --multinode replicas`)."""

    router: RouterOptions
    replica_host: str  # the replicas bind the host's serving address: the router reaches them across hosts
    backends: tuple[str, ...] | None = None  # on the router's host: every host's replica URLs; None elsewhere


def render_instances(plan: Plan, spec: LaunchSpec, extras: InstanceExtras | None = None,
                     routing: GroupRouting | None = None) -> list[InstanceFiles]:
    """Files for each replica of the plan: a vLLM config, an environment file, the record and a systemd unit; with
    several replicas on this node, the router in front of them too (last: it starts once they answer).

    `extras` makes them one host's part of a multi-node instance (one replica: the plan is the cluster's);
    `routing` one host's replicas of a group behind a router (the router itself on the first host)."""
    extras = extras or InstanceExtras()
    validate_instance_name(spec.name)
    replicas: tuple[Replica | None, ...] = plan.replicas or (None,)
    routed = routing is not None or plan.router is not None
    # Behind a router the replicas take the ports after the router's, then the router's metrics port.
    last_port = spec.port + len(replicas) + (1 if routed else -1)
    if not 1 <= spec.port <= 65535:
        raise BadInputError(f"port {spec.port} is out of range", "choose a port between 1024 and 65535")
    if last_port > 65535:
        what = f"{len(replicas)} replicas" + (" and the router's metrics" if routed else "")
        raise BadInputError(f"--port {spec.port}: the ports of {what} run to {last_port}, past 65535",
                            f"choose --port {65535 - (last_port - spec.port)} or lower")
    instances = []
    for index, replica in enumerate(replicas):
        name = replica_name(spec.name, index) if routed or len(replicas) > 1 else spec.name
        # Behind a router only the router is reached from outside: the replicas listen on loopback (on the host's
        # serving address when the router is on another host).
        replica_host = routing.replica_host if routing is not None else "127.0.0.1"
        instances.append(_render_engine(plan, spec, extras, replica, name=name,
                                        host=replica_host if routed else spec.host,
                                        port=spec.port + index + (1 if routed else 0),
                                        behind=spec.name if routed else None))
    records = [i.record for i in instances]
    if routing is None and routed:
        assert plan.router is not None
        instances.append(_render_router(plan.router, spec, records,
                                        tuple(base_url(r.host, r.port) for r in records)))
    elif routing is not None and routing.backends is not None:
        instances.append(_render_router(routing.router, spec, records, routing.backends))
    elif routing is not None:
        instances.append(replica_set(spec, records, routing.replica_host))
    return instances


def _render_engine(plan: Plan, spec: LaunchSpec, extras: InstanceExtras, replica: Replica | None, *, name: str,
                   host: str, port: int, behind: str | None) -> InstanceFiles:
    """One engine's files: the plan's options with this engine's model path, address and port."""
    server = replace(plan.server, model=_model_argument(plan), host=host, port=port,
                     profiler_config=_profiler_config(spec, name), **extras.server_changes)
    record = _record(plan, spec, extras, server, name, replica.devices if replica is not None else ())
    if server.profiler_config is not None:
        record = replace(record, profiler_dir=str(server.profiler_config["torch_profiler_dir"]))
    if behind is not None:
        record = replace(record, behind=behind)
    config = RenderedFile(CONFIG_FILE, render_template("vllm-config.yaml.j2", {
        "name": name, "serve_options": server.config_file(), "hardware_label": plan.target.label}),
        FILE_MODES[CONFIG_FILE])
    return _render_files(record, spec, config, _environment(plan, spec, extras, replica),
                         _unit_variables(record, spec, extras))


def render_surge_replica(plan: Plan, spec: LaunchSpec, replica: Replica, *, name: str, port: int) -> InstanceFiles:
    """One more replica of a routed instance's plan, on its own name, port and devices, behind the instance's
    router: the temporary replica `rollout --surge` serves on while the others switch."""
    validate_instance_name(name)
    return _render_engine(plan, spec, InstanceExtras(), replica, name=name, host="127.0.0.1", port=port,
                          behind=spec.name)


def replica_set(spec: LaunchSpec, replicas: Sequence[InstanceRecord], host: str) -> InstanceFiles:
    """This host's record of the instance when the router is on another host: no unit, its replicas named."""
    record = replace(replicas[0], name=spec.name, unit="", role=ROLE_REPLICAS, host=host, port=spec.port, devices=(),
                     instance_dir=str(spec.state_dir / spec.name),
                     status_file=str(spec.state_dir / spec.name / STATUS_FILE),
                     replicas=tuple(r.name for r in replicas), behind=None, pd_role=None, kv_port=None,
                     kv_port_span=0, kv_shared_path=None)
    text = json.dumps(record.to_json(), indent=2) + "\n"
    return InstanceFiles(spec.name, (RenderedFile(RECORD_FILE, text, 0o644),), "", record)


def _router_python(spec: LaunchSpec) -> str:
    """The interpreter beside the instance's vllm: the serving venv's, where vllm-router is installed."""
    return str(Path(spec.vllm_command[0]).parent / "python")


def pd_engine_name(instance: str, role: str, index: int) -> str:
    """Engine N of a disaggregated instance's prefill or decode pool: NAME-p0, NAME-d0."""
    return f"{instance}-{role[0]}{index}"


def render_pd_instances(pd: DisaggregatedPlan, spec: LaunchSpec) -> list[InstanceFiles]:
    """A disaggregated instance's files on this node: each prefill engine, each decode engine (on loopback, on the
    ports after the router's, each with its kv_transfer_config), then vllm-router in PD mode on the instance's
    address."""
    validate_instance_name(spec.name)
    engines = sum(pool.count for pool in pd.pools)
    if not 1 <= spec.port or spec.port + engines + 1 > 65535:
        raise BadInputError(f"port {spec.port} is out of range", "choose a port between 1024 and 65535")
    instances: list[InstanceFiles] = []
    for pool in pd.pools:
        instances += render_pd_engines(pd, spec, pool, address="127.0.0.1", first_port=spec.port + 1 + len(instances))
    prefill = tuple(base_url(i.record.host, i.record.port) for i in instances if i.record.pd_role == "prefill")
    decode = tuple(base_url(i.record.host, i.record.port) for i in instances if i.record.pd_role == "decode")
    instances.append(render_pd_router(pd, spec, [i.record for i in instances], prefill, decode))
    return instances


def pd_shared_path(pd: DisaggregatedPlan, spec: LaunchSpec) -> str | None:
    """The ExampleConnector's directory: the producer writes each prompt's KV there, the consumer reads it (a state
    directory of every engine's unit; over a group it must be one shared file system, e.g. NFS, on every host)."""
    return str(spec.service_data_root / f"npuops-{spec.name}-kv") if pd.connector == EXAMPLE_CONNECTOR else None


def render_pd_engines(pd: DisaggregatedPlan, spec: LaunchSpec, pool: PdPool, *, address: str, first_port: int,
                      host_index: int = 0, extras: InstanceExtras | None = None) -> list[InstanceFiles]:
    """One host's engines of a pool (`host_index`: which of the pool's hosts, over a group), on `address` from
    `first_port`, each with its kv_transfer_config, behind the instance's router."""
    extras = extras or InstanceExtras()
    shared = pd_shared_path(pd, spec)
    plan = pool.plan
    model_arg = _model_argument(plan)
    out = []
    per_host = len(plan.replicas)
    for index, replica in enumerate(plan.replicas):
        name = pd_engine_name(spec.name, pool.role, host_index * per_host + index)
        ports = pool.kv_ports[index]
        server = replace(plan.server, model=model_arg, host=address, port=first_port + index,
                         kv_transfer_config=pd.transfer_config(pool, index, shared))
        record = replace(_record(plan, spec, extras, server, name, replica.devices), behind=spec.name,
                         pd_role=pool.role, kv_connector=pd.connector,
                         kv_port=None if shared else ports.start, kv_port_span=0 if shared else len(ports),
                         kv_shared_path=shared)
        config = RenderedFile(CONFIG_FILE, render_template("vllm-config.yaml.j2", {
            "name": name, "serve_options": server.config_file(), "hardware_label": plan.target.label}),
            FILE_MODES[CONFIG_FILE])
        out.append(_render_files(record, spec, config, _environment(plan, spec, extras, replica),
                                 _unit_variables(record, spec, extras)))
    return out


def render_pd_router(pd: DisaggregatedPlan, spec: LaunchSpec, engines: Sequence[InstanceRecord],
                     prefill: tuple[str, ...], decode: tuple[str, ...]) -> InstanceFiles:
    """vllm-router in PD mode in front of every engine (`engines`: this host's, which its unit waits for)."""
    router = RouterOptions(policy=pd.colocated.options.router_policy or DEFAULT_POLICY)
    return _render_router(router, spec, engines, prefill + decode, pd_urls=(prefill, decode))


def _render_router(router: RouterOptions, spec: LaunchSpec, replicas: Sequence[InstanceRecord],
                   backends: tuple[str, ...],
                   pd_urls: tuple[tuple[str, ...], tuple[str, ...]] | None = None) -> InstanceFiles:
    """The router in front of the replicas (`backends`: their URLs, on this host and, over a group, the others'):
    on the instance's address, its unit after this host's replicas'."""
    first = replicas[0]
    name = spec.name
    data_dir = spec.service_data_root / f"npuops-{name}"
    status_dir = spec.state_dir / name if spec.manager == MANAGER_FOREGROUND else data_dir
    metrics_port = spec.port + len(replicas) + 1
    record = replace(
        first, name=name, unit=f"npuops-{name}{ROUTER_UNIT_SUFFIX}{UNIT_SUFFIX}", host=spec.host, port=spec.port,
        devices=(), role=ROLE_ROUTER, vllm_command=(_router_python(spec), "-m", ROUTER_MODULE),
        instance_dir=str(spec.state_dir / name), status_file=str(status_dir / STATUS_FILE),
        replicas=tuple(r.name for r in replicas), backends=backends, metrics_port=metrics_port, behind=None,
        pd_role=None, kv_port=None, kv_port_span=0, kv_shared_path=None)
    if pd_urls is None:
        argv = router.argv(backends, host=spec.host, port=spec.port, metrics_host="127.0.0.1",
                           metrics_port=metrics_port, startup_timeout_s=first.timeout_start_s)
        comment = f"vllm-router in front of {', '.join(backends)}"
    else:
        argv = router.argv_pd(pd_urls[0], pd_urls[1], host=spec.host, port=spec.port, metrics_host="127.0.0.1",
                              metrics_port=metrics_port, startup_timeout_s=first.timeout_start_s)
        comment = f"vllm-router in PD mode: prefill {', '.join(pd_urls[0])}, decode {', '.join(pd_urls[1])}"
    config = RenderedFile(ROUTER_CONFIG_FILE, json.dumps({
        "comment": f"{comment}, rendered by npuops (policy {router.policy}: {router.why})", "argv": argv},
        indent=2) + "\n", 0o644)
    # The router needs no model, chips or CANN: only the key it sends the replicas (VLLM_API_KEY).
    environment = {"VLLM_API_KEY": spec.api_key} if spec.api_key else {}
    variables = _unit_variables(record, spec, InstanceExtras())
    variables["wants_units"] = [r.unit for r in replicas]
    variables["role"] = ROLE_ROUTER
    return _render_files(record, spec, config, environment, variables)
