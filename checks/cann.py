"""CANN: the toolkit, the kernels/ops package for the chip, NNAL, and a driver new enough for them.

All four read files the node model already found (`node.cann`, `node.driver`); the driver table is
npuops/data/compat.toml `cann_min_driver` (Huawei's ascend-deployer, downloader/software/CANN_*.json).
Both layouts are handled: up to CANN 8.3 everything sits under /usr/local/Ascend/ascend-toolkit/latest
(kernels recorded as `opp_kernel` in version.cfg), from 8.5 under /usr/local/Ascend/cann (the ops package writes
ascend_ops_install.info).

Only cann-toolkit fails when CANN is missing; the other three compare something with CANN and skip, naming
cann-toolkit, so an operator sees one failure with one fix instead of four.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from npuops.datafiles import load_data_toml
from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity
from npuops.hardware.node import CannInstall, InstalledComponent
from npuops.hardware.versions import AscendVersion, parse_ascend_version
from npuops.parsing import ParseError

PROVISION_CANN = "`npuops provision --tags cann`"
PROVISION_DRIVER = "`npuops provision --tags driver`"
LAYOUT_LABELS = {"ascend-toolkit": "ascend-toolkit layout (CANN <= 8.3)", "cann": "cann layout (CANN >= 8.5)"}


def _version(text: str | None) -> AscendVersion | None:
    if not text:
        return None
    try:
        return parse_ascend_version(text)
    except ParseError:
        return None


def same_version(a: str, b: str) -> bool:
    """Equal as Ascend versions (8.2.rc2 == 8.2.RC2 == 8.2.RC2.0); plain text comparison when either does not parse."""
    va, vb = _version(a), _version(b)
    if va is None or vb is None:
        return a.strip().lower() == b.strip().lower()
    return va == vb


def _ascend_root(ctx: CheckContext) -> str:
    return str(ctx.settings.ascend_root).rstrip("/")


def _toolkit_env_script(ctx: CheckContext, cann: CannInstall) -> str:
    # The same path read_cann looks for, so "present" means what the node model says it means.
    return f"{_ascend_root(ctx)}/{cann.layout or 'ascend-toolkit'}/set_env.sh"


def _install_fix(ctx: CheckContext) -> str:
    root = _ascend_root(ctx)
    return (f"install CANN, its kernels/ops package for the chip and NNAL, all of one version: {PROVISION_CANN}; "
            "by hand: `Ascend-cann-toolkit_<ver>_linux-<arch>.run --install --install-for-all --quiet`, then the "
            "kernels/ops `.run --install --quiet`, then `Ascend-cann-nnal_<ver>_linux-<arch>.run --install --quiet`. "
            f"In a container, mount {root}/ascend-toolkit (or {root}/cann from 8.5) and {root}/nnal")


def _cann_missing_skip(ctx: CheckContext, what: str) -> Result | None:
    """Skip, pointing at cann-toolkit, when there is no CANN to compare `what` with."""
    toolkit = ctx.node.cann.toolkit
    if toolkit.installed and toolkit.version:
        return None
    return Result.skip(f"no CANN toolkit to compare {what} with (no {toolkit.path}; cann-toolkit says why)",
                       _install_fix(ctx), toolkit_path=toolkit.path)


def _unreadable(component: InstalledComponent, what: str, fix: str) -> Result | None:
    error = component.details.get("error")
    if not error:
        return None
    return Result.fail(f"{what} file {component.path} is unreadable: {error}", fix, path=component.path, error=error)


class CannToolkit(Check):
    """The CANN toolkit is installed (either layout), its version is readable and its set_env.sh is present."""

    id = "cann-toolkit"
    area = "cann"
    severity = Severity.CRITICAL
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        cann = ctx.node.cann
        toolkit = cann.toolkit
        unreadable = _unreadable(toolkit, "the CANN toolkit's install-info",
                                 f"reinstall the toolkit ({PROVISION_CANN}, or its `.run --upgrade --quiet`)")
        if unreadable is not None:
            return unreadable
        if not toolkit.installed:
            # A failure even on a node without NPUs: vLLM on Ascend cannot start without CANN, and a node that
            # shows no NPU yet is usually one being provisioned, where "install CANN" is the next step to take.
            arch_dir = PurePosixPath(toolkit.path or "").parent.name or "<arch>-linux"
            root = _ascend_root(ctx)
            looked = [f"{root}/cann/{arch_dir}/ascend_toolkit_install.info",
                      f"{root}/ascend-toolkit/latest/{arch_dir}/ascend_toolkit_install.info"]
            return Result.fail(f"CANN is not installed: neither {looked[0]} (CANN >= 8.5) nor {looked[1]} "
                               "(CANN <= 8.3) exists", _install_fix(ctx), looked=looked)
        layout = LAYOUT_LABELS.get(cann.layout or "", cann.layout or "unknown layout")
        evidence: dict[str, Any] = {"version": toolkit.version, "layout": cann.layout, "path": toolkit.path,
                                    "inner_version": toolkit.details.get("inner_version"),
                                    "set_env_scripts": list(cann.set_env_scripts)}
        if _version(toolkit.version) is None:
            return Result.warn(f"CANN installed ({layout}) but its version {toolkit.version!r} is not an Ascend "
                               "version npuops can compare",
                               f"check {toolkit.path}; reinstall the toolkit ({PROVISION_CANN}) if the file was edited",
                               **evidence)
        script = _toolkit_env_script(ctx, cann)
        if script not in cann.set_env_scripts:
            # systemd does not source set_env.sh, but npuops renders a unit's environment from it, and operators
            # source it by hand: without it the toolkit's libraries are not found.
            return Result.warn(f"CANN {toolkit.version} ({layout}) has no {script}",
                               f"reinstall the toolkit to restore it ({PROVISION_CANN}); its variables "
                               "(ASCEND_HOME_PATH, LD_LIBRARY_PATH, ASCEND_OPP_PATH) are what a launch needs",
                               **evidence)
        return Result.passed(f"CANN {toolkit.version}, {layout}, at {toolkit.path}", **evidence)


def _family_table(ctx: CheckContext, key: str) -> dict[str, str]:
    table = ctx.threshold(key)
    return {str(k): str(v) for k, v in table.items()} if isinstance(table, dict) else {}


class CannKernels(Check):
    """The kernels/ops package for the chip family is installed with the same version as the toolkit."""

    id = "cann-kernels"
    area = "cann"
    severity = Severity.CRITICAL
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        skipped = _cann_missing_skip(ctx, "the kernels package")
        if skipped is not None:
            return skipped
        cann = ctx.node.cann
        toolkit, kernels = cann.toolkit, cann.kernels
        families = sorted({c.family for c in ctx.selected_chips() if c.family})
        kernel_names = _family_table(ctx, "cann_kernels_package_by_family")
        ops_names = _family_table(ctx, "cann_ops_package_by_family")
        wanted_names = ops_names if cann.layout == "cann" else kernel_names
        wanted = " / ".join(wanted_names[f] for f in families if f in wanted_names) or (
            "Ascend-cann-kernels-<chip> (CANN <= 8.3) or Ascend-cann-<chip>-ops (CANN >= 8.5)")
        fix = (f"install {wanted} {toolkit.version} (`<package>_{toolkit.version}_linux-<arch>.run --install "
               f"--quiet`, after the toolkit of the same version), or {PROVISION_CANN}")
        unreadable = _unreadable(kernels, "the kernels/ops", fix)
        if unreadable is not None:
            return unreadable
        evidence: dict[str, Any] = {"toolkit_version": toolkit.version, "kernels_version": kernels.version,
                                    "kernels_path": kernels.path, "layout": cann.layout, "families": families}
        if not kernels.installed or not kernels.version:
            where = ("no ascend_ops_install.info" if cann.layout == "cann"
                     else "no opp_kernel entry in version.cfg")
            return Result.fail(f"no kernels/ops package for CANN {toolkit.version} ({where}: {kernels.path}); "
                               "operators fail at run time (aclnn error 561103)", fix, **evidence)
        if not same_version(kernels.version, toolkit.version or ""):
            return Result.fail(f"kernels/ops package {kernels.version} does not match CANN toolkit {toolkit.version}",
                               fix, **evidence)
        if not families:
            return Result.passed(f"kernels/ops {kernels.version} match the toolkit (no NPU visible: the chip family "
                                 "was not checked)", **evidence)
        if cann.layout == "cann":
            return self._check_ops_package(kernels, families, ops_names, fix, evidence)
        return self._check_kernel_dirs(ctx, kernels, families, _family_table(ctx, "cann_kernel_soc_dir_by_family"),
                                       fix, evidence)

    @staticmethod
    def _check_ops_package(kernels: InstalledComponent, families: list[str], names: dict[str, str], fix: str,
                           evidence: dict[str, Any]) -> Result:
        """From 8.5 the ops package names its chip in ascend_ops_install.info (package_name=Ascend-cann-910b-ops)."""
        package = str(kernels.details.get("package_name") or "")
        evidence["package_name"] = package or None
        wrong = [f for f in families if f in names and package and package.lower() != names[f].lower()]
        if wrong:
            return Result.fail(f"the ops package installed is {package}, but the chips are {', '.join(wrong)} "
                               f"(they need {', '.join(names[f] for f in wrong)})", fix, **evidence)
        what = package or "ops package (no package_name recorded)"
        return Result.passed(f"{what} {kernels.version} matches the toolkit and the {', '.join(families)} chips",
                             **evidence)

    @staticmethod
    def _check_kernel_dirs(ctx: CheckContext, kernels: InstalledComponent, families: list[str],
                           soc_dirs: dict[str, str], fix: str, evidence: dict[str, Any]) -> Result:
        """Up to 8.3 version.cfg records one opp_kernel version whatever the chip; the family shows only in the
        kernel binaries' directory (opp/built-in/op_impl/ai_core/tbe/kernel/ascend910b, ...). The toolkit itself
        may create some of these directories, so a present one does not prove much, but a missing one is a warning."""
        kernel_dir = f"{_ascend_root(ctx)}/ascend-toolkit/latest/opp/built-in/op_impl/ai_core/tbe/kernel"
        present = ctx.probe.glob(kernel_dir, "ascend*")
        evidence["kernel_dir"] = kernel_dir
        evidence["soc_dirs"] = present
        if not present:
            return Result.passed(f"kernels {kernels.version} match the toolkit (the chip family could not be read "
                                 f"from {kernel_dir})", **evidence)
        missing = [f for f in families if f in soc_dirs and soc_dirs[f] not in present]
        if missing:
            return Result.warn(f"kernels {kernels.version} are installed, but {kernel_dir} has no "
                               f"{', '.join(soc_dirs[f] for f in missing)} for the {', '.join(missing)} chips "
                               f"(it has {', '.join(present)}): the kernels package may be for another chip",
                               fix, **evidence)
        return Result.passed(f"kernels {kernels.version} match the toolkit and the {', '.join(families)} chips",
                             **evidence)


class NnalVersion(Check):
    """NNAL (ATB, libatb.so) is installed with the same version as CANN (vllm-ascend needs it)."""

    id = "nnal-version"
    area = "cann"
    severity = Severity.CRITICAL
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        skipped = _cann_missing_skip(ctx, "NNAL")
        if skipped is not None:
            return skipped
        cann = ctx.node.cann
        toolkit, nnal = cann.toolkit, cann.nnal
        fix = (f"install NNAL {toolkit.version} (`Ascend-cann-nnal_{toolkit.version}_linux-<arch>.run --install "
               f"--quiet`, after the toolkit) or {PROVISION_CANN}")
        unreadable = _unreadable(nnal, "NNAL's version", fix)
        if unreadable is not None:
            return unreadable
        evidence: dict[str, Any] = {"cann_version": toolkit.version, "nnal_version": nnal.version,
                                    "nnal_build": nnal.details.get("build"), "path": nnal.path}
        if not nnal.installed or not nnal.version:
            return Result.fail(f"NNAL is not installed (no {nnal.path}): vllm-ascend fails with "
                               "`libatb.so: cannot open shared object file`", fix, **evidence)
        if not same_version(nnal.version, toolkit.version or ""):
            return Result.fail(f"NNAL {nnal.version} does not match CANN {toolkit.version} (NNAL must equal the CANN "
                               "version; a mismatch shows up as `undefined symbol` at import)", fix, **evidence)
        script = f"{_ascend_root(ctx)}/nnal/atb/set_env.sh"
        if script not in cann.set_env_scripts:
            return Result.warn(f"NNAL {nnal.version} matches CANN, but {script} is missing",
                               f"reinstall NNAL to restore it ({fix}); it puts libatb.so on LD_LIBRARY_PATH",
                               **evidence)
        return Result.passed(f"NNAL {nnal.version} matches CANN {toolkit.version}", **evidence)


def min_driver_for(cann_version: AscendVersion, table: dict[str, str]) -> tuple[str, str] | None:
    """(CANN row, minimum driver) of the row with the greatest CANN <= cann_version, or None when every row is
    newer. The table lists releases, not ranges: a CANN between two rows needs at least the earlier row's driver."""
    rows: list[tuple[AscendVersion, str, str]] = []
    for cann_text, driver_text in table.items():
        parsed = _version(cann_text)
        if parsed is not None:
            rows.append((parsed, cann_text, str(driver_text)))
    applicable = [row for row in rows if row[0] <= cann_version]
    if not applicable:
        return None
    best = max(applicable, key=lambda row: row[0])
    return best[1], best[2]


