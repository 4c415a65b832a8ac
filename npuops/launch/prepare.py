"""What a launch on this node is made of before anything starts: the operator's choices turned into the LaunchSpec,
the CANN environment the env file carries, the API key, the notes worth printing, and the rendered instances."""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError
from npuops.hardware.node import read_cann
from npuops.hardware.probe import Probe
from npuops.httpclient import is_host_name
from npuops.inputfiles import read_api_key_file
from npuops.instance.record import MANAGER_FOREGROUND, MANAGER_SYSTEMD, validate_instance_name
from npuops.launch.ascend_env import capture_set_env
from npuops.launch.instance_files import (
    DEFAULT_STOP_TIMEOUT_S,
    DEFAULT_WATCHDOG_S,
    SERVICE_USER,
    InstanceFiles,
    LaunchSpec,
    render_instances,
    render_pd_instances,
    write_instance_files,
)
from npuops.plan.disaggregation import DisaggregatedPlan
from npuops.plan.result import Plan
from npuops.plan.speculative import require_draft_on_disk
from npuops.settings import Settings
from npuops.templating import env_name, env_quote, unit_user

LOCAL_BINDS = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class LaunchChoices:
    """How the operator wants the instance run (`npuops launch` flags besides the plan's)."""

    name: str = "vllm"
    host: str = "127.0.0.1"
    port: int = 8000
    api_key_file: Path | None = None
    vllm: str | None = None  # the vllm executable; None: the serving venv's (Settings.venv)
    service_user: str = SERVICE_USER
    start_timeout_s: int | None = None
    watchdog_s: int = DEFAULT_WATCHDOG_S
    stop_timeout_s: int = DEFAULT_STOP_TIMEOUT_S
    extra_env: Mapping[str, str] = field(default_factory=dict)
    foreground: bool = False
    # The unit may run as root only when the operator says so (--allow-root); every launch and status warn.
    allow_root: bool = False
    profiling: bool = False  # vLLM's profiler configured, for `npuops profile`

    def __post_init__(self) -> None:
        """Refuse what no unit, env file or vllm.yaml may hold, before anything is planned or written."""
        validate_instance_name(self.name)
        check_bind_address(self.host)
        unit_user(self.service_user)
        if self.service_user == "root" and not self.allow_root:
            raise BadInputError("--service-user root would run the engine with every privilege of the node",
                                "use an unprivileged user (the default npuops, which provisioning creates), or "
                                "add --allow-root if it must be root")
        for key, value in self.extra_env.items():
            env_name(key)
            env_quote(value, f"--env {key}: the value")

    def to_json(self) -> dict[str, Any]:
        """The choices as a revision keeps them (its launch.json is 0600: an --env value may be a secret)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["api_key_file"] = str(self.api_key_file) if self.api_key_file else None
        data["extra_env"] = dict(self.extra_env)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchChoices:
        """Choices as to_json wrote them (a key an older npuops left out takes its default)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if values.get("api_key_file"):
            values["api_key_file"] = Path(values["api_key_file"])
        try:
            return cls(**values)
        except (TypeError, ValueError, AttributeError) as exc:
            raise BadInputError(f"the kept launch choices are malformed ({exc})",
                                "launch the instance again (it then keeps new ones)") from None

    @property
    def root_note(self) -> str | None:
        if self.service_user != "root":
            return None
        return "the unit runs as root (--allow-root): a compromised engine owns the node"


@dataclass(frozen=True)
class PreparedLaunch:
    instances: list[InstanceFiles]
    api_key: str | None
    notes: list[str]
    spec: LaunchSpec


