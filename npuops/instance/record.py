"""The record of one launched instance: `<state_dir>/<name>/instance.json`, beside its vllm.yaml and env file.

Launch writes it; the supervisor (`npuops run NAME`), the start gate, `status`, `stop`, `logs` and `list` read it.
It holds no secret (the API key stays in the 0600 env file), so it is world-readable like the vLLM config.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

from npuops import __version__
from npuops.atomic import write_text_atomic
from npuops.errors import BadInputError, ConfigError
from npuops.inputfiles import MIB, read_input_text
from npuops.instance.membership import ClusterMembership
from npuops.instance.state import SupervisorState
from npuops.ranges import MAX_DEVICES
from npuops.safefiles import ConfinedPath, NotRead, read_tail
from npuops.wire import WireFormatError, loads_json

# The files of one instance and their modes: the env file may hold an API key.
CONFIG_FILE = "vllm.yaml"
ENV_FILE = "env"
UNIT_SUFFIX = ".service"
FILE_MODES = {CONFIG_FILE: 0o644, ENV_FILE: 0o600}

_INSTANCE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")


def is_instance_name(name: object) -> bool:
    return isinstance(name, str) and _INSTANCE_NAME.fullmatch(name) is not None


def validate_instance_name(name: str) -> str:
    if not is_instance_name(name):  # fullmatch: `$` lets a final \n through
        raise BadInputError(f"instance name {name!r} is not usable",
                            "use 1-48 lower-case letters, digits and dashes, starting with a letter or digit")
    return name


# The group of the Ascend device nodes (the driver installer creates it); NPU units run with it.
NPU_GROUP = "HwHiAiUser"
RECORD_FILE = "instance.json"
STATUS_FILE = "supervisor.json"
ENGINE_LOG_FILE = "engine.log"
# vLLM's profiler traces (`launch --profiling`), in the status directory where the unit may write.
PROFILES_DIR = "profiles"
# An instance's revisions (npuops.instance.revisions): the history, each revision's files, a rollout in progress,
# and the mark of a replica a rollout holds out of its router.
REVISIONS_FILE = "revisions.json"
REVISIONS_DIR = "revisions"
ROLLOUT_FILE = "rollout.json"
HOLD_FILE = "rollout-hold"

MANAGER_SYSTEMD = "systemd"
MANAGER_FOREGROUND = "foreground"

# What an instance runs on its host. A single-node instance, a Ray head and a data-parallel leader are
# "engine": vllm serve with its API. A data-parallel follower is "headless": engine ranks without an API.
# A Ray worker host runs only Ray ("ray-worker"): its unit is the Ray node, the head's engine drives it.
# A model with several replicas has one "router" (vllm-router on the instance's address) in front of them.
ROLE_ENGINE = "engine"
ROLE_HEADLESS = "headless"
ROLE_RAY_WORKER = "ray-worker"
ROLE_ROUTER = "router"
# Over an inventory group (`--multinode replicas`), a host other than the router's holds only replicas: its record
# of the instance has no unit of its own and names them ("replicas").
ROLE_REPLICAS = "replicas"
ROLES = (ROLE_ENGINE, ROLE_HEADLESS, ROLE_RAY_WORKER, ROLE_ROUTER, ROLE_REPLICAS)
# The router's command line (vllm-router's options, no secret) beside its record, instead of a vllm.yaml.
ROUTER_CONFIG_FILE = "router.json"
ROUTER_UNIT_SUFFIX = "-router"
# The two pools of a disaggregated instance (`launch --pd P:D`): their engines take kv_role producer and consumer.
PD_PREFILL = "prefill"
PD_DECODE = "decode"
PD_ROLES = (PD_PREFILL, PD_DECODE)
@dataclass(frozen=True)
class InstanceRecord:
    name: str
    manager: str  # "systemd" (a unit runs `npuops run NAME`) or "foreground" (a terminal runs it)
    unit: str
    model_path: str
    served_model_name: str
    host: str
    port: int
    devices: tuple[int, ...]  # NPU device ids (ASCEND_RT_VISIBLE_DEVICES); empty on the CPU
    target_kind: str  # "npu" or "cpu"
    hardware_label: str
    vllm_command: tuple[str, ...]  # the `vllm serve` prefix, e.g. ("/opt/npuops/venv/bin/vllm", "serve")
    instance_dir: str
    status_file: str  # where the supervisor writes its state (the service's StateDirectory under systemd)
    timeout_start_s: int
    watchdog_s: int
    stop_timeout_s: int
    gpu_memory_utilization: float
    graph_mode: bool
    api_key: bool = False  # whether the env file carries VLLM_API_KEY (the key itself is never here)
    dtype: str = ""  # the dtype the engine serves in (the plan's)
    # Tokens a streaming client gets per chunk (vLLM's --stream-interval): a client's inter-chunk gap spans this many.
    stream_interval: int = 1
    prediction: dict[str, Any] = field(default_factory=dict)
    # The plan's performance-model inputs (PerfInputs.to_json): `npuops bench` predicts this configuration from them.
    perf_inputs: dict[str, Any] = field(default_factory=dict)
    role: str = ROLE_ENGINE
    # A speculative draft model's directory (speculative_config.model): the service user must read it too.
    draft_model_path: str | None = None
    # This host's part of a multi-node instance; None for a single-node one (`"cluster": {}` in the file).
    cluster: ClusterMembership | None = None
    # Who the unit runs as (its User=); None for a foreground run (whoever runs it). The gate checks as this user.
    service_user: str | None = None
    # The npuops the unit runs, its supervisor and start gate (ExecStart=, ExecStartPre=); () for a foreground run.
    supervisor_command: tuple[str, ...] = ()
    # A router: the replicas it fronts on this host (their instance names), the URLs of all it fronts, and the
    # port of its Prometheus metrics (on 127.0.0.1).
    replicas: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    metrics_port: int | None = None
    # A replica behind a router: the router instance's name (its endpoint is the model's).
    behind: str | None = None
    # Prefill/decode disaggregation: this engine's pool (PD_PREFILL or PD_DECODE; None when colocated), its KV
    # connector (vLLM's kv_connector name), the first port of its connector's handshake range and how many ports
    # from there its ranks take (one per device: vllm-ascend's Mooncake connectors listen on kv_port + rank), and
    # on the CPU engine the directory the ExampleConnector shares between the pools.
    pd_role: str | None = None
    kv_connector: str | None = None
    kv_port: int | None = None
    kv_port_span: int = 0
    kv_shared_path: str | None = None
    # The revision of the instance these files are (npuops.instance.revisions): 1 for a launch, then one more for
    # each rollout; 0 from an npuops that kept no revisions.
    revision: int = 0
    # Where vLLM's profiler writes its traces (`launch --profiling`); None: launched without it.
    profiler_dir: str | None = None
    created_at: float = field(default_factory=time.time)
    npuops_version: str = __version__

    @property
    def directory(self) -> Path:
        return Path(self.instance_dir)

    @property
    def config_file(self) -> Path:
        return self.directory / (ROUTER_CONFIG_FILE if self.is_router else CONFIG_FILE)

    @property
    def is_router(self) -> bool:
        return self.role == ROLE_ROUTER

    @property
    def is_replica_set(self) -> bool:
        return self.role == ROLE_REPLICAS

    @property
    def env_file(self) -> Path:
        return self.directory / ENV_FILE

    @property
    def engine_log(self) -> Path:
        return Path(self.status_file).parent / ENGINE_LOG_FILE

    @property
    def health_path(self) -> str:
        """Where this part says it is alive. vllm-router 0.1.17's /health answers 503 ("Unhealthy servers: [...]")
        as soon as its health checker takes one replica out, while it goes on serving the others; its /liveness
        answers 200 while the router itself serves (measured, docs/router.md). A router is judged
        by /liveness, so neither its watchdog nor status takes a restarting replica for a dead router."""
        return "/liveness" if self.is_router else "/health"

    @property
    def serves_api(self) -> bool:
        """Whether this host's part answers HTTP (/health, /v1): single instances, Ray heads, DP leaders, routers."""
        return self.role in (ROLE_ENGINE, ROLE_ROUTER)

    @property
    def runs_engine(self) -> bool:
        return self.role in (ROLE_ENGINE, ROLE_HEADLESS)

    @property
    def ray_unit(self) -> str | None:
        return (self.cluster.ray_unit or None) if self.cluster is not None else None

    @property
    def ray_cluster(self) -> ClusterMembership | None:
        """The membership of a Ray instance (None for a single-node or data-parallel one)."""
        return self.cluster if self.cluster is not None and self.cluster.is_ray else None

    @property
    def units(self) -> list[str]:
        """This host's units of the instance, in start order (Ray before the engine)."""
        units = [self.ray_unit] if self.ray_unit else []
        if self.runs_engine or self.is_router:  # a host's replica set has no unit of its own
            units.append(self.unit)
        return units

    @property
    def supplementary_groups(self) -> tuple[str, ...]:
        """The unit's SupplementaryGroups=: the NPU device nodes' group for an instance with chips."""
        return (NPU_GROUP,) if self.devices else ()

    @property
    def engine_argv(self) -> list[str]:
        """What the supervisor runs: `vllm serve MODEL --config vllm.yaml`, or for a router npuops' router process
        over its router.json (it reads the API key from its environment: nothing secret on a command line)."""
        if self.is_router:
            return [*self.vllm_command, str(self.config_file)]
        return [*self.vllm_command, self.model_path, "--config", str(self.config_file)]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["devices"] = list(self.devices)
        data["vllm_command"] = list(self.vllm_command)
        data["supervisor_command"] = list(self.supervisor_command)
        data["replicas"] = list(self.replicas)
        data["backends"] = list(self.backends)
        data["cluster"] = self.cluster.to_json() if self.cluster is not None else {}
        return data

    @classmethod
    def from_json(cls, data: object, where: str) -> InstanceRecord:
        """A record from its JSON: each field's type and range, and the names and paths launch derives from the
        instance's name (check_derived). Where it lies on this node is load_record's to check."""
        known = {f.name for f in fields(cls)}
        try:
            if not isinstance(data, dict):
                raise TypeError(f"the document is {type(data).__name__}, not an object")
            values = {k: v for k, v in data.items() if k in known}
            for f in fields(cls):
                if f.name in values and f.name != "cluster":
                    _check_field(f.name, str(f.type), values[f.name])
            for key in ("devices", "vllm_command", "supervisor_command", "replicas", "backends"):
                if not isinstance(values.get(key, []), list):
                    raise TypeError(f"{key} must be a list")
            values["devices"] = tuple(int(d) for d in values.get("devices", ()))
            values["vllm_command"] = tuple(str(a) for a in values["vllm_command"])
            for key in ("supervisor_command", "replicas", "backends"):
                values[key] = tuple(str(a) for a in values.get(key, ()))
            values["port"] = int(values["port"])
            if values.get("metrics_port") is not None:
                values["metrics_port"] = int(values["metrics_port"])
            if values.get("pd_role") not in (None, *PD_ROLES):
                raise ValueError(f"pd_role {values['pd_role']!r} is not one of {', '.join(PD_ROLES)}")
            if values.get("kv_port") is not None:
                values["kv_port"] = int(values["kv_port"])
            if values.get("role", ROLE_ENGINE) not in ROLES:
                raise ValueError(f"role {values['role']!r} is not one of {', '.join(ROLES)}")
            cluster = values.get("cluster", {})
            if not isinstance(cluster, dict):
                raise TypeError("cluster must be an object")
            values["cluster"] = ClusterMembership.from_json(cluster) if cluster else None
            record = cls(**values)
            check_derived(record)
            return record
        except WireFormatError as exc:
            raise ConfigError(f"{where} is not an npuops instance record ({exc.reason})", RECREATE) from None
        except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
            raise ConfigError(f"{where} is not an npuops instance record ({exc})", RECREATE) from None


