"""The hardware a plan is for: N identical Ascend nodes (a chip type x a device subset), or this machine's CPU."""

from __future__ import annotations

import re
from dataclasses import dataclass

from npuops.errors import BadInputError
from npuops.hardware.chips import ChipSpec, chip_by_name, chip_catalog
from npuops.hardware.cpu_features import CpuFeatures
from npuops.hardware.matmul_rate import MeasuredMatmul
from npuops.plan.inputs import MAX_NODES
from npuops.ranges import parse_device_list

# Ascend hosts carry at most 16 devices (an A3 node shows 16 dies); more is a typo.
_MAX_DEVICES_PER_NODE = 16


@dataclass(frozen=True)
class HardwareTarget:
    kind: str  # "npu" | "cpu"
    chip: ChipSpec | None
    devices_per_node: int
    nodes: int
    device_ids: tuple[int, ...]
    memory_bytes_per_device: int
    bandwidth_bytes_per_s: float | None
    flops_per_s: float | None
    label: str
    # CPU target only: the facts vLLM's CPU engine works from.
    cpu_count: int | None = None
    numa_nodes: int | None = None
    total_ram_bytes: int | None = None
    # What the host's CPU computes fast (its flags, cores, clock): the CPU engine's dtype and peak rate; None where
    # the node model did not say (an older sender).
    cpu_features: CpuFeatures | None = None
    # The host's dense matmul rate by dtype, measured once (npuops/hardware/matmul_rate.py): the CPU engine's
    # prefill roofline where it was measured, in place of the flags' peak.
    cpu_matmul: MeasuredMatmul | None = None

    @property
    def family(self) -> str:
        if self.kind == "cpu" or self.chip is None:
            return "cpu"
        return self.chip.family

    @property
    def total_devices(self) -> int:
        return self.devices_per_node * self.nodes


def _known_chips() -> str:
    return ", ".join(sorted(chip_catalog()))


def _find_chip(name: str) -> ChipSpec | None:
    chip = chip_by_name(name)
    if chip is None and name.lower().startswith("ascend") and len(name) > len("ascend"):
        # "Ascend910B3" is how some people write a 910B3; "Ascend910" itself is the A3 die.
        chip = chip_by_name(name[len("ascend") :])
    return chip


def _npu_target(chip: ChipSpec, count: int, nodes: int, memory_bytes: int | None, label: str) -> HardwareTarget:
    return HardwareTarget(
        kind="npu",
        chip=chip,
        devices_per_node=count,
        nodes=nodes,
        device_ids=tuple(range(count)),
        memory_bytes_per_device=memory_bytes if memory_bytes is not None else chip.memory_bytes,
        bandwidth_bytes_per_s=chip.bandwidth_gbps * 1e9 if chip.bandwidth_gbps else None,
        flops_per_s=chip.fp16_tflops * 1e12,
        label=label,
    )


def _check_counts(count: int, nodes: int, text: str) -> None:
    if not 1 <= count <= _MAX_DEVICES_PER_NODE:
        raise BadInputError(f"hardware spec {text!r}: {count} devices per node", f"use 1 to {_MAX_DEVICES_PER_NODE}")
    if not 1 <= nodes <= MAX_NODES:
        raise BadInputError(f"--nodes {nodes} is out of range", f"use 1 to {MAX_NODES}")


def restrict_devices(target: HardwareTarget, devices: str | tuple[int, ...]) -> HardwareTarget:
    """The same node(s) limited to a subset of device ids (`--devices 0-3`)."""
    if target.kind != "npu":
        raise BadInputError("--devices applies to NPU targets only", "drop --devices with --hardware cpu")
    ids = parse_device_list(devices, target.devices_per_node) if isinstance(devices, str) else tuple(devices)
    if not ids:
        raise BadInputError("the device list is empty", "name at least one device, e.g. --devices 0")
    missing = [i for i in ids if i not in target.device_ids]
    if missing:
        raise BadInputError(
            f"device {missing[0]} is not part of {target.label}",
            f"choose from {','.join(str(i) for i in target.device_ids)}",
        )
    return HardwareTarget(
        kind=target.kind,
        chip=target.chip,
        devices_per_node=len(ids),
        nodes=target.nodes,
        device_ids=tuple(sorted(ids)),
        memory_bytes_per_device=target.memory_bytes_per_device,
        bandwidth_bytes_per_s=target.bandwidth_bytes_per_s,
        flops_per_s=target.flops_per_s,
        label=f"{target.label} devices {','.join(str(i) for i in sorted(ids))}",
    )


