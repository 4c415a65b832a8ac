"""Host: CPUs for the NPUs, kernel tunables, shared memory, memory and disk for the model, the open-file limit.

The tunables are the ones vllm-ascend's tuning guide sets
(docs/source/developer_guide/performance_and_debug/optimization_and_tuning.md in vllm-ascend); /proc and /sys are
read through the probe, so tests point Settings.root at a prepared tree.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npuops.doctor.common import skip_without_npus
from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity
from npuops.hardware.host import parse_cpu_list
from npuops.hardware.node import Chip
from npuops.hardware.npu_smi_detail import NpuTopology, parse_npu_smi_topo
from npuops.parsing import ParseError
from npuops.textout import compact_cpu_list

GIB = 1024**3
ARM_MACHINES = ("aarch64", "arm64")


def _skip_unless_arm_with_npus(ctx: CheckContext, what: str) -> Result | None:
    """vllm-ascend binds CPUs only on ARM hosts: on x86, or without NPUs, a CPU-binding check has nothing to check."""
    arch = ctx.node.host.arch
    if arch not in ARM_MACHINES:
        return Result.skip(f"{arch} host: vllm-ascend applies {what} on ARM hosts only", "nothing to do on x86",
                           arch=arch)
    return skip_without_npus(ctx)
SYSCTL_PERSIST = "and persist it in /etc/sysctl.d/90-npuops.conf (npuops provision's host tuning does both)"


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def _read_int(ctx: CheckContext, path: str) -> int | None:
    text = ctx.probe.read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip().split()[0])
    except (ValueError, IndexError):
        return None


class CpusetPerNpu(Check):
    """On ARM hosts the allowed cpuset has at least 5 CPUs for each NPU the launch uses (vllm-ascend CPU binding)."""

    id = "cpuset-per-npu"
    area = "host"
    severity = Severity.HIGH
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        skipped = _skip_unless_arm_with_npus(ctx, "its CPU binding (and its CPUs-per-NPU rule)")
        if skipped is not None:
            return skipped
        host = ctx.node.host
        per_npu = int(ctx.threshold("min_cpus_per_npu_arm"))
        npus = len(ctx.selected_chips())
        allowed = len(host.allowed_cpus)
        need = per_npu * npus
        evidence = {"allowed_cpus": allowed, "cpu_count": host.cpu_count, "npus": npus, "per_npu": per_npu,
                    "needed": need}
        if npus == 0:
            return Result.skip(f"none of the devices asked for ({ctx.options.devices}) is on this node",
                               "pass --devices with ids `npu-smi info` lists", **evidence)
        if allowed < need:
            fewer = allowed // per_npu
            return Result.fail(f"{allowed} allowed CPU(s) for {npus} NPU(s): vllm-ascend's CPU binding needs "
                               f"{per_npu} per NPU ({need}) and stops with \"The number of CPUs is insufficient\"",
                               f"give the service at least {need} CPUs (container: --cpuset-cpus/--cpus; systemd: "
                               f"CPUAffinity=), use at most {fewer} chip(s) (--devices), or turn the binding off "
                               "(--additional-config '{\"enable_cpu_binding\": false}')", **evidence)
        return Result.passed(f"{allowed} allowed CPUs for {npus} NPU(s) (≥ {per_npu} each)", **evidence)


# vllm-ascend's CPU binding (vllm_ascend/cpu_binding.py) places A2 and 310P workers by topology: each NPU's pool is
# its `npu-smi info -t topo` "CPU Affinity" intersected with Cpus_allowed_list, and an empty intersection raises
# "CPUs available in 'Cpus_allowed_list' conflict with NUMA affinity" (the worker logs it and runs unbound). A3 is
# bound by an even split of the cpuset instead (its "global_slice" mode), so there is no affinity to check there.
SLICED_FAMILIES = frozenset({"A3"})


@dataclass(frozen=True)
class NpuAffinity:
    """One chip's affine CPUs (its row of the topology) and the part of them this process may run on."""

    chip: Chip
    affine: tuple[int, ...]
    allowed: tuple[int, ...]