RECREATE = "re-create it with `npuops launch` (or uninstall it: `npuops remove NAME`)"


# The ranges a record's numbers must lie in: a port beyond 65535 or a device id in the billions would break every
# command that reads the record (a socket, a range, a unit setting) far from where the bad value came from.
_PORTS = (1, 65535)
_RANGES: dict[str, tuple[float, float]] = {
    "port": _PORTS, "metrics_port": _PORTS, "kv_port": _PORTS, "kv_port_span": (0, 65535),
    "timeout_start_s": (0, 10**7), "watchdog_s": (0, 10**7), "stop_timeout_s": (0, 10**7), "revision": (0, 10**9),
    "gpu_memory_utilization": (0, 1), "devices": (0, MAX_DEVICES - 1), "created_at": (0, 10**11),
}


def _check_field(name: str, annotation: str, value: Any) -> None:
    """One field of a record read from JSON: its type as the dataclass declares it, and its range (raises
    TypeError or ValueError naming the field)."""
    kind = annotation.removesuffix(" | None")
    if value is None:
        if kind != annotation:
            return
        raise TypeError(f"{name} is null")
    items = value if kind.startswith("tuple[") else [value]
    if kind.startswith("tuple[") and not isinstance(value, list):
        raise TypeError(f"{name} must be a list")
    element = kind.removeprefix("tuple[").split(",")[0].rstrip("]")
    for item in items:
        if element == "str":
            ok = isinstance(item, str)
        elif element == "bool":
            ok = isinstance(item, bool)
        elif element in ("int", "float"):
            # An int is compared as it is: float() of a 400-digit one would raise OverflowError.
            ok = not isinstance(item, bool) and (isinstance(item, int) or (
                isinstance(item, float) and math.isfinite(item) and (element == "float" or item.is_integer())))
        elif element.startswith("dict"):
            ok = isinstance(item, dict)
        else:
            ok = True
        if not ok:
            raise TypeError(f"{name} must be {'a list of ' if kind != element else ''}{element}, not {item!r:.40}")
        low, high = _RANGES.get(name, (None, None))
        if low is not None and high is not None and not low <= item <= high:
            raise ValueError(f"{name} {item!r:.40} is outside {low:g}..{high:g}")


