"""Driver and devices: is the Ascend driver installed, does npu-smi answer, are the device nodes there."""

from __future__ import annotations

from npuops.doctor.common import skip_without_npus
from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity
from npuops.hardware.host import CONTROL_DEVICE_NODES
from npuops.hardware.node import DRIVER_REMEDIATION


class DriverInstalled(Check):
    """The Ascend NPU driver is installed (driver/version.info present and readable)."""

    id = "driver-installed"
    area = "driver"
    severity = Severity.CRITICAL
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        node = ctx.node
        driver = node.driver
        error = driver.details.get("error")
        if error:
            return Result.fail(f"{driver.path} is unreadable: {error}",
                               "reinstall the driver (`npuops provision --tags driver`)", path=driver.path)
        if not driver.installed:
            return Result.fail(f"no Ascend driver: {driver.path} is missing", DRIVER_REMEDIATION, path=driver.path,
                               install_info=node.driver_install_path)
        return Result.passed(f"driver {driver.version} ({driver.path})", version=driver.version,
                             package_version=driver.details.get("package_version"),
                             firmware=node.firmware.version)


class NpuSmiRuns(Check):
    """`npu-smi info` runs and lists the chips (known failure codes are explained)."""

    id = "npu-smi-runs"
    area = "driver"
    severity = Severity.CRITICAL
    level = 1
    requires = ("npu-smi",)
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        smi = ctx.node.npu_smi
        if smi.error_code is not None:
            return Result.fail(f"npu-smi: {smi.error_message}", smi.remediation or DRIVER_REMEDIATION,
                               code=smi.error_code, command=f"{ctx.settings.npu_smi} info")
        chips = ctx.node.chips
        if not chips:
            return Result.fail("`npu-smi info` ran but listed no chips",
                               "check `dmesg | grep -i davinci` and the PCI bus (`lspci -d 19e5:`); "
                               "reseat or RMA the card",
                               version=smi.tool_version)
        return Result.passed(f"npu-smi {smi.tool_version} lists {len(chips)} chip(s) "
                             f"[{', '.join(ctx.node.chip_names())}]", version=smi.tool_version,
                             driver_version=smi.driver_version, chips=len(chips), elided=smi.elided)


class DeviceNodes(Check):
    """The device nodes a serving process needs exist: one /dev/davinciN per chip and the control nodes."""

    id = "device-nodes"
    area = "driver"
    severity = Severity.CRITICAL
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        host = ctx.node.host
        present = set(host.davinci_chips)
        missing_control = list(host.missing_control_nodes)
        fix = ("load the driver (`modprobe drv_davinci_intf` or reboot after installing it); in a container pass "
               "--device for each /dev/davinciN and " + ", ".join(f"/dev/{n}" for n in CONTROL_DEVICE_NODES))
        if not present and not ctx.node.has_npus:
            return Result.fail("no /dev/davinci* device nodes on this node", fix, control_missing=missing_control)
        wanted = sorted({c.device_id for c in ctx.selected_chips()}) if ctx.node.has_npus else sorted(present)
        missing = [d for d in wanted if d not in present]
        if missing or missing_control:
            what = [f"/dev/davinci{d}" for d in missing] + [f"/dev/{n}" for n in missing_control]
            return Result.fail(f"missing device nodes: {', '.join(what)}", fix, missing=what,
                               present=[f"/dev/davinci{d}" for d in sorted(present)])
        return Result.passed(f"{len(present)} /dev/davinci node(s) and the control nodes present",
                             davinci=sorted(present))


class ChipCount(Check):
    """The node shows the number of chips expected (--expect-chips), the same on npu-smi, /dev and PCI."""

    id = "chip-count"
    area = "driver"
    severity = Severity.HIGH
    level = 1

    def run(self, ctx: CheckContext) -> Result:
        node = ctx.node
        expected = ctx.options.expect_chips
        host = node.host
        seen = {"npu-smi": len(node.chips), "/dev/davinci": len(host.davinci_chips),
                "pci": len(host.npu_pci_devices)}
        if not node.has_npus:
            if expected:
                return Result.fail(f"expected {expected} chip(s), found none", DRIVER_REMEDIATION, expected=expected,
                                   **seen)
            skipped = skip_without_npus(ctx)
            assert skipped is not None
            return skipped
        count = len(node.chips)
        if expected is not None and count != expected:
            return Result.fail(f"expected {expected} chip(s), npu-smi shows {count}",
                               "a chip is missing: check `npu-smi info`, `dmesg | grep -i davinci` and "
                               "`lspci -d 19e5:`; "
                               "a card that dropped off the bus needs a cold reboot or RMA", expected=expected, **seen)
        if node.npu_smi.elided:
            return Result.passed(f"{count} chip(s) listed (npu-smi output has elided rows)", **seen)
        # Containers see a subset of /dev and a full PCI bus; a mismatch with /dev alone is worth a warning.
        if host.davinci_chips and len(host.davinci_chips) != count:
            return Result.warn(f"npu-smi shows {count} chip(s) but /dev has {len(host.davinci_chips)} davinci node(s)",
                               "make the container's --device list match the chips it should use", **seen)
        what = f"{count} chip(s)" + (", as expected" if expected is not None else "")
        return Result.passed(what, expected=expected, **seen)
