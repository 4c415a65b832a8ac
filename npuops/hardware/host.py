"""Host facts (CPU, NUMA, cpuset, memory, /dev/shm, OS, device nodes, PCI, network interfaces): pure parsers plus
one reader."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from npuops.hardware.chips import HUAWEI_PCI_VENDOR_ID, chip_catalog
from npuops.hardware.cpu_features import CpuFeatures, parse_cpu_features
from npuops.hardware.probe import Probe
from npuops.parsing import ParseError
from npuops.wire import WireObject

# The device nodes a serving process needs besides one /dev/davinciN per chip (vllm-ascend's container commands,
# e.g. docs/source/tutorials/features/ray.md: --device /dev/davinci_manager /dev/devmm_svm /dev/hisi_hdc).
CONTROL_DEVICE_NODES = ("davinci_manager", "devmm_svm", "hisi_hdc")


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parse the kernel's cpulist format ("0-3,8,10-11") into sorted CPU numbers."""
    cpus: set[int] = set()
    stripped = text.strip()
    if not stripped:
        return ()
    for part in stripped.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?(?::(\d+)/\d+)?", part)
        if not m:
            raise ParseError("cpu list", f"{part!r} is not N or N-M", 1, text)
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else first
        if last < first or last - first > 65536:
            raise ParseError("cpu list", f"range {part!r} is reversed or absurd", 1, text)
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes per key."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^(\S+):\s+(\d+)(?:\s+kB)?\s*$", line)
        if m:
            unit = 1024 if line.rstrip().endswith("kB") else 1
            values[m.group(1)] = int(m.group(2)) * unit
    return values


def parse_os_release(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Z0-9_]+)=(.*)$", line.strip())
        if m:
            values[m.group(1)] = m.group(2).strip().strip('"').strip("'")
    return values