def record_path(state_dir: Path, name: str) -> Path:
    return state_dir / validate_instance_name(name) / RECORD_FILE


def write_record(record: InstanceRecord) -> Path:
    path = record.directory / RECORD_FILE
    write_text_atomic(path, json.dumps(record.to_json(), indent=2) + "\n", mode=0o644)
    return path


# --- what launch derives from an instance's name, and what a record read is held to -----------------------------
# A record names the files and units root acts on (stop, remove, status, logs): each must be the one launch derives
# from the instance's name, the state dir and the service data root, or the record is not used (docs/security.md).

RAY_UNIT_SUFFIX = "-ray"
SERVICE_DIR_PREFIX = "npuops-"


def unit_names(name: str) -> tuple[str, ...]:
    """The units a record of instance `name` may name: its engine's, its router's and its Ray node's."""
    return tuple(f"npuops-{name}{suffix}{UNIT_SUFFIX}" for suffix in ("", ROUTER_UNIT_SUFFIX, RAY_UNIT_SUFFIX))


def service_status_dir(data_root: Path, name: str) -> Path:
    """A unit's StateDirectory= (npuops-NAME under the service data root): its supervisor's state, engine.log and
    profiler traces. A foreground run keeps them in its instance directory."""
    return data_root / f"{SERVICE_DIR_PREFIX}{validate_instance_name(name)}"


