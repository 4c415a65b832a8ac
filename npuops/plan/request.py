"""Where a plan meets the machine it is asked on: the request (`npuops plan`/`launch` flags) and its target.

The rest of npuops.plan is pure; this module alone reads this node (its chips through the probe, or the host's
RAM and CPUs for the CPU engine) when the request says `--hardware auto` or `cpu`. A group launch passes the
first host's node model instead, so a plan for a serving group is built the same way from the group's hardware.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from npuops.errors import EnvironmentMissingError
from npuops.hardware.host import HostFacts, read_host_facts
from npuops.hardware.node import Node, discover_node
from npuops.hardware.probe import Probe
from npuops.plan.catalog import load_model
from npuops.plan.fields import Limits, UserFlag, check_fields, declared, flagged_fields
from npuops.plan.inputs import STRATEGIES, PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.result import Plan
from npuops.plan.server_options import ServerOptions
from npuops.plan.target import MAX_NODES, HardwareTarget, cpu_target, parse_hardware_spec, target_from_node
from npuops.settings import Settings


@dataclass(frozen=True)
class PlanRequest:
    """A plan as an operator asks for it: the model, the hardware, the workload and what they fixed."""

    model: str  # a model directory or a catalog name
    hardware: str = declared(flag=UserFlag(
        "hardware", "auto (this node), a spec like 910B3x8 / 310P3x2 / Ascend910x16, or cpu."), default="auto")
    nodes: int = declared(limits=Limits(minimum=1, maximum=MAX_NODES), flag=UserFlag("nodes", "Identical nodes."),
                          default=1)
    devices: str | None = declared(flag=UserFlag("devices", "Plan for a subset of devices, e.g. 0-3."))
    quantization: str | None = declared(flag=UserFlag(
        "quantization", "Weights quantization as vllm-ascend names it (W8A8, W4A8, ...)."))
    multinode: str = declared(limits=Limits(choices=STRATEGIES), default="auto", flag=UserFlag(
        "multinode", "With --nodes > 1: ray (TP in a node x PP across nodes) or dp (vLLM's native data parallel, "
        "expert parallel for MoE); auto picks and explains."))
    vllm_ascend_version: str | None = declared(flag=UserFlag(
        "vllm-ascend-version", "The vllm-ascend release the node runs (gates env keys and features)."))
    workload: Workload = field(default_factory=Workload)
    # The vLLM options the operator fixed, by ServerOptions field name (`tp`/`pp` accepted for short).
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def options(self) -> PlanOptions:
        return PlanOptions(vllm_ascend_version=self.vllm_ascend_version, multinode=self.multinode, **self.fixed)

    @classmethod
    def from_flags(cls, model: str, flags: Mapping[str, Any]) -> PlanRequest:
        """The request from the CLI's flag values, named as click names them (the declared flags with `_`)."""
        return cls(model=model, workload=Workload(**flag_values(Workload, flags)),
                   fixed=flag_values(ServerOptions, flags), **flag_values(PlanRequest, flags))


def flag_values(cls: type[Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """The values of `cls`'s declared flags that were given, by field name (`--tp` gives tensor_parallel_size)."""
    out: dict[str, Any] = {}
    for f, flag in flagged_fields(cls):
        value = flags.get(flag.name.replace("-", "_"))
        if value is not None and value is not False:
            out[f.name] = value
    return out


def host_target(host: HostFacts, nodes: int = 1) -> HardwareTarget:
    """The CPU engine's target from a host's facts: its RAM, the CPUs this process may use, its NUMA nodes."""
    return cpu_target(host.memory_total_bytes or 0, len(host.allowed_cpus) or host.cpu_count,
                      max(1, len(host.numa_nodes)), nodes=nodes)


def node_target(node: Node, nodes: int = 1, devices: str | None = None) -> HardwareTarget:
    """A target from a node model: its first chip's name, its chip count, and the memory npu-smi reports per chip
    (HBM, or the device memory of a 310P); a chip that reports no memory (0 MB) is planned with its catalog size."""
    if not node.has_npus:
        reasons = "; ".join(node.no_npu_reasons())
        raise EnvironmentMissingError(f"--hardware auto found no NPU on the node ({reasons})",
                                      "pass --hardware explicitly (e.g. 910B3x8) or --hardware cpu")
    first = node.chips[0]
    memory_mb = first.device_memory_total_mb
    return target_from_node(first.smi.name, len(node.chips), memory_mb * 2**20 if memory_mb else None,
                            nodes=nodes, devices=devices)


def resolve_target(settings: Settings, request: PlanRequest, *, node: Node | None = None,
                   host: HostFacts | None = None) -> HardwareTarget:
    """The hardware the request names: a spec, this host's CPUs (`cpu`) or this node's chips (`auto`); `node` and
    `host` stand for this machine's when given (a serving group's first host)."""
    hardware = request.hardware.strip().lower()
    if hardware == "cpu":
        # Only the host's RAM and CPUs matter here: no vendor tool needs to run.
        return host_target(host or read_host_facts(Probe(settings)), request.nodes)
    if hardware == "auto":
        return node_target(node or discover_node(Probe(settings)), request.nodes, request.devices)
    return parse_hardware_spec(request.hardware, nodes=request.nodes, devices=request.devices)


def plan_request(settings: Settings, request: PlanRequest, *, target: HardwareTarget | None = None) -> Plan:
    """Load the model, resolve the target (unless given) and plan."""
    model = load_model(request.model, request.quantization)
    return make_plan(model, target or resolve_target(settings, request), request.workload, request.options)