def npu_affinities(topo: NpuTopology, chips: list[Chip], allowed_cpus: tuple[int, ...]) -> list[NpuAffinity]:
    """Each chip's affinity, for the chips the topology has one for. Pure.

    Rows are matched to chips as vllm-ascend matches them: the n-th NPU row is logical NPU n, the id
    ASCEND_RT_VISIBLE_DEVICES uses (Chip.device_id).
    """
    allowed = set(allowed_cpus)
    by_row = topo.cpu_affinity
    found: list[NpuAffinity] = []
    for chip in chips:
        text = by_row[chip.device_id] if 0 <= chip.device_id < len(by_row) else None
        if not text:
            continue
        try:
            affine = parse_cpu_list(text)
        except ParseError:
            continue
        found.append(NpuAffinity(chip, affine, tuple(cpu for cpu in affine if cpu in allowed)))
    return found


class NpuCpuAffinity(Check):
    """On ARM hosts each NPU a launch uses has CPUs of its own NUMA affinity (`npu-smi info -t topo`) in the cpuset."""

    id = "npu-cpu-affinity"
    area = "host"
    severity = Severity.MEDIUM
    level = 1
    requires = ("npu-smi",)

    def run(self, ctx: CheckContext) -> Result:
        skipped = _skip_unless_arm_with_npus(ctx, "its CPU binding by NPU affinity")
        if skipped is not None:
            return skipped
        host = ctx.node.host
        chips = [c for c in ctx.selected_chips() if c.family not in SLICED_FAMILIES]
        if not chips:
            return Result.skip("no chip of this launch is bound by affinity (A3 chips get an even share of the "
                               "cpuset instead; cpuset-per-npu checks its size)", "nothing to do",
                               families=sorted({c.family or "?" for c in ctx.selected_chips()}))
        topo = self._topology(ctx)
        if isinstance(topo, Result):
            return topo
        affinities = npu_affinities(topo, chips, host.allowed_cpus)
        if not affinities:
            return Result.skip("`npu-smi info -t topo` gives no CPU Affinity for the chips of this launch: "
                               "vllm-ascend then splits the cpuset evenly", "nothing to do (cpuset-per-npu checks "
                               "the cpuset's size)", topology="no-affinity", devices=[c.device_id for c in chips])
        allowed = compact_cpu_list(host.allowed_cpus)
        outside = [a for a in affinities if not a.allowed]
        bound = [c for c in ctx.node.chips if c.family not in SLICED_FAMILIES]
        usable = [a.chip.device_id for a in npu_affinities(topo, bound, host.allowed_cpus) if a.allowed]
        evidence = {"allowed_cpus": allowed,
                    "affinity": {a.chip.device_id: compact_cpu_list(a.affine) for a in affinities},
                    "allowed_affine": {a.chip.device_id: len(a.allowed) for a in affinities},
                    "outside": [a.chip.device_id for a in outside], "devices_with_affine_cpus": usable}
        if outside:
            listing = ", ".join(f"device {a.chip.device_id} (CPUs {compact_cpu_list(a.affine)})" for a in outside)
            wanted = compact_cpu_list(sorted({cpu for a in affinities for cpu in a.affine}))
            return Result.warn(
                f"no CPU of the NUMA affinity of {listing} is in the allowed cpuset ({allowed}): vllm-ascend's CPU "
                "binding gives up for these NPUs (\"conflict with NUMA affinity\") and their workers run unbound",
                f"give the service the CPUs of its NPUs (container: --cpuset-cpus={wanted}; systemd: "
                f"CPUAffinity={wanted.replace(',', ' ')}), or use NPUs whose CPUs it has (--devices "
                f"{','.join(map(str, usable)) or '...'}); cpuset-per-npu says how many it needs", **evidence)
        return Result.passed(f"{len(affinities)} NPU(s) have CPUs of their NUMA affinity in the allowed cpuset "
                             f"({allowed})", **evidence)

    @staticmethod
    def _topology(ctx: CheckContext) -> NpuTopology | Result:
        result = ctx.probe.run(ctx.settings.npu_smi, "info", "-t", "topo")
        fallback = "nothing to do: vllm-ascend then splits the cpuset evenly (cpuset-per-npu checks its size)"
        if not result.ok:
            return Result.skip(f"`npu-smi info -t topo` did not answer ({result.describe()})", fallback,
                               topology="no-answer")
        try:
            return parse_npu_smi_topo(result.output)
        except ParseError as exc:
            return Result.skip(f"`npu-smi info -t topo` not understood: {exc}", fallback, topology="not-understood")