def _no_parent_steps(what: str, path: str) -> PurePath:
    """`path` as a PurePath; a `..` in it is refused: where it leads depends on the links on the way."""
    pure = PurePath(path)
    if ".." in pure.parts:
        raise ValueError(f"{what} {path!r:.80} has a '..' in it")
    return pure


def _check_instance_name(what: str, name: str, prefix: str = "") -> None:
    if not is_instance_name(name) or not name.startswith(prefix):
        extra = f" starting with {prefix!r}" if prefix else ""
        raise ValueError(f"{what} {name!r:.60} is not an instance name{extra}")


def check_derived(record: InstanceRecord) -> None:
    """The names and paths a record must hold whatever node it is on (ValueError naming the first that does not):
    a valid name, its own units, parts named after it, and its paths with no '..', named after it."""
    name = record.name
    _check_instance_name("name", name)
    if record.unit not in (*unit_names(name), *([""] if record.is_replica_set else [])):
        raise ValueError(f"unit {record.unit!r:.80} is not one of {name}'s (npuops-{name}[-router|-ray].service)")
    if record.cluster is not None and record.cluster.ray_unit not in (None, unit_names(name)[2]):
        raise ValueError(f"cluster.ray_unit {record.cluster.ray_unit!r:.80} is not {unit_names(name)[2]}")
    for replica in record.replicas:
        _check_instance_name("replica", replica, f"{name}-")
    if record.behind is not None:
        _check_instance_name("behind", record.behind)
        if not name.startswith(f"{record.behind}-"):
            raise ValueError(f"behind {record.behind!r}: a part's name starts with its router's, {name!r} does not")
    if _no_parent_steps("instance_dir", record.instance_dir).name != name:
        raise ValueError(f"instance_dir {record.instance_dir!r:.80} is not a directory named {name}")
    status = _no_parent_steps("status_file", record.status_file)
    if status.name != STATUS_FILE or status.parent.name not in (name, f"{SERVICE_DIR_PREFIX}{name}"):
        raise ValueError(f"status_file {record.status_file!r:.80} is not {name}/{STATUS_FILE} or "
                         f"{SERVICE_DIR_PREFIX}{name}/{STATUS_FILE}")
    if record.profiler_dir is not None:
        # A router's record is made from its first replica's, so it names that replica's traces.
        owners = {each for n in (name, *record.replicas) for each in (n, f"{SERVICE_DIR_PREFIX}{n}")}
        profiles = _no_parent_steps("profiler_dir", record.profiler_dir)
        if len(profiles.parts) < 2 or profiles.parent.name not in owners:
            raise ValueError(f"profiler_dir {record.profiler_dir!r:.80} is not in the status directory of {name}"
                             + (" or of a part" if record.replicas else ""))
    ray_env = record.cluster.ray_env_file if record.cluster is not None else None
    if ray_env and _no_parent_steps("cluster.ray_env_file", ray_env).parent.name != name:
        raise ValueError(f"cluster.ray_env_file {ray_env!r:.80} is not in {name}'s instance directory")


