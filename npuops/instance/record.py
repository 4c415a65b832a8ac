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
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from npuops import __version__
from npuops.atomic import write_text_atomic
from npuops.errors import BadInputError, ConfigError
from npuops.inputfiles import MIB, read_input_text
from npuops.instance.membership import ClusterMembership
from npuops.instance.state import SupervisorState
from npuops.ranges import MAX_DEVICES
from npuops.wire import WireFormatError

# The files of one instance and their modes: the env file may hold an API key.
CONFIG_FILE = "vllm.yaml"
ENV_FILE = "env"
UNIT_SUFFIX = ".service"
FILE_MODES = {CONFIG_FILE: 0o644, ENV_FILE: 0o600}

_INSTANCE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")


def validate_instance_name(name: str) -> str:
    if not isinstance(name, str) or not _INSTANCE_NAME.fullmatch(name):  # fullmatch: `$` lets a final \n through
        raise BadInputError(f"instance name {name!r} is not usable",
                            "use 1-48 lower-case letters, digits and dashes, starting with a letter or digit")
    return name


# The group of the Ascend device nodes (the driver installer creates it); NPU units run with it.
NPU_GROUP = "HwHiAiUser"
RECORD_FILE = "instance.json"
STATUS_FILE = "supervisor.json"
ENGINE_LOG_FILE = "engine.log"
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
    def from_json(cls, data: dict[str, Any], where: str) -> InstanceRecord:
        known = {f.name for f in fields(cls)}
        try:
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
            return cls(**values)
        except WireFormatError as exc:
            raise ConfigError(f"{where} is not an npuops instance record ({exc.reason})",
                              "re-create it with `npuops launch`") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where} is not an npuops instance record ({exc})",
                              "re-create it with `npuops launch`") from None


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
            ok = isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(item) and (
                element == "float" or float(item).is_integer())
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


def load_record(state_dir: Path, name: str) -> InstanceRecord:
    path = record_path(state_dir, name)
    if not (path.exists() or path.is_symlink()):
        known = [r.name for r in list_records(state_dir)]
        hint = f"known instances: {', '.join(known)}" if known else "no instance was launched here yet"
        raise BadInputError(f"no instance named {name!r} in {state_dir}",
                            f"use a name from `npuops list` ({hint})")
    # A regular UTF-8 file of bounded size: a FIFO, a huge or a binary file is named, not waited on or crashed on.
    text = read_input_text(path, "instance record", max_bytes=MIB,
                           fix=f"re-create it with `npuops launch` (as {name!r}), or run as a user that can read it")
    try:
        data = json.loads(text)
    except ValueError:
        raise ConfigError(f"{path} is not valid JSON", "re-create it with `npuops launch`") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not an npuops instance record", "re-create it with `npuops launch`")
    return InstanceRecord.from_json(data, str(path))


def remove_instance_dir(state_dir: Path, name: str) -> None:
    """An instance's directory (record, config, env file) once no launch installs it any more."""
    directory = state_dir / validate_instance_name(name)
    for entry in (RECORD_FILE, CONFIG_FILE, ROUTER_CONFIG_FILE, ENV_FILE, REVISIONS_FILE, ROLLOUT_FILE, HOLD_FILE):
        (directory / entry).unlink(missing_ok=True)
    shutil.rmtree(directory / REVISIONS_DIR, ignore_errors=True)  # earlier revisions' env files hold the key too
    with contextlib.suppress(OSError):
        directory.rmdir()  # only when nothing else (an operator's file) is left in it


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


def scan_records(state_dir: Path) -> tuple[list[InstanceRecord], list[UnreadableRecord]]:
    """Every instance record under state_dir by name: the readable ones, and a row for each one that is not (one
    bad record never hides or breaks another)."""
    records: list[InstanceRecord] = []
    unreadable: list[UnreadableRecord] = []
    try:
        entries = sorted(os.scandir(state_dir), key=lambda e: e.name)
    except OSError:
        return [], []
    for entry in entries:
        path = Path(entry.path) / RECORD_FILE
        if not (path.exists() or path.is_symlink()):
            continue
        try:
            records.append(load_record(state_dir, entry.name))
        except (BadInputError, ConfigError) as exc:
            unreadable.append(UnreadableRecord(entry.name, exc.problem, exc.fix))
    return records, unreadable


def list_records(state_dir: Path) -> list[InstanceRecord]:
    """Every readable instance record under state_dir, by name (scan_records also names the unreadable ones)."""
    return scan_records(state_dir)[0]


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
    supervisor's state)."""
    try:
        data = json.loads(Path(record.status_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    try:
        return SupervisorState.from_json(data)
    except WireFormatError:
        return None