def parse_hardware_spec(text: str, *, nodes: int = 1, devices: str | None = None) -> HardwareTarget:
    """`910B3x8`, `910B4x4`, `310P3x2`, `Ascend910x16` (A3 dies), case-insensitive; `x`, `X` or `*` separate."""
    spec = text.strip()
    if spec.lower() == "cpu":
        raise BadInputError(
            "the cpu target needs this machine's RAM and CPU facts, which a spec string does not carry",
            "build it with cpu_target(total_ram_bytes, cpu_count, numa_nodes)",
        )
    match = re.fullmatch(r"(.+?)\s*[xX*×]\s*(\d+)", spec)
    if match is None:
        raise BadInputError(
            f"hardware spec {text!r} is not CHIPxCOUNT",
            f"write e.g. 910B3x8; known chips: {_known_chips()}",
        )
    name, count = match.group(1), int(match.group(2))
    chip = _find_chip(name)
    if chip is None:
        raise BadInputError(f"unknown chip {name!r} in hardware spec {text!r}", f"known chips: {_known_chips()}")
    _check_counts(count, nodes, text)
    target = _npu_target(chip, count, nodes, None, f"{chip.name}x{count}" + (f" x {nodes} nodes" if nodes > 1 else ""))
    return restrict_devices(target, devices) if devices is not None else target


def target_from_node(
    chip_name: str,
    chip_count: int,
    memory_bytes_per_chip: int | None = None,
    *,
    nodes: int = 1,
    devices: str | None = None,
) -> HardwareTarget:
    """A target from the node model `npuops node` builds; per-chip memory as npu-smi reported it wins."""
    chip = _find_chip(chip_name)
    if chip is None:
        raise BadInputError(
            f"this node's chip {chip_name!r} is not in the chip catalog",
            f"pass --hardware explicitly with one of: {_known_chips()}",
        )
    if chip_count < 1:
        raise BadInputError("this node reports no NPU chips", "check `npu-smi info`, or plan with --hardware cpu")
    if memory_bytes_per_chip is not None and memory_bytes_per_chip <= 0:
        raise BadInputError(
            f"npu-smi reported {memory_bytes_per_chip} bytes of memory per chip", "check `npu-smi info`"
        )
    _check_counts(chip_count, nodes, f"{chip.name}x{chip_count}")
    target = _npu_target(chip, chip_count, nodes, memory_bytes_per_chip, f"{chip.name}x{chip_count} (this node)")
    return restrict_devices(target, devices) if devices is not None else target


def cpu_target(
    total_ram_bytes: int,
    cpu_count: int,
    numa_nodes: int = 1,
    *,
    nodes: int = 1,
    memory_bandwidth_bytes_per_s: float | None = None,
    flops_per_s: float | None = None,
    features: CpuFeatures | None = None,
    matmul: MeasuredMatmul | None = None,
) -> HardwareTarget:
    """vLLM's CPU engine on this machine: it binds to one NUMA node, so one node's RAM is the device memory."""
    if total_ram_bytes <= 0 or cpu_count <= 0 or numa_nodes <= 0:
        raise BadInputError(
            f"cpu facts out of range (ram {total_ram_bytes}, cpus {cpu_count}, numa nodes {numa_nodes})",
            "pass the machine's total RAM in bytes, its CPU count and its NUMA node count",
        )
    return HardwareTarget(
        kind="cpu",
        chip=None,
        devices_per_node=1,
        # Several CPU hosts: each runs one engine process (a pipeline stage or a data-parallel rank); the
        # multi-node launch path runs for real on CPU hosts this way.
        nodes=nodes,
        device_ids=(0,),
        memory_bytes_per_device=total_ram_bytes // numa_nodes,
        bandwidth_bytes_per_s=memory_bandwidth_bytes_per_s,
        flops_per_s=flops_per_s,
        label=f"cpu ({cpu_count} CPUs, {total_ram_bytes / 2**30:.0f} GiB RAM, {numa_nodes} NUMA)"
        + (f" x {nodes} hosts" if nodes > 1 else ""),
        cpu_count=cpu_count,
        numa_nodes=numa_nodes,
        total_ram_bytes=total_ram_bytes,
        cpu_features=features,
        cpu_matmul=matmul,
    )