def _same_path(path: PurePath, expected: Path) -> bool:
    """Whether `path` is `expected`, compared as written (nothing resolved through links): spelt the same, or the
    same absolute path when neither has a '..'."""
    if path == expected:
        return True
    return ".." not in expected.parts and os.path.abspath(path) == os.path.abspath(expected)


def _check_location(record: InstanceRecord, state_dir: Path, data_root: Path | None) -> None:
    """Where a record of this node must point (ValueError): its instance directory, and its status file in that
    directory or, under systemd, in its service's StateDirectory (`data_root`'s npuops-NAME; when the caller does
    not know the data root, a directory named so)."""
    own = state_dir / record.name
    if not _same_path(PurePath(record.instance_dir), own):
        raise ValueError(f"instance_dir {record.instance_dir!r:.80} is not {own}")
    ray_env = record.cluster.ray_env_file if record.cluster is not None else None
    if ray_env and not _same_path(PurePath(ray_env).parent, own):
        raise ValueError(f"cluster.ray_env_file {ray_env!r:.80} is not in {own}")
    status_dir = PurePath(record.status_file).parent
    if not _is_status_dir(status_dir, record.name, record.manager, state_dir, data_root):
        where = own if record.manager == MANAGER_FOREGROUND else (
            f"{own} or {service_status_dir(data_root, record.name) if data_root else f'npuops-{record.name}'}")
        raise ValueError(f"status_file {record.status_file!r:.80} is not in {where}")
    profiles = PurePath(record.profiler_dir).parent if record.profiler_dir is not None else None
    if profiles is not None and not any(_is_status_dir(profiles, each, record.manager, state_dir, data_root)
                                        for each in (record.name, *record.replicas)):
        raise ValueError(f"profiler_dir {record.profiler_dir!r:.80} is not in a status directory of {record.name}")


