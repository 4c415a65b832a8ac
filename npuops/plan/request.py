"""Where a plan meets the machine it is asked on: the target of a request (npuops/plan/inputs.py PlanRequest).

The rest of npuops.plan is pure; this module alone reads this node (its chips through the probe, or the host's
RAM and CPUs for the CPU engine) when the request says `--hardware auto` or `cpu`. A group launch passes the
first host's node model instead, so a plan for a serving group is built the same way from the group's hardware.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from npuops.errors import EnvironmentMissingError
from npuops.hardware.host import HostFacts, read_host_facts
from npuops.hardware.matmul_rate import MeasuredMatmul
from npuops.hardware.node import Node, discover_node
from npuops.hardware.probe import Probe
from npuops.hardware.python_stack import read_python_stack
from npuops.plan.calibration import CalibrationChoice, CalibrationStore, HostBandwidth
from npuops.plan.catalog import load_model
from npuops.plan.disaggregation import DisaggregatedPlan, parse_pd, plan_disaggregated, plan_pools_over_hosts
from npuops.plan.inputs import PlanRequest
from npuops.plan.planner import make_plan
from npuops.plan.result import Plan
from npuops.plan.target import HardwareTarget, cpu_target, parse_hardware_spec, target_from_node
from npuops.settings import Settings

T = TypeVar("T")


def host_target(host: HostFacts, nodes: int = 1) -> HardwareTarget:
    """The CPU engine's target from a host's facts: its RAM, the CPUs this process may use, its NUMA nodes."""
    return cpu_target(host.memory_total_bytes or 0, len(host.allowed_cpus) or host.cpu_count,
                      max(1, len(host.numa_nodes)), nodes=nodes, features=host.cpu)


def _kept_or_measured(kept: T | None, measure: bool, progress: Callable[[str], None] | None, saying: str,
                      measure_now: Callable[[], T | None], keep: Callable[[T], None]) -> T | None:
    """What the node's calibration keeps for this host, else measured now, once, and kept (where the state
    directory can be written; a plan by an unprivileged user measures again next time)."""
    if kept is not None or not measure:
        return kept
    if progress is not None:
        progress(saying)
    measured = measure_now()
    if measured is not None:
        with contextlib.suppress(OSError):
            keep(measured)
    return measured


def host_memory_bandwidth(settings: Settings, label: str, cpus: int, *, measure: bool = True,
                          progress: Callable[[str], None] | None = None) -> HostBandwidth | None:
    """This CPU host's memory bandwidth (the CPU engine's decode roofline), kept under the target's label or
    measured once. `measure` False: only what is kept (another host's target)."""
    from npuops.hardware.memory_bandwidth import measure_read_bandwidth

    def measure_now() -> HostBandwidth:
        measured = measure_read_bandwidth(cpus)
        return HostBandwidth(measured.bytes_per_s, measured.method, time.time())

    store = CalibrationStore(settings.state_dir)
    return _kept_or_measured(store.host_bandwidth(label), measure, progress,
                             "measuring this host's memory bandwidth once (the CPU engine's roofline) ...",
                             measure_now, lambda kept: store.keep_host_bandwidth(label, kept))


def host_matmul_rates(settings: Settings, label: str, *, measure: bool = True,
                      progress: Callable[[str], None] | None = None) -> MeasuredMatmul | None:
    """This CPU host's dense matmul rates by dtype (the CPU engine's prefill roofline), kept under the target's
    label or timed once in the serving stack's interpreter; None where nothing is kept and the stack cannot time
    one (no torch yet: the next plan tries again)."""
    from npuops.hardware.matmul_rate import measure_matmul_rates

    store = CalibrationStore(settings.state_dir)
    return _kept_or_measured(store.host_matmul(label), measure, progress,
                             "timing a matmul once in the serving stack (the CPU engine's prefill roofline) ...",
                             lambda: measure_matmul_rates(Probe(settings)).measured,
                             lambda kept: store.keep_host_matmul(label, kept))


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
        # Only the host's RAM, CPUs and memory bandwidth matter here: no vendor tool needs to run. Another host's
        # facts (a group's first host) get the bandwidth kept for hosts of its kind, else the shared constant.
        target = host_target(host or read_host_facts(Probe(settings)), request.nodes)
        bandwidth = host_memory_bandwidth(settings, target.label, target.cpu_count or 1, measure=host is None)
        matmul = host_matmul_rates(settings, target.label, measure=host is None)
        return replace(target, bandwidth_bytes_per_s=bandwidth.bytes_per_s if bandwidth else None,
                       cpu_matmul=matmul)
    if hardware == "auto":
        return node_target(node or discover_node(Probe(settings)), request.nodes, request.devices)
    return parse_hardware_spec(request.hardware, nodes=request.nodes, devices=request.devices)


def node_calibration(settings: Settings, target: HardwareTarget, *, ignore: bool = False) -> CalibrationChoice:
    """This node's stored calibration for the target, when its serving stack is the one that was benched."""
    if ignore:
        return CalibrationChoice(None, "--no-calibration: the model's shared constants")
    store = CalibrationStore(settings.state_dir)
    if not store.hardware_benched(target.label):
        return store.choose(target.label, None)
    # Only now is the stack worth reading (a subprocess in the serving venv, by metadata).
    return store.choose(target.label, read_python_stack(Probe(settings)).versions)


def plan_request(settings: Settings, request: PlanRequest, *, target: HardwareTarget | None = None) -> Plan:
    """Load the model, resolve the target (unless given) and plan, calibrated by this node's benches."""
    model = load_model(request.model, request.quantization)
    target = target or resolve_target(settings, request)
    return make_plan(model, target, request.workload, request.options,
                     node_calibration(settings, target, ignore=request.no_calibration))


def plan_pd_request(settings: Settings, request: PlanRequest, *, target: HardwareTarget | None = None
                    ) -> tuple[DisaggregatedPlan | None, Plan, str]:
    """`--pd P:D|auto`: the disaggregated plan (None where auto keeps the co-located one), the co-located plan on
    the same chips, and why."""
    assert request.pd is not None
    if request.nodes > 1:
        # P + D identical nodes, one pool per node: what `launch --pd P:D -i INVENTORY --group GROUP` runs.
        one = replace(request, nodes=1)
        shape = parse_pd(request.pd)
        if shape is not None and shape.prefill + shape.decode != request.nodes:
            from npuops.errors import BadInputError

            raise BadInputError(f"--pd {shape} over nodes runs one pool per node: {shape.prefill + shape.decode} "
                                f"nodes, not {request.nodes}", f"use --nodes {shape.prefill + shape.decode}, or "
                                "drop --nodes to split one node's chips")
        pd, why = plan_pd_over_hosts(settings, one, target=target or resolve_target(settings, one))
        return pd, pd.colocated, why
    model = load_model(request.model, request.quantization)
    target = target or resolve_target(settings, request)
    return plan_disaggregated(model, target, request.workload, request.options, request.pd,
                              node_calibration(settings, target, ignore=request.no_calibration), request.kv_port)


def plan_pd_over_hosts(settings: Settings, request: PlanRequest, *, target: HardwareTarget
                       ) -> tuple[DisaggregatedPlan, str]:
    """`launch --pd P:D -i INVENTORY --group GROUP`: the pools over the group's hosts (`target`: one host's)."""
    assert request.pd is not None
    shape = parse_pd(request.pd)
    if shape is None:
        from npuops.errors import BadInputError

        raise BadInputError("--pd auto plans one node's split", "give the group's split: --pd P:D with P + D hosts")
    model = load_model(request.model, request.quantization)
    pd = plan_pools_over_hosts(model, target, request.workload, request.options, shape,
                               node_calibration(settings, target, ignore=request.no_calibration), request.kv_port)
    return pd, pd.verdict