class DriverCannCompat(Check):
    """The driver is at least the minimum the installed CANN needs (compat.toml cann_min_driver)."""

    id = "driver-cann-compat"
    area = "cann"
    severity = Severity.HIGH
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        skipped = _cann_missing_skip(ctx, "the driver")
        if skipped is not None:
            return skipped
        node = ctx.node
        toolkit, driver = node.cann.toolkit, node.driver
        if not driver.installed or not driver.version:
            return Result.skip(f"no driver to compare with CANN {toolkit.version} (no {driver.path}; "
                               "driver-installed says why)",
                               f"install the driver and firmware ({PROVISION_DRIVER}), then re-run",
                               driver_path=driver.path)
        table = {str(k): str(v) for k, v in load_data_toml("compat.toml")["cann_min_driver"].items()}
        evidence: dict[str, Any] = {"cann_version": toolkit.version, "driver_version": driver.version,
                                    "driver_package_version": driver.details.get("package_version")}
        cann_v, driver_v = _version(toolkit.version), _version(driver.version)
        if cann_v is None or driver_v is None:
            bad = toolkit.version if cann_v is None else driver.version
            return Result.warn(f"cannot compare: {bad!r} is not an Ascend version",
                               f"check {toolkit.path} and {driver.path}; reinstall the package whose file is odd",
                               **evidence)
        row = min_driver_for(cann_v, table)
        if row is None:
            oldest = min(table, key=lambda k: _version(k) or cann_v)
            return Result.warn(f"npuops' compat table has no row for CANN {toolkit.version} (its oldest row is "
                               f"{oldest}): the driver it needs is unknown",
                               "check the CANN release notes for its driver, or move to a CANN release in the "
                               f"table ({', '.join(table)}; ascend-deployer's CANN_*.json)", table=table, **evidence)
        row_cann, min_driver = row
        evidence.update({"row": row_cann, "min_driver": min_driver})
        nearest = "" if same_version(row_cann, toolkit.version or "") else f" (by the row for CANN {row_cann})"
        min_v = _version(min_driver)
        if min_v is not None and driver_v < min_v:
            return Result.fail(f"driver {driver.version} is older than {min_driver}, the minimum for CANN "
                               f"{toolkit.version}{nearest}",
                               f"upgrade the firmware, then the driver, to {min_driver} or newer and reboot "
                               f"({PROVISION_DRIVER}), or install a CANN this driver supports; an old driver shows "
                               "up as `aicore execution times out` / error 507014 under load", **evidence)
        return Result.passed(f"driver {driver.version} >= {min_driver}, the minimum for CANN {toolkit.version}"
                             f"{nearest}", **evidence)