def _is_status_dir(path: PurePath, name: str, manager: str, state_dir: Path, data_root: Path | None) -> bool:
    """Whether `path` is where launch puts instance `name`'s supervisor state: its instance directory, or under
    systemd its StateDirectory (npuops-NAME in `data_root`; in any directory when the caller does not know it)."""
    if _same_path(path, state_dir / name):
        return True
    if manager == MANAGER_FOREGROUND:
        return False
    if data_root is None:
        return path.name == f"{SERVICE_DIR_PREFIX}{name}"
    return _same_path(path, service_status_dir(data_root, name))


def _refuse_link(path: Path, what: str) -> None:
    """A link where launch writes a directory or a file is not followed: what it points at is not the record's."""
    with contextlib.suppress(OSError):
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise ConfigError(f"{what} {path} is a symbolic link", f"replace it with what `npuops launch` writes "
                              f"there (or remove the link: `rm {path}`)")


def load_record(state_dir: Path, name: str, data_root: Path | None = None) -> InstanceRecord:
    """Instance `name`'s record, held to what launch derives (check_derived) and to where it lies: its directory
    in `state_dir`, its status file there or in `data_root`'s npuops-NAME. Anything else is one ConfigError."""
    path = record_path(state_dir, name)
    if not (path.exists() or path.is_symlink()):
        known = [r.name for r in list_records(state_dir)]
        hint = f"known instances: {', '.join(known)}" if known else "no instance was launched here yet"
        raise BadInputError(f"no instance named {name!r} in {state_dir}",
                            f"use a name from `npuops list` ({hint})")
    _refuse_link(path.parent, "the instance directory")
    _refuse_link(path, "the instance record")
    # A regular UTF-8 file of bounded size: a FIFO, a huge or a binary file is named, not waited on or crashed on.
    text = read_input_text(path, "instance record", max_bytes=MIB,
                           fix=f"re-create it with `npuops launch` (as {name!r}), or run as a user that can read it")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # a document nested thousands deep is no record either
        raise ConfigError(f"{path} is not valid JSON", RECREATE) from None
    if isinstance(data, dict) and data.get("name") != name:  # before the rest: what else it says is another's
        raise ConfigError(f"{path} is not the record of {name} (it names instance {data.get('name')!r:.60})",
                          RECREATE)
    record = InstanceRecord.from_json(data, str(path))
    try:
        _check_location(record, state_dir, data_root)
    except ValueError as exc:
        status_dir = PurePath(record.status_file).parent
        # Launched with another service data root (a setting this command was not given): say which.
        elsewhere = not _is_status_dir(status_dir, name, record.manager, state_dir, data_root) and _is_status_dir(
            status_dir, name, record.manager, state_dir, None)
        fix = (f"set service_data_root to {status_dir.parent} (NPUOPS_SERVICE_DATA_ROOT) as at its launch, or "
               f"{RECREATE}" if elsewhere else RECREATE)
        raise ConfigError(f"{path} is not an npuops instance record of this node ({exc})", fix) from None
    return record


def remove_instance_dir(state_dir: Path, name: str) -> None:
    """An instance's directory (record, config, env file) once no launch installs it any more: the files launch
    writes there, by their names, never through a link (a link is deleted, not what it points at)."""
    directory = state_dir / validate_instance_name(name)
    remove_entries(directory, (RECORD_FILE, CONFIG_FILE, ROUTER_CONFIG_FILE, ENV_FILE, REVISIONS_FILE, ROLLOUT_FILE,
                               HOLD_FILE, REVISIONS_DIR))
    with contextlib.suppress(OSError):
        directory.rmdir()  # only when nothing else (an operator's file) is left in it