def parse_cpu_model(cpuinfo: str) -> str | None:
    """The CPU model from /proc/cpuinfo: "model name" on x86, "CPU implementer/part" on ARM (Kunpeng)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model Name", "Hardware") and value.strip():
            return value.strip()
    implementer = part = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "CPU implementer":
            implementer = value.strip()
        elif key.strip() == "CPU part":
            part = value.strip()
    if implementer and part:
        # 0x48 is HiSilicon; part 0xd01 is the Kunpeng 920 in Atlas servers.
        if implementer.lower() == "0x48" and part.lower() == "0xd01":
            return "HiSilicon Kunpeng-920"
        return f"ARM implementer {implementer} part {part}"
    return None


def parse_status_cpus_allowed(status: str) -> tuple[int, ...] | None:
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.split(":", 1)[1])
    return None


@dataclass(frozen=True)
class NumaNode:
    node_id: int
    cpus: tuple[int, ...]
    memory_bytes: int | None

    @classmethod
    def from_json(cls, data: object) -> NumaNode:
        node = WireObject.wrap(data, "NUMA node")
        return cls(node.req_integer("node_id"), node.integers("cpus"), node.opt_integer("memory_bytes"))


@dataclass(frozen=True)
class PciDevice:
    address: str
    vendor_id: str
    device_id: str

    @classmethod
    def from_json(cls, data: object) -> PciDevice:
        device = WireObject.wrap(data, "PCI device")
        return cls(device.req_text("address"), device.text("vendor_id"), device.text("device_id"))


@dataclass(frozen=True)
class NetInterface:
    """A network interface of the host (loopback excluded): what HCCL_IF_IP / GLOO_SOCKET_IFNAME can name."""

    name: str
    ipv4: tuple[str, ...]  # "10.1.2.3/24", in the order the kernel lists them
    up: bool

    @classmethod
    def from_json(cls, data: object) -> NetInterface:
        interface = WireObject.wrap(data, "network interface")
        # `up` came with the interfaces themselves; an entry without it is taken as up, as the fleet doctor always
        # read such entries.
        return cls(interface.req_text("name"), interface.texts("ipv4"), interface.flag("up", True))


def _ipv4_with_prefix(address: str, netmask: str | None) -> str | None:
    """An address and its netmask as "10.1.2.3/24"; the bare address when the netmask is unknown; None for
    something that is not an IPv4 address."""
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    if not netmask:
        return str(ip)
    try:
        return str(ipaddress.IPv4Interface(f"{ip}/{netmask}"))
    except ValueError:
        return str(ip)


def interfaces_from_psutil(addrs: Mapping[str, Iterable[Any]], stats: Mapping[str, Any]) -> tuple[NetInterface, ...]:
    """Turn psutil.net_if_addrs() and psutil.net_if_stats() into NetInterfaces, loopback left out. Pure.

    `addrs` maps a name to records with `family`, `address`, `netmask`; `stats` a name to records with `isup` and
    (psutil >= 5.9.3) `flags`. An interface with addresses but no stats entry is reported down.
    """
    interfaces: list[NetInterface] = []
    for name in sorted(set(addrs) | set(stats)):
        ipv4: list[str] = []
        for record in addrs.get(name, ()):
            if getattr(record, "family", None) != socket.AF_INET:
                continue
            formatted = _ipv4_with_prefix(str(getattr(record, "address", "")), getattr(record, "netmask", None))
            if formatted is not None:
                ipv4.append(formatted)
        stat = stats.get(name)
        flags = str(getattr(stat, "flags", "") or "").split(",")
        all_loopback = bool(ipv4) and all(ipaddress.IPv4Interface(a).ip.is_loopback for a in ipv4)
        # psutil names the loopback flag where it can; "lo" and 127.0.0.0/8-only interfaces cover older psutil.
        if "loopback" in flags or name == "lo" or all_loopback:
            continue
        interfaces.append(NetInterface(name=name, ipv4=tuple(ipv4), up=bool(getattr(stat, "isup", False))))
    return tuple(interfaces)


def read_net_interfaces() -> tuple[NetInterface, ...]:
    """This machine's interfaces through psutil (getifaddrs, not files, so Settings.root does not apply); empty
    when psutil cannot tell."""
    try:
        import psutil

        return interfaces_from_psutil(psutil.net_if_addrs(), psutil.net_if_stats())
    except Exception:  # noqa: BLE001 - host facts never raise; no interfaces is the honest answer
        return ()


@dataclass(frozen=True)
class HostFacts:
    hostname: str | None
    cpu_model: str | None
    cpu_count: int
    numa_nodes: tuple[NumaNode, ...]
    allowed_cpus: tuple[int, ...]
    memory_total_bytes: int | None
    memory_available_bytes: int | None
    shm_total_bytes: int | None
    shm_free_bytes: int | None
    os_name: str | None
    os_version: str | None
    kernel: str | None
    arch: str
    device_nodes: tuple[str, ...]  # names under /dev: davinciN and the control nodes present
    npu_pci_devices: tuple[PciDevice, ...]  # Huawei (0x19e5) PCI functions
    interfaces: tuple[NetInterface, ...] = ()  # network interfaces except loopback
    # What the CPU computes fast (npuops/hardware/cpu_features.py); None from a sender older than it.
    cpu: CpuFeatures | None = None

    @property
    def davinci_chips(self) -> tuple[int, ...]:
        ids = [int(n[len("davinci") :]) for n in self.device_nodes if re.fullmatch(r"davinci\d+", n)]
        return tuple(sorted(ids))

    @property
    def missing_control_nodes(self) -> tuple[str, ...]:
        return tuple(n for n in CONTROL_DEVICE_NODES if n not in self.device_nodes)

    @classmethod
    def from_json(cls, data: object) -> HostFacts:
        """The node model's `host` (npuops/hardware/node.py writes it); `davinci_chips` and `allowed_cpu_count` there
        are derived, so they are not read back. A sender older than the interfaces gives none."""
        host = WireObject.wrap(data, "host facts")
        return cls(
            hostname=host.opt_text("hostname"),
            cpu_model=host.opt_text("cpu_model"),
            cpu_count=host.integer("cpu_count"),
            numa_nodes=tuple(NumaNode.from_json(n) for n in host.objects("numa_nodes")),
            allowed_cpus=host.integers("allowed_cpus"),
            memory_total_bytes=host.opt_integer("memory_total_bytes"),
            memory_available_bytes=host.opt_integer("memory_available_bytes"),
            shm_total_bytes=host.opt_integer("shm_total_bytes"),
            shm_free_bytes=host.opt_integer("shm_free_bytes"),
            os_name=host.opt_text("os_name"),
            os_version=host.opt_text("os_version"),
            kernel=host.opt_text("kernel"),
            arch=host.text("arch"),
            device_nodes=host.texts("device_nodes"),
            npu_pci_devices=tuple(PciDevice.from_json(d) for d in host.objects("npu_pci_devices")),
            interfaces=tuple(NetInterface.from_json(i) for i in host.objects("interfaces")),
            cpu=_cpu_from_json(host),
        )


def _cpu_from_json(host: WireObject) -> CpuFeatures | None:
    """The node model's `cpu` (its derived keys, native_bf16 and vector_isa, are not read back)."""
    cpu = host.opt_obj("cpu")
    if cpu is None:
        return None
    ghz = cpu.opt_number("ghz")
    return CpuFeatures(frozenset(cpu.texts("flags")), max(1, cpu.integer("threads_per_core", 1)),
                       float(ghz) if ghz is not None else None)


