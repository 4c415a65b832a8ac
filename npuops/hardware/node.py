"""The node model: one picture of an Ascend node that doctor, plan, launch and provision all consume.

Built from the vendor tool outputs and files through a Probe, without importing torch or vllm.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import ipaddress
from dataclasses import dataclass, field
from typing import Any

from npuops.hardware.chips import ChipSpec, chip_by_name
from npuops.hardware.hccn import NO_NIC_FAMILIES, parse_hccn_ip
from npuops.hardware.host import HostFacts, read_host_facts
from npuops.hardware.npu_smi import NpuSmiChip, NpuSmiFailed, NpuSmiProcess, parse_npu_smi_info
from npuops.hardware.probe import CommandResult, Probe
from npuops.hardware.python_stack import PythonStack, read_python_stack
from npuops.hardware.versions import (
    DriverVersionInfo,
    FirmwareVersionInfo,
    ToolkitInstallInfo,
    parse_ascend_install_info,
    parse_driver_version_info,
    parse_firmware_version_info,
    parse_nnal_version_info,
    parse_toolkit_install_info,
    parse_version_cfg,
)
from npuops.parsing import ParseError
from npuops.wire import WireObject

INSTALL_INFO = "/etc/ascend_install.info"
DRIVER_REMEDIATION = (
    "install the Ascend NPU driver and firmware (`npuops provision --tags driver`), "
    "or in a container mount /dev/davinci*, /dev/davinci_manager, /dev/devmm_svm, /dev/hisi_hdc, "
    "/usr/local/sbin/npu-smi and /usr/local/Ascend/driver"
)
# The errors of an npu-smi that did not run at all (every other status comes from running it).
NPU_SMI_MISSING = "npu-smi-missing"
NPU_SMI_NOT_RUN = "npu-smi-not-run"
# What a node model is called in errors about one that is not.
NODE_MODEL = "node model"


@dataclass(frozen=True)
class NpuSmiStatus:
    """What running `npu-smi info` gave: versions, or a typed error."""

    ran: bool
    tool_version: str | None = None
    driver_version: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    remediation: str | None = None
    elided: bool = False

    def to_json(self) -> dict[str, Any]:
        error = None
        if self.error_code is not None:
            error = {"code": self.error_code, "message": self.error_message or "",
                     "remediation": self.remediation or ""}
        return {"version": self.tool_version, "driver_version": self.driver_version, "error": error,
                "elided": self.elided}

    @classmethod
    def from_json(cls, data: object) -> NpuSmiStatus:
        smi = WireObject.wrap(data, NODE_MODEL)
        error = smi.opt_obj("error")
        code = error.req_text("code") if error is not None else None
        return cls(
            # Not in the JSON: npu-smi ran unless it was missing or could not be started.
            ran=code not in (NPU_SMI_MISSING, NPU_SMI_NOT_RUN),
            tool_version=smi.opt_text("version"),
            driver_version=smi.opt_text("driver_version"),
            error_code=code,
            error_message=error.text("message") if error is not None else None,
            remediation=error.text("remediation") if error is not None else None,
            elided=smi.flag("elided"),
        )


@dataclass(frozen=True)
class Chip:
    """One NPU chip (die) as npu-smi shows it, with its catalog facts when the name is known."""

    smi: NpuSmiChip
    spec: ChipSpec | None
    # The IPv4 address of the chip's NPU NIC (`hccn_tool -i <device_id> -ip -g`); None when the chip has no NIC,
    # hccn_tool is missing or hung, or its answer gave no usable address.
    nic_ip: str | None = None

    @property
    def device_id(self) -> int:
        """The id ASCEND_RT_VISIBLE_DEVICES and /dev/davinciN use: the Phy-ID/Device column where shown
        (A3 dies, 310P Duo chips), else the NPU id (one chip per NPU on A2)."""
        return self.smi.logical_id if self.smi.logical_id is not None else self.smi.npu_id

    @property
    def family(self) -> str | None:
        return self.spec.family if self.spec else None

    @property
    def has_nic(self) -> bool:
        """Whether the chip has an NPU NIC to ask hccn_tool about (a chip npuops does not know is asked)."""
        return self.family not in NO_NIC_FAMILIES

    @property
    def device_memory_total_mb(self) -> int | None:
        """HBM where the table has it, else the device memory column (310P has only that)."""
        return self.smi.hbm_total_mb if self.smi.hbm_total_mb is not None else self.smi.memory_total_mb

    @property
    def device_memory_used_mb(self) -> int | None:
        return self.smi.hbm_used_mb if self.smi.hbm_total_mb is not None else self.smi.memory_used_mb

    def to_json(self) -> dict[str, Any]:
        s = self.smi
        return {
            "npu_id": s.npu_id,
            "chip_id": s.chip_id,
            "logical_id": s.logical_id,
            "name": s.name,
            "family": self.family,
            "health": s.health,
            "bus_id": s.bus_id,
            "power_w": s.power_w,
            "temperature_c": s.temperature_c,
            "aicore_percent": s.aicore_percent,
            "memory_used_mb": s.memory_used_mb,
            "memory_total_mb": s.memory_total_mb,
            "hbm_used_mb": s.hbm_used_mb,
            "hbm_total_mb": s.hbm_total_mb,
            "hugepages_used": s.hugepages_used,
            "hugepages_total": s.hugepages_total,
            "device_id": self.device_id,
            "nic_ip": self.nic_ip,
        }

    @classmethod
    def from_json(cls, data: object) -> Chip:
        """A chip of the node model; its catalog facts (family) and device id are worked out again from the npu-smi
        columns, as on the node itself."""
        chip = WireObject.wrap(data, NODE_MODEL)
        smi = NpuSmiChip.from_json(chip)
        return cls(smi, chip_by_name(smi.name), chip.opt_text("nic_ip"))


@dataclass(frozen=True)
class InstalledComponent:
    """An Ascend software component found on disk (or not), with where the answer came from."""

    installed: bool
    version: str | None = None
    path: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"installed": self.installed, "version": self.version, "path": self.path, **self.details}

    @classmethod
    def from_json(cls, data: object, *, not_details: tuple[str, ...] = ()) -> InstalledComponent:
        """Every key but installed, version, path (and `not_details`, keys its container adds) is a detail."""
        component = WireObject.wrap(data, NODE_MODEL)
        own = ("installed", "version", "path", *not_details)
        return cls(component.flag("installed"), component.opt_text("version"), component.opt_text("path"),
                   {k: v for k, v in component.data.items() if k not in own})


@dataclass(frozen=True)
class CannInstall:
    toolkit: InstalledComponent
    layout: str | None  # "ascend-toolkit" (<= 8.3) or "cann" (>= 8.5)
    kernels: InstalledComponent
    nnal: InstalledComponent
    toolbox: InstalledComponent
    set_env_scripts: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "installed": self.toolkit.installed,
            "version": self.toolkit.version,
            "layout": self.layout,
            "toolkit": self.toolkit.to_json(),
            "kernels": self.kernels.to_json(),
            "nnal": self.nnal.to_json(),
            "toolbox": self.toolbox.to_json(),
            "set_env_scripts": list(self.set_env_scripts),
        }

    @classmethod
    def from_json(cls, data: object) -> CannInstall:
        """The node model's `cann`; its top-level installed and version are the toolkit's."""
        cann = WireObject.wrap(data, NODE_MODEL)
        return cls(
            toolkit=InstalledComponent.from_json(cann.obj("toolkit")),
            layout=cann.opt_text("layout"),
            kernels=InstalledComponent.from_json(cann.obj("kernels")),
            nnal=InstalledComponent.from_json(cann.obj("nnal")),
            toolbox=InstalledComponent.from_json(cann.obj("toolbox")),
            set_env_scripts=cann.texts("set_env_scripts"),
        )


@dataclass(frozen=True)
class Node:
    npu_smi: NpuSmiStatus
    chips: tuple[Chip, ...]
    processes: tuple[NpuSmiProcess, ...]
    driver: InstalledComponent
    firmware: InstalledComponent
    driver_install_path: str | None
    cann: CannInstall
    python_stack: PythonStack
    host: HostFacts

    @property
    def has_npus(self) -> bool:
        return bool(self.chips)

    def no_npu_reasons(self) -> list[str]:
        """Why this node shows no usable NPU, in the order an operator would look."""
        reasons: list[str] = []
        if self.npu_smi.error_code == NPU_SMI_MISSING:
            reasons.append("no `npu-smi` on PATH")
        elif self.npu_smi.error_code is not None:
            reasons.append(f"`npu-smi info` failed: {self.npu_smi.error_message}")
        if not self.driver.installed:
            reasons.append(f"no driver version.info under {self.driver.path}")
        if not self.host.davinci_chips:
            reasons.append("no /dev/davinci* device nodes")
        if not self.host.npu_pci_devices:
            reasons.append("no Ascend NPU on the PCI bus")
        if self.npu_smi.ran and self.npu_smi.error_code is None and not self.chips:
            reasons.append("`npu-smi info` listed no chips")
        return reasons

    def chip_names(self) -> list[str]:
        return sorted({c.smi.name for c in self.chips})

    def to_json(self) -> dict[str, Any]:
        stack = self.python_stack
        return {
            "npu_smi": self.npu_smi.to_json(),
            "npu": {"found": self.has_npus, "reasons": [] if self.has_npus else self.no_npu_reasons()},
            "chips": [c.to_json() for c in self.chips],
            "processes": [
                {"npu_id": p.npu_id, "chip_id": p.chip_id, "pid": p.pid, "name": p.name, "memory_mb": p.memory_mb,
                 "container_pid": p.container_pid}
                for p in self.processes
            ],
            "driver": {**self.driver.to_json(), "install_path": self.driver_install_path},
            "firmware": self.firmware.to_json(),
            "cann": self.cann.to_json(),
            "python_stack": {
                "python": stack.python,
                "executable": stack.executable,
                "packages": dict(stack.versions),
                "distributions": dict(stack.distributions),
                "error": stack.error,
            },
            "host": _host_json(self.host),
        }

    @classmethod
    def from_json(cls, data: object) -> Node:
        """A node model as `npuops node --json` prints it, here or on another host. Keys an older npuops did not send
        (a chip's device_id and nic_ip, the host's interfaces, ...) take their defaults; `npu` is derived, so it is
        only required, as one of the two keys that tell a node model from other JSON. Anything else is a
        WireFormatError naming the key."""
        node = WireObject.wrap(data, NODE_MODEL)
        node.require("npu", "host")
        driver = node.obj("driver")
        return cls(
            npu_smi=NpuSmiStatus.from_json(node.obj("npu_smi")),
            chips=tuple(Chip.from_json(c) for c in node.objects("chips")),
            processes=tuple(NpuSmiProcess.from_json(p) for p in node.objects("processes")),
            driver=InstalledComponent.from_json(driver, not_details=("install_path",)),
            firmware=InstalledComponent.from_json(node.obj("firmware")),
            driver_install_path=driver.opt_text("install_path"),
            cann=CannInstall.from_json(node.obj("cann")),
            python_stack=PythonStack.from_json(node.obj("python_stack")),
            host=HostFacts.from_json(node.obj("host")),
        )


def _host_json(host: HostFacts) -> dict[str, Any]:
    data = dataclasses.asdict(host)
    data["numa_nodes"] = [
        {"node_id": n.node_id, "cpus": list(n.cpus), "memory_bytes": n.memory_bytes} for n in host.numa_nodes
    ]
    data["allowed_cpus"] = list(host.allowed_cpus)
    data["allowed_cpu_count"] = len(host.allowed_cpus)
    data["device_nodes"] = list(host.device_nodes)
    data["davinci_chips"] = list(host.davinci_chips)
    data["npu_pci_devices"] = [dataclasses.asdict(d) for d in host.npu_pci_devices]
    data["interfaces"] = [{"name": i.name, "ipv4": list(i.ipv4), "up": i.up} for i in host.interfaces]
    data["cpu"] = host.cpu.to_json() if host.cpu is not None else None
    return data


# --- reading the pieces -------------------------------------------------------------------------


def interpret_npu_smi(result: CommandResult) -> tuple[NpuSmiStatus, tuple[Chip, ...], tuple[NpuSmiProcess, ...]]:
    """Turn the result of `npu-smi info` into a status, chips and processes. Pure."""
    if result.missing:
        return (
            NpuSmiStatus(False, error_code=NPU_SMI_MISSING, error_message="npu-smi not found on PATH",
                         remediation=DRIVER_REMEDIATION),
            (), (),
        )
    if result.error is not None:
        return (
            NpuSmiStatus(False, error_code=NPU_SMI_NOT_RUN, error_message=result.describe(),
                         remediation="check that npu-smi is executable and the driver responds "
                                     "(`dmesg | grep -i davinci`)"),
            (), (),
        )
    try:
        info = parse_npu_smi_info(result.output)
    except NpuSmiFailed as failed:
        f = failed.failure
        return NpuSmiStatus(True, error_code=f.code, error_message=f"{f.message}: {f.meaning}",
                            remediation=f.remediation), (), ()
    except ParseError as exc:
        if result.returncode != 0:
            message = f"`npu-smi info` exited {result.returncode}: {' '.join(result.output.split())[:200]}"
        else:
            message = str(exc)
        return (
            NpuSmiStatus(True, error_code="npu-smi-unparseable", error_message=message,
                         remediation="run `npu-smi info` by hand; if it prints a table, report its output to npuops"),
            (), (),
        )
    chips = tuple(Chip(c, chip_by_name(c.name)) for c in info.chips)
    status = NpuSmiStatus(True, tool_version=info.tool_version, driver_version=info.driver_version, elided=info.elided)
    return status, chips, info.processes


def _read_component(probe: Probe, path: str, parse: Any) -> tuple[Any | None, str | None]:
    text = probe.read_text(path)
    if text is None:
        return None, None
    try:
        return parse(text), None
    except ParseError as exc:
        return None, str(exc)


def read_driver(probe: Probe) -> tuple[InstalledComponent, InstalledComponent, str | None]:
    install_path: str | None = None
    info, _ = _read_component(probe, INSTALL_INFO, parse_ascend_install_info)
    if info is not None:
        install_path = info.driver_install_path
    base = install_path or str(probe.settings.ascend_root)
    driver_file = f"{base.rstrip('/')}/driver/version.info"
    firmware_file = f"{base.rstrip('/')}/firmware/version.info"
    driver_info: DriverVersionInfo | None
    driver_info, driver_error = _read_component(probe, driver_file, parse_driver_version_info)
    fw_info: FirmwareVersionInfo | None
    fw_info, fw_error = _read_component(probe, firmware_file, parse_firmware_version_info)
    driver = InstalledComponent(
        installed=driver_info is not None,
        version=driver_info.version if driver_info else None,
        path=driver_file,
        details={
            "package_version": driver_info.package_version if driver_info else None,
            "compatible_firmware": list(driver_info.compatible_firmware)
            if driver_info and driver_info.compatible_firmware else None,
            "error": driver_error,
        },
    )
    firmware = InstalledComponent(
        installed=fw_info is not None,
        version=fw_info.version if fw_info else None,
        path=firmware_file,
        details={"package_version": fw_info.package_version if fw_info else None, "error": fw_error},
    )
    return driver, firmware, install_path


def _arch_dir(probe: Probe) -> str:
    machine = probe.machine()
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(machine, machine) + "-linux"


def read_cann(probe: Probe) -> CannInstall:
    root = str(probe.settings.ascend_root).rstrip("/")
    arch_dir = _arch_dir(probe)
    candidates = [
        ("cann", f"{root}/cann/{arch_dir}/ascend_toolkit_install.info"),
        ("ascend-toolkit", f"{root}/ascend-toolkit/latest/{arch_dir}/ascend_toolkit_install.info"),
    ]
    toolkit = InstalledComponent(False, path=candidates[1][1])
    layout: str | None = None
    for name, path in candidates:
        info: ToolkitInstallInfo | None
        info, error = _read_component(probe, path, parse_toolkit_install_info)
        if info is not None or error is not None:
            layout = name
            toolkit = InstalledComponent(
                installed=info is not None,
                version=info.version if info else None,
                path=path,
                details={"inner_version": info.inner_version if info else None, "error": error},
            )
            break

    # Kernels/ops: <= 8.3 records the opp_kernel component in version.cfg; >= 8.5 ships an ops info file.
    kernels = InstalledComponent(False)
    if layout == "cann":
        ops_path = f"{root}/cann/{arch_dir}/ascend_ops_install.info"
        ops, error = _read_component(probe, ops_path, parse_toolkit_install_info)
        kernels = InstalledComponent(ops is not None, ops.version if ops else None, ops_path,
                                     {"package_name": ops.package_name if ops else None, "error": error})
    else:
        cfg_path = f"{root}/ascend-toolkit/latest/version.cfg"
        cfg, error = _read_component(probe, cfg_path, parse_version_cfg)
        version = cfg.installed.get("opp_kernel") if cfg else None
        kernels = InstalledComponent(version is not None, version, cfg_path, {"error": error})

    nnal_path = f"{root}/nnal/atb/latest/version.info"
    nnal_info, nnal_error = _read_component(probe, nnal_path, parse_nnal_version_info)
    nnal = InstalledComponent(nnal_info is not None, nnal_info.version if nnal_info else None, nnal_path,
                              {"build": nnal_info.build_version if nnal_info else None, "error": nnal_error})

    toolbox_env = f"{root}/toolbox/set_env.sh"
    toolbox = InstalledComponent(probe.exists(toolbox_env), None, toolbox_env)

    scripts = [f"{root}/{layout or 'ascend-toolkit'}/set_env.sh", f"{root}/nnal/atb/set_env.sh", toolbox_env]
    present = tuple(s for s in scripts if probe.exists(s))
    return CannInstall(toolkit, layout, kernels, nnal, toolbox, present)


# `hccn_tool -ip -g` only reads the NIC's configuration; one that takes longer than this is hung, and the node model
# (read at doctor level 1 and by `npuops node`) must not wait on it.
NIC_IP_TIMEOUT_S = 5.0


def interpret_hccn_ip(result: CommandResult) -> str | None:
    """The NIC address from the result of `hccn_tool -i N -ip -g`, or None when there is none to trust (a failed
    query, an unparseable answer, no address, or one that is not an IPv4 address, e.g. redacted). Pure."""
    if not result.ok:
        return None
    try:
        address = parse_hccn_ip(result.output).address
    except ParseError:
        return None
    try:
        return str(ipaddress.IPv4Address(address or ""))
    except ValueError:
        return None


def read_nic_ips(probe: Probe, chips: tuple[Chip, ...]) -> tuple[Chip, ...]:
    """The chips with their NPU NIC address filled in. One chip at a time (vendor docs warn that hccn_tool answers
    "hccn_tool is busy, please try again" to concurrent callers), and none after a missing or hung hccn_tool, which
    would only fail the same way for every chip."""
    out: list[Chip] = []
    stopped = False
    for chip in chips:
        if stopped or not chip.has_nic:
            out.append(chip)
            continue
        result = probe.run(probe.settings.hccn_tool, "-i", str(chip.device_id), "-ip", "-g",
                           timeout=min(NIC_IP_TIMEOUT_S, probe.settings.command_timeout_s))
        stopped = result.missing or result.error is not None
        out.append(dataclasses.replace(chip, nic_ip=interpret_hccn_ip(result)))
    return tuple(out)


def _read_npus(probe: Probe) -> tuple[NpuSmiStatus, tuple[Chip, ...], tuple[NpuSmiProcess, ...]]:
    status, chips, processes = interpret_npu_smi(probe.run(probe.settings.npu_smi, "info"))
    return status, read_nic_ips(probe, chips), processes


def discover_node(probe: Probe) -> Node:
    """Read everything about this node; the slow parts (npu-smi then the NICs' addresses, the stack lookup, the
    host) run concurrently."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        npus_future = pool.submit(_read_npus, probe)
        stack_future = pool.submit(read_python_stack, probe)
        host_future = pool.submit(read_host_facts, probe)
        driver, firmware, install_path = read_driver(probe)
        cann = read_cann(probe)
        status, chips, processes = npus_future.result()
        stack = stack_future.result()
        host = host_future.result()
    return Node(status, chips, processes, driver, firmware, install_path, cann, stack, host)