def remove_entries(directory: Path, entries: tuple[str, ...]) -> None:
    """Delete `entries` of `directory` without following a link on the way: a link in an entry's place is deleted,
    a `directory` that is a link (or gone) is left alone; BadInputError where one cannot be deleted."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # gone, or a link or a file that launch did not put there: left alone, shown as kept
    try:
        for entry in entries:
            _remove_entry(fd, directory, entry)
    finally:
        os.close(fd)


def _remove_entry(fd: int, directory: Path, entry: str) -> None:
    try:
        info = os.lstat(entry, dir_fd=fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BadInputError(f"cannot remove {directory / entry}: {exc.strerror}",
                            f"check {directory}'s permissions and file system, then remove it again") from None
    if stat.S_ISDIR(info.st_mode):
        if entry == REVISIONS_DIR:  # earlier revisions' env files hold the key too; rmtree follows no link in it
            shutil.rmtree(directory / entry, ignore_errors=True)
        return  # a directory where launch writes a file is not launch's: left, shown as kept
    try:
        os.unlink(entry, dir_fd=fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise BadInputError(f"cannot remove {directory / entry}: {exc.strerror}",
                            f"check {directory}'s permissions and file system, then remove it again") from None


# The state `list` and `status` give an instance whose record cannot be read.
UNREADABLE = "unreadable"


@dataclass(frozen=True)
class UnreadableRecord:
    """An instance directory whose record cannot be used: shown by `list` and `status` as a row with the problem
    and the fix, never left out (its unit may still run and hold chips)."""

    name: str
    problem: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "state": UNREADABLE, "problem": self.problem, "fix": self.fix}


def scan_records(state_dir: Path, data_root: Path | None = None
                 ) -> tuple[list[InstanceRecord], list[UnreadableRecord]]:
    """Every instance record under state_dir by name: the readable ones, and a row for each one that is not (one
    bad record never hides or breaks another). No state dir: none; a state dir that cannot be read (a regular
    file, no permission): ConfigError, not "no instances" (their units may run)."""
    records: list[InstanceRecord] = []
    unreadable: list[UnreadableRecord] = []
    try:
        entries = sorted(os.scandir(state_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        raise state_dir_error(state_dir, exc) from None
    for entry in entries:
        path = Path(entry.path) / RECORD_FILE
        if not (path.exists() or path.is_symlink()):
            continue
        try:
            records.append(load_record(state_dir, entry.name, data_root))
        except (BadInputError, ConfigError) as exc:
            unreadable.append(UnreadableRecord(entry.name, exc.problem, exc.fix))
    return records, unreadable


def state_dir_error(state_dir: Path, exc: OSError) -> ConfigError:
    """A state dir that cannot be used, in one line: a file where the directory should be, or no permission."""
    if isinstance(exc, (NotADirectoryError, FileExistsError)):
        return ConfigError(f"the state dir {state_dir} is not a directory",
                           "point state_dir (NPUOPS_STATE_DIR, /etc/npuops/config.toml) at npuops' state directory, "
                           "or move that file out of the way")
    return ConfigError(f"cannot use the state dir {state_dir}: {exc.strerror}",
                       "run as root (the user that launched the instances), or set state_dir to a directory it can use")


def list_records(state_dir: Path, data_root: Path | None = None) -> list[InstanceRecord]:
    """Every readable instance record under state_dir, by name (scan_records also names the unreadable ones)."""
    return scan_records(state_dir, data_root)[0]


def begin_foreground_log(record: InstanceRecord, text: str) -> None:
    """A foreground run's log (engine.log) begins with its start gate's report, as a unit's journal does: `npuops
    logs NAME` then shows why a refused launch never started. The supervisor appends the engine's output."""
    write_text_atomic(record.engine_log, text.rstrip("\n") + "\n", mode=0o640)


def write_status(record: InstanceRecord, state: SupervisorState) -> None:
    """The supervisor's state for `npuops status` (also written by the start gate when it refuses, and by a
    foreground launch before its gate)."""
    write_text_atomic(Path(record.status_file), json.dumps(state.to_json(), indent=2) + "\n", mode=0o644)


def read_status(record: InstanceRecord) -> SupervisorState | None:
    """The supervisor's last written state, or None when it never ran (or the file is unreadable or not a
    supervisor's state). The status directory is the service user's to write: the file is read as a regular file
    only, no link followed from its directory down (a FIFO would hang `status` run as root), at most a MiB."""
    status = PurePosixPath(record.status_file)
    try:
        tail = read_tail(ConfinedPath(Path(status.parent.parent), PurePosixPath(status.parent.name, status.name)),
                         cap=MIB)
        return None if tail.left_out else SupervisorState.from_json(loads_json(tail.data.decode("utf-8")))
    except (NotRead, ValueError, WireFormatError):
        return None