def _read_cpu_list(probe: Probe, path: str) -> tuple[int, ...] | None:
    text = probe.read_text(path)
    if text is None:
        return None
    try:
        return parse_cpu_list(text)
    except ParseError:
        return None


def _statvfs(probe: Probe, path: str) -> tuple[int | None, int | None]:
    try:
        st = os.statvfs(probe.settings.host_path(path))
    except OSError:
        return None, None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def read_host_facts(probe: Probe) -> HostFacts:
    cpuinfo = probe.read_text("/proc/cpuinfo") or ""
    online = _read_cpu_list(probe, "/sys/devices/system/cpu/online")
    cpu_count = len(online) if online else sum(1 for ln in cpuinfo.splitlines() if ln.startswith("processor"))

    numa: list[NumaNode] = []
    for name in probe.glob("/sys/devices/system/node", "node[0-9]*"):
        node_id = int(name[4:])
        cpus = _read_cpu_list(probe, f"/sys/devices/system/node/{name}/cpulist") or ()
        node_meminfo = probe.read_text(f"/sys/devices/system/node/{name}/meminfo") or ""
        m = re.search(r"MemTotal:\s+(\d+)\s*kB", node_meminfo)
        numa.append(NumaNode(node_id, cpus, int(m.group(1)) * 1024 if m else None))
    numa.sort(key=lambda n: n.node_id)

    status = probe.read_text("/proc/self/status") or ""
    try:
        allowed = parse_status_cpus_allowed(status)
    except ParseError:
        allowed = None
    meminfo = parse_meminfo(probe.read_text("/proc/meminfo") or "")
    shm_total, shm_free = _statvfs(probe, "/dev/shm")
    os_release = parse_os_release(probe.read_text("/etc/os-release") or "")
    kernel = (probe.read_text("/proc/sys/kernel/osrelease") or "").strip() or None
    hostname = (probe.read_text("/proc/sys/kernel/hostname") or "").strip() or None

    device_nodes = tuple(
        probe.glob("/dev", "davinci[0-9]*") + [n for n in CONTROL_DEVICE_NODES if probe.exists(f"/dev/{n}")]
    )
    # Huawei also makes NICs (vendor 0x19e5 too): keep only the device ids of NPUs in the chip catalog.
    # (An SoC board's chip, the 310B, has no PCI device id: "" in the catalog, never matched.)
    npu_device_ids = {spec.pci_device_id.lower() for spec in chip_catalog().values() if spec.pci_device_id}
    pci: list[PciDevice] = []
    for address in probe.glob("/sys/bus/pci/devices", "*"):
        vendor = (probe.read_text(f"/sys/bus/pci/devices/{address}/vendor") or "").strip().lower()
        if vendor != HUAWEI_PCI_VENDOR_ID:
            continue
        device = (probe.read_text(f"/sys/bus/pci/devices/{address}/device") or "").strip().lower()
        if device not in npu_device_ids:
            continue
        pci.append(PciDevice(address, vendor, device))

    return HostFacts(
        hostname=hostname,
        cpu_model=parse_cpu_model(cpuinfo),
        cpu_count=cpu_count,
        numa_nodes=tuple(numa),
        allowed_cpus=allowed or (online or ()),
        memory_total_bytes=meminfo.get("MemTotal"),
        memory_available_bytes=meminfo.get("MemAvailable"),
        shm_total_bytes=shm_total,
        shm_free_bytes=shm_free,
        os_name=os_release.get("ID"),
        os_version=os_release.get("VERSION_ID"),
        kernel=kernel,
        arch=probe.machine(),
        device_nodes=device_nodes,
        npu_pci_devices=tuple(pci),
        interfaces=read_net_interfaces(),
        cpu=parse_cpu_features(cpuinfo),
    )