class NumaBalancing(Check):
    """Automatic NUMA balancing is off (kernel.numa_balancing = 0)."""

    id = "numa-balancing"
    area = "host"
    severity = Severity.MEDIUM
    level = 1

    def run(self, ctx: CheckContext) -> Result:
        path = "/proc/sys/kernel/numa_balancing"
        value = _read_int(ctx, path)
        if value is None:
            return Result.skip(f"no {path}: this kernel has no automatic NUMA balancing", "nothing to do",
                               path=path)
        if value == 0:
            return Result.passed("kernel.numa_balancing = 0", value=value)
        return Result.warn(f"kernel.numa_balancing = {value}: the kernel migrates the engine's pages between NUMA "
                           "nodes under load, adding latency jitter",
                           f"`sysctl -w kernel.numa_balancing=0` {SYSCTL_PERSIST}", value=value)


class CpuGovernor(Check):
    """Every CPU runs the `performance` frequency governor."""

    id = "cpu-governor"
    area = "host"
    severity = Severity.MEDIUM
    level = 1

    def run(self, ctx: CheckContext) -> Result:
        base = "/sys/devices/system/cpu"
        governors: dict[str, list[int]] = {}
        for name in ctx.probe.glob(base, "cpu[0-9]*"):
            text = ctx.probe.read_text(f"{base}/{name}/cpufreq/scaling_governor")
            if text is not None and name[3:].isdigit():
                governors.setdefault(text.strip() or "?", []).append(int(name[3:]))
        if not governors:
            return Result.skip("no cpufreq scaling governors (a VM, or firmware that owns the clock)",
                               "nothing to do here; set the BIOS power policy to performance on bare metal",
                               governors={})
        counts = {g: len(cpus) for g, cpus in sorted(governors.items())}
        others = {g: sorted(c) for g, c in governors.items() if g != "performance"}
        if not others:
            return Result.passed(f"all {counts['performance']} CPUs use the performance governor", governors=counts)
        first = {g: cpus[:8] for g, cpus in others.items()}
        return Result.warn("CPUs not on the performance governor: " + ", ".join(
                           f"{counts[g]} on {g}" for g in sorted(others)),
                           "`cpupower frequency-set -g performance` (or write performance to "
                           f"{base}/cpu*/cpufreq/scaling_governor) and persist it (npuops provision's host "
                           "tuning does both)",
                           governors=counts, examples=first)


class Swappiness(Check):
    """vm.swappiness is low, so the engine's memory is not swapped out."""

    id = "swappiness"
    area = "host"
    severity = Severity.LOW
    level = 1

    def run(self, ctx: CheckContext) -> Result:
        path = "/proc/sys/vm/swappiness"
        value = _read_int(ctx, path)
        limit = int(ctx.threshold("swappiness_max"))
        if value is None:
            return Result.skip(f"cannot read {path}", "check that /proc is mounted", path=path)
        if value <= limit:
            return Result.passed(f"vm.swappiness = {value} (≤ {limit})", value=value, max=limit)
        return Result.warn(f"vm.swappiness = {value} (> {limit}): the kernel swaps the engine's host memory out "
                           "under page-cache pressure (loading weights)",
                           f"`sysctl -w vm.swappiness=0` {SYSCTL_PERSIST}", value=value, max=limit)