def check_bind_address(host: str) -> str:
    """--host: an IPv4 or IPv6 address, or a host name; nothing else reaches vllm.yaml or a router's command."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if not is_host_name(host):
        raise BadInputError(f"--host {host!r} is neither an IP address nor a host name",
                            "give an address of this node, e.g. 127.0.0.1 (the default) or 0.0.0.0 for every "
                            "interface")
    return host


def vllm_executable(settings: Settings, choice: str | None) -> str:
    return choice or str(settings.venv / "bin" / "vllm")


def npuops_executable(settings: Settings) -> str:
    """The npuops the unit should run: the one beside this interpreter (the serving venv on a provisioned node),
    else the serving venv's."""
    beside = Path(sys.executable).parent / "npuops"
    return str(beside) if beside.exists() else str(settings.venv / "bin" / "npuops")


def exposure_note(host: str, api_key: str | None) -> str | None:
    if host in LOCAL_BINDS or api_key is not None:
        return None
    return f"binding {host} without --api-key-file: anyone who reaches this port can use the model"


def cann_environment(settings: Settings, plan: Plan) -> tuple[dict[str, str], list[str]]:
    """What CANN's set_env.sh scripts export, for the env file (systemd does not source shell scripts)."""
    if not plan.rules.needs_cann:
        return {}, []
    probe = Probe(settings)
    cann = read_cann(probe)
    environment, error = capture_set_env(probe, list(cann.set_env_scripts))
    if error:
        return environment, [f"could not capture the CANN environment: {error}"]
    if not cann.set_env_scripts:
        return environment, ["no CANN set_env.sh found on this machine: the env file lacks the CANN environment; "
                             "render on the node itself, or run `npuops provision` there first"]
    return environment, []


def prepare_local(settings: Settings, plan: Plan, choices: LaunchChoices,
                  pd: DisaggregatedPlan | None = None, *, api_key: str | None = None) -> PreparedLaunch:
    """The instances of a launch on this node, rendered, with the API key read and the notes for the operator
    (`pd`: a disaggregated plan's engines and its PD router instead of `plan`'s replicas; `api_key`: the key the
    running instance has, which a rollout keeps, instead of reading --api-key-file again)."""
    for planned in (pool.plan for pool in pd.pools) if pd is not None else (plan,):
        require_draft_on_disk(planned.speculative)
    if api_key is None and choices.api_key_file:
        api_key = read_api_key_file(choices.api_key_file)
    ascend_env, notes = cann_environment(settings, plan)
    # What the model directory lacks that the engine would fail on (no tokenizer files, ...): the plan's warnings.
    notes = [*plan.model.notes, *notes]
    notes += [note for note in (exposure_note(choices.host, api_key), choices.root_note) if note]
    spec = LaunchSpec(
        name=choices.name, host=choices.host, port=choices.port, api_key=api_key, service_user=choices.service_user,
        vllm_command=(vllm_executable(settings, choices.vllm), "serve"), npuops_command=(npuops_executable(settings),),
        state_dir=settings.state_dir, service_data_root=settings.service_data_root, ascend_env=ascend_env,
        manager=MANAGER_FOREGROUND if choices.foreground else MANAGER_SYSTEMD, start_timeout_s=choices.start_timeout_s,
        watchdog_s=choices.watchdog_s, stop_timeout_s=choices.stop_timeout_s, extra_env=dict(choices.extra_env),
        profiling=choices.profiling)
    rendered = render_pd_instances(pd, spec) if pd is not None else render_instances(plan, spec)
    return PreparedLaunch(rendered, api_key, notes, spec)


def write_dry_run(instances: list[InstanceFiles], output: Path) -> dict[str, list[str]]:
    """`launch --dry-run --output DIR`: every instance's files into DIR (DIR/<name>/ when there are several)."""
    written: dict[str, list[str]] = {}
    for instance in instances:
        directory = output / instance.name if len(instances) > 1 else output
        try:
            written[instance.name] = [str(p) for p in write_instance_files(directory, instance)]
        except OSError as exc:  # read-only, full, not a directory, no permission
            raise BadInputError(f"cannot write {exc.filename or directory}: {exc.strerror}",
                                "give --output a directory you can write to") from None
    return written