class ShmSize(Check):
    """/dev/shm is large enough for the engine's shared-memory transport."""

    id = "shm-size"
    area = "host"
    severity = Severity.HIGH
    level = 1
    tags = ("gate",)

    def run(self, ctx: CheckContext) -> Result:
        host = ctx.node.host
        total, free = host.shm_total_bytes, host.shm_free_bytes
        low, good = int(ctx.threshold("shm_min_bytes")), int(ctx.threshold("shm_warn_bytes"))
        evidence = {"total_bytes": total, "free_bytes": free, "min_bytes": low, "recommended_bytes": good}
        fix = (f"give /dev/shm at least {gib(good)}: in a container `--shm-size={good // GIB}g` (or mount a tmpfs); "
               f"on a host `mount -o remount,size={good // GIB}G /dev/shm`")
        if total is None:
            return Result.fail("/dev/shm is missing or cannot be read", fix, **evidence)
        if total < low:
            return Result.fail(f"/dev/shm is {gib(total)} (< {gib(low)}): the engine core-dumps under load", fix,
                               **evidence)
        if total < good:
            return Result.warn(f"/dev/shm is {gib(total)} (< {gib(good)} recommended)", fix, **evidence)
        return Result.passed(f"/dev/shm is {gib(total)} ({gib(free)} free)", **evidence)


@dataclass(frozen=True)
class ModelWeights:
    files: int
    bytes: int
    kind: str  # "safetensors", "bin" or "none"


def _walk_files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        # Hidden dirs hold download metadata (.cache/huggingface), not weights.
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            yield Path(dirpath) / name


def model_weights(directory: Path) -> ModelWeights:
    """The weights vLLM would load from a model directory: its *.safetensors when there are any (vLLM prefers
    them), else its *.bin. Sizes follow symlinks (a Hugging Face cache snapshot links to its blobs)."""
    sizes: dict[str, list[int]] = {"safetensors": [], "bin": []}
    for path in _walk_files(directory):
        kind = path.suffix.lstrip(".")
        if kind in sizes:
            try:
                sizes[kind].append(path.stat().st_size)
            except OSError:
                continue
    for kind in ("safetensors", "bin"):
        if sizes[kind]:
            return ModelWeights(len(sizes[kind]), sum(sizes[kind]), kind)
    return ModelWeights(0, 0, "none")


def model_dir_on_host(ctx: CheckContext) -> tuple[str, Path] | None:
    """(--model-dir as the operator wrote it, where it is under Settings.root), or None without --model-dir."""
    given = ctx.options.model_dir
    if given is None:
        return None
    absolute = given if given.is_absolute() else given.absolute()
    return str(given), ctx.settings.host_path(absolute)


class FreeMemory(Check):
    """Host memory available is above the floor and, with --model-dir, holds the model's weights."""

    id = "free-memory"
    area = "host"
    severity = Severity.HIGH
    level = 1
    tags = ("gate",)

    def run(self, ctx: CheckContext) -> Result:
        host = ctx.node.host
        available, total = host.memory_available_bytes, host.memory_total_bytes
        floor = int(ctx.threshold("memory_available_min_bytes"))
        fraction = float(ctx.threshold("memory_available_warn_fraction"))
        evidence: dict[str, Any] = {"available_bytes": available, "total_bytes": total, "min_bytes": floor,
                                    "warn_fraction": fraction}
        if available is None:
            return Result.skip("MemAvailable is not in /proc/meminfo (kernel older than 3.14 or /proc not mounted)",
                               "check memory by hand with `free -g`", **evidence)
        free_fix = "stop what holds the memory (`ps aux --sort=-rss | head`), or drop caches before a launch"
        if available < floor:
            return Result.fail(f"{gib(available)} of host memory available (< {gib(floor)})", free_fix, **evidence)
        model = model_dir_on_host(ctx)
        if model is not None and model[1].is_dir():
            weights = model_weights(model[1])
            evidence.update(model_dir=model[0], weights_bytes=weights.bytes, weight_files=weights.files)
            if weights.bytes > available:
                return Result.warn(f"{gib(available)} available is less than the model's {gib(weights.bytes)} of "
                                   "weights: loading them evicts the page cache and runs slowly",
                                   free_fix + ", or load from faster storage", **evidence)
        if total and available < total * fraction:
            return Result.warn(f"only {gib(available)} of {gib(total)} host memory available "
                               f"(< {fraction:.0%})", free_fix, **evidence)
        return Result.passed(f"{gib(available)} of {gib(total)} host memory available", **evidence)


class ModelDisk(Check):
    """The model directory (--model-dir) exists, holds weights, and its filesystem has free space."""

    id = "model-disk"
    area = "host"
    severity = Severity.MEDIUM
    level = 2

    def run(self, ctx: CheckContext) -> Result:
        model = model_dir_on_host(ctx)
        if model is None:
            return Result.skip("no --model-dir given", "pass --model-dir DIR to check the model's directory")
        shown, path = model
        if not path.exists():
            return Result.fail(f"model directory {shown} does not exist",
                               f"download the model to {shown}, or pass the directory it is in", model_dir=shown,
                               exists=False)
        if not path.is_dir():
            return Result.fail(f"{shown} is not a directory", "pass the directory that holds config.json and the "
                               "weights", model_dir=shown, is_dir=False)
        weights = model_weights(path)
        need = int(ctx.threshold("model_disk_min_free_bytes"))
        try:
            st = os.statvfs(path)
        except OSError as exc:
            return Result.fail(f"cannot stat the filesystem of {shown}: {exc.strerror}",
                               "check the mount (`df -h DIR`)", model_dir=shown)
        free = st.f_bavail * st.f_frsize
        evidence = {"model_dir": shown, "free_bytes": free, "min_free_bytes": need, "weights_bytes": weights.bytes,
                    "weight_files": weights.files, "weight_format": weights.kind}
        if weights.files == 0:
            return Result.warn(f"{shown} has no *.safetensors or *.bin weights", "finish the download (the "
                               "weights, not only config.json), or pass the directory that holds them", **evidence)
        if free < need:
            return Result.warn(f"{gib(free)} free on the filesystem of {shown} (< {gib(need)}): compile caches and "
                               "logs need room", "free space there or move the model to a larger filesystem",
                               **evidence)
        return Result.passed(f"{shown}: {weights.files} {weights.kind} file(s), {gib(weights.bytes)}; "
                             f"{gib(free)} free", **evidence)


class OpenFiles(Check):
    """The open-file limit (soft RLIMIT_NOFILE) is high enough for the engine's sockets and weight shards."""

    id = "open-files"
    area = "host"
    severity = Severity.MEDIUM
    level = 1

    def run(self, ctx: CheckContext) -> Result:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        need = int(ctx.threshold("open_files_min"))

        def show(n: int) -> str | int:
            return "unlimited" if n == resource.RLIM_INFINITY else n

        evidence = {"soft": show(soft), "hard": show(hard), "min": need,
                    "note": "the limit of this process; a systemd unit sets its own with LimitNOFILE="}
        if soft == resource.RLIM_INFINITY or soft >= need:
            return Result.passed(f"open-file limit {show(soft)} (≥ {need})", **evidence)
        raise_hard = "" if hard == resource.RLIM_INFINITY or hard >= need else f" (the hard limit {hard} too)"
        return Result.warn(f"open-file limit {soft} (< {need}): a busy server runs out of file descriptors",
                           f"raise it to {need}{raise_hard}: LimitNOFILE={need} in the unit, `ulimit -n {need}` in a "
                           f"shell, `--ulimit nofile={need}:{need}` for a container, or nofile in "
                           "/etc/security/limits.conf", **evidence)
