"""The CANN checks on prepared Ascend trees built from real captures, both layouts, and on this machine.

The trees combine real files: toolkit install-info files (CANN 8.0.0 .. 8.5.0), the 8.2.RC2 version.cfg, NNAL
8.2.RC2 and driver 24.1.rc2.2 (those three from one MindIE 800I A2 image), driver 25.0.rc1.1. Versions no capture
pairs up (a toolkit of the image's 8.2.RC2; an 8.5 ascend_ops_install.info) are derived from a real file by changing
only the value in question; `derived()` asserts the old value was there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npuops.checks.cann import CannKernels, CannToolkit, DriverCannCompat, NnalVersion, min_driver_for, same_version
from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Status
from npuops.doctor.registry import discover_checks
from npuops.doctor.runner import run_checks
from npuops.hardware.probe import Probe
from npuops.hardware.versions import parse_ascend_version
from npuops.settings import Settings
from tests.support.captures import capture
from tests.support.fake_commands import FakeRunner
from tests.support.host_tree import put
from tests.support.paths import REPO

CANN_IDS = ("cann-toolkit", "cann-kernels", "nnal-version", "driver-cann-compat")
ASCEND = "/usr/local/Ascend"
TOOLKIT_INFO = f"{ASCEND}/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info"
CANN85_INFO = f"{ASCEND}/cann/aarch64-linux/ascend_toolkit_install.info"
OPS_INFO = f"{ASCEND}/cann/aarch64-linux/ascend_ops_install.info"
KERNEL_DIR = f"{ASCEND}/ascend-toolkit/latest/opp/built-in/op_impl/ai_core/tbe/kernel"
A2_SMI = "npu-smi-info_910b3_1.txt"


def derived(text: str, old: str, new: str) -> str:
    assert old in text, f"{old!r} not in the file"
    return text.replace(old, new, 1)


def toolkit_82rc2() -> str:
    """The 8.2.RC1 install-info with its version changed to the image's 8.2.RC2 (the only value changed)."""
    return derived(capture("ascend_toolkit_install-info_2.txt"), "version=8.2.RC1", "version=8.2.RC2")


def mindie_image(root: Path, *, toolkit: str | None = None, nnal: bool = True, driver: str | None = None,
                 env_scripts: bool = True) -> None:
    """The MindIE 800I A2 image's CANN 8.2.RC2 (ascend-toolkit layout) with its kernels, NNAL and driver."""
    put(root, TOOLKIT_INFO, toolkit if toolkit is not None else toolkit_82rc2())
    put(root, f"{ASCEND}/ascend-toolkit/latest/version.cfg", capture("ascend-toolkit-version-cfg_8.2.RC2_1.txt"))
    if env_scripts:
        put(root, f"{ASCEND}/ascend-toolkit/set_env.sh", "# vendor script\n")
    if nnal:
        put(root, f"{ASCEND}/nnal/atb/latest/version.info", capture("nnal-atb-version-info_8.2.RC2_1.txt"))
        if env_scripts:
            put(root, f"{ASCEND}/nnal/atb/set_env.sh", "# vendor script\n")
    put(root, f"{ASCEND}/driver/version.info", driver or capture("driver-version-info_24.1.rc2.2_1.txt"))


def cann85(root: Path, ops_package: str | None = "Ascend-cann-910b-ops") -> None:
    """CANN 8.5.0 in the cann layout; the ops info file is the toolkit's with package_name changed."""
    info = capture("ascend_toolkit_install-info_doc_1.txt")
    put(root, CANN85_INFO, info)
    put(root, f"{ASCEND}/cann/set_env.sh", "# vendor script\n")
    if ops_package is not None:
        put(root, OPS_INFO, derived(info, "package_name=Ascend-cann-toolkit", f"package_name={ops_package}"))


def context(root: Path, smi: str | None = A2_SMI, machine: str = "aarch64") -> CheckContext:
    answers: dict[tuple[str, ...], tuple[int, str, str]] = {}
    if smi is not None:
        answers[("npu-smi", "info")] = (0, capture(smi), "")
    probe = Probe(Settings(root=root), runner=FakeRunner(answers, passthrough_python=False), machine=lambda: machine)
    return CheckContext(probe)


def run(check: type[Check], ctx: CheckContext) -> Result:
    result = check().run(ctx)
    if result.status is not Status.PASS:
        assert result.remediation
    return result


def test_cann_checks_are_discovered_with_pages() -> None:
    found = {c.id: c for c in discover_checks()}
    for check_id in CANN_IDS:
        assert found[check_id].area == "cann"
        page = (REPO / "checks" / "docs" / f"{check_id}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {check_id}: ")


def test_same_version_and_the_driver_table() -> None:
    assert same_version("8.2.rc2", "8.2.RC2") and not same_version("8.2.RC2", "8.3.RC1")
    table = {"8.1.RC1": "25.0.RC1", "8.2.RC1": "25.2.0", "8.3.RC1": "25.3.RC1", "8.5.0": "25.5.0", "9.0.0": "26.0.RC1"}
    assert min_driver_for(parse_ascend_version("8.2.RC2"), table) == ("8.2.RC1", "25.2.0")
    assert min_driver_for(parse_ascend_version("8.3.RC2"), table) == ("8.3.RC1", "25.3.RC1")
    assert min_driver_for(parse_ascend_version("8.5.0"), table) == ("8.5.0", "25.5.0")
    assert min_driver_for(parse_ascend_version("9.1.0"), table) == ("9.0.0", "26.0.RC1")
    assert min_driver_for(parse_ascend_version("8.0.0"), table) is None
    assert min_driver_for(parse_ascend_version("8.1.RC1"), table) == ("8.1.RC1", "25.0.RC1")


# --- one consistent image: everything matches, the driver is too old for it by the table ---------------------------


def test_consistent_image(fake_root: Path) -> None:
    mindie_image(fake_root)
    ctx = context(fake_root)
    toolkit = run(CannToolkit, ctx)
    assert toolkit.status is Status.PASS
    assert (toolkit.evidence["version"], toolkit.evidence["layout"]) == ("8.2.RC2", "ascend-toolkit")
    kernels = run(CannKernels, ctx)
    assert kernels.status is Status.PASS and kernels.evidence["soc_dirs"] == []  # no kernel dirs in the tree
    assert run(NnalVersion, ctx).status is Status.PASS
    # 8.2.RC2 needs at least 25.2.0 (row 8.2.RC1); the image's notes record driver 24.1.rc2.2.
    compat = run(DriverCannCompat, ctx)
    assert compat.status is Status.FAIL
    assert compat.evidence["driver_version"] == "24.1.rc2.2" and compat.evidence["min_driver"] == "25.2.0"
    assert compat.evidence["row"] == "8.2.RC1"


def test_kernel_dirs_name_the_chip_family(fake_root: Path) -> None:
    mindie_image(fake_root)
    (fake_root / KERNEL_DIR.lstrip("/") / "ascend910b").mkdir(parents=True)
    result = run(CannKernels, context(fake_root))
    assert result.status is Status.PASS and result.evidence["families"] == ["A2"]
    assert result.evidence["soc_dirs"] == ["ascend910b"]
    # Kernels for the 310P only, on 910B3 chips.
    (fake_root / KERNEL_DIR.lstrip("/") / "ascend910b").rmdir()
    (fake_root / KERNEL_DIR.lstrip("/") / "ascend310p").mkdir()
    result = run(CannKernels, context(fake_root))
    assert result.status is Status.WARN and result.evidence["soc_dirs"] == ["ascend310p"]
    assert "Ascend-cann-kernels-910b 8.2.RC2" in (result.remediation or "")  # the package to install


# --- mismatches from real files --------------------------------------------------------------------------------------


def test_toolkit_83_with_82_kernels_and_nnal(fake_root: Path) -> None:
    mindie_image(fake_root, toolkit=capture("ascend_toolkit_install-info_aarch64_3.txt"),
                 driver=capture("driver-version-info_25.0.rc1.1_1.txt"))
    ctx = context(fake_root)
    assert run(CannToolkit, ctx).status is Status.PASS
    kernels = run(CannKernels, ctx)
    assert kernels.status is Status.FAIL
    assert (kernels.evidence["kernels_version"], kernels.evidence["toolkit_version"]) == ("8.2.RC2", "8.3.RC1")
    nnal = run(NnalVersion, ctx)
    assert nnal.status is Status.FAIL
    assert (nnal.evidence["nnal_version"], nnal.evidence["cann_version"]) == ("8.2.RC2", "8.3.RC1")
    compat = run(DriverCannCompat, ctx)
    assert compat.status is Status.FAIL
    assert (compat.evidence["driver_version"], compat.evidence["min_driver"]) == ("25.0.rc1.1", "25.3.RC1")


def test_driver_new_enough(fake_root: Path) -> None:
    # CANN 8.1.RC1 (the 8.2.RC1 file with its version changed) needs 25.0.RC1; driver 25.0.rc1.1 is newer.
    toolkit = derived(capture("ascend_toolkit_install-info_2.txt"), "version=8.2.RC1", "version=8.1.RC1")
    mindie_image(fake_root, toolkit=toolkit, driver=capture("driver-version-info_25.0.rc1.1_1.txt"))
    result = run(DriverCannCompat, context(fake_root))
    assert result.status is Status.PASS
    assert {k: result.evidence[k] for k in ("cann_version", "row", "min_driver", "driver_version")} == {
        "cann_version": "8.1.RC1", "row": "8.1.RC1", "min_driver": "25.0.RC1", "driver_version": "25.0.rc1.1"}


def test_cann_older_than_the_table_warns(fake_root: Path) -> None:
    mindie_image(fake_root, toolkit=capture("ascend_toolkit_install-info_1.txt"))  # CANN 8.0.0 (issue #198)
    result = run(DriverCannCompat, context(fake_root))
    assert result.status is Status.WARN
    assert result.evidence["cann_version"] == "8.0.0" and "row" not in result.evidence
    assert min(result.evidence["table"], key=parse_ascend_version) == "8.1.RC1"  # older than every row


def test_x86_cann_83rc2_uses_the_83rc1_row(fake_root: Path) -> None:
    put(fake_root, f"{ASCEND}/ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info",
        capture("ascend_toolkit_install-info_x86_1.txt"))
    put(fake_root, f"{ASCEND}/driver/version.info", capture("driver-version-info_25.0.rc1.1_1.txt"))
    ctx = context(fake_root, machine="x86_64")
    result = run(DriverCannCompat, ctx)
    assert result.status is Status.FAIL and result.evidence["row"] == "8.3.RC1"
    assert run(CannToolkit, ctx).status is Status.WARN  # no set_env.sh in this tree


# --- the >= 8.5 layout ----------------------------------------------------------------------------------------------


def test_cann85_layout_with_the_910b_ops_package(fake_root: Path) -> None:
    cann85(fake_root)
    ctx = context(fake_root)
    toolkit = run(CannToolkit, ctx)
    assert toolkit.status is Status.PASS and toolkit.evidence["layout"] == "cann"
    kernels = run(CannKernels, ctx)
    assert kernels.status is Status.PASS
    assert (kernels.evidence["package_name"], kernels.evidence["kernels_version"]) == ("Ascend-cann-910b-ops", "8.5.0")
    assert kernels.evidence["families"] == ["A2"]


def test_cann85_ops_package_for_another_chip_fails(fake_root: Path) -> None:
    cann85(fake_root, ops_package="Ascend-cann-310p-ops")
    result = run(CannKernels, context(fake_root))
    assert result.status is Status.FAIL
    assert result.evidence["package_name"] == "Ascend-cann-310p-ops" and result.evidence["families"] == ["A2"]
    assert "install Ascend-cann-910b-ops 8.5.0" in (result.remediation or "")  # the package the chips need


def test_cann85_without_ops_package_fails(fake_root: Path) -> None:
    cann85(fake_root, ops_package=None)
    result = run(CannKernels, context(fake_root))
    assert result.status is Status.FAIL and result.evidence["kernels_version"] is None
    assert result.evidence["kernels_path"].endswith("/ascend_ops_install.info")
    assert "Ascend-cann-910b-ops 8.5.0" in (result.remediation or "")


def test_cann85_310p_node_needs_the_310p_ops(fake_root: Path) -> None:
    cann85(fake_root, ops_package="Ascend-cann-310p-ops")
    result = run(CannKernels, context(fake_root, smi="npu-smi-info_310p3-300iduo_1.txt"))
    assert result.status is Status.PASS and result.evidence["families"] == ["310P"]


# --- missing pieces -------------------------------------------------------------------------------------------------


def test_nnal_missing_fails_naming_libatb(fake_root: Path) -> None:
    mindie_image(fake_root, nnal=False)
    result = run(NnalVersion, context(fake_root))
    assert result.status is Status.FAIL and result.evidence["nnal_version"] is None
    assert "Ascend-cann-nnal_8.2.RC2" in (result.remediation or "")


def test_missing_set_env_scripts_warn(fake_root: Path) -> None:
    mindie_image(fake_root, env_scripts=False)
    ctx = context(fake_root)
    assert run(CannToolkit, ctx).status is Status.WARN
    assert run(NnalVersion, ctx).status is Status.WARN


def test_unreadable_toolkit_info_fails(fake_root: Path) -> None:
    put(fake_root, TOOLKIT_INFO, "")
    result = run(CannToolkit, context(fake_root))
    assert result.status is Status.FAIL and result.evidence["path"] == TOOLKIT_INFO and result.evidence["error"]


def test_driver_missing_skips_compat(fake_root: Path) -> None:
    cann85(fake_root)
    result = run(DriverCannCompat, context(fake_root, smi=None))
    assert result.status is Status.SKIP and set(result.evidence) == {"driver_path"}


def test_no_cann_on_an_npu_node(fake_root: Path) -> None:
    put(fake_root, f"{ASCEND}/driver/version.info", capture("driver-version-info_25.0.rc1.1_1.txt"))
    ctx = context(fake_root)
    assert ctx.node.has_npus
    toolkit = run(CannToolkit, ctx)
    assert toolkit.status is Status.FAIL
    assert toolkit.evidence["looked"] == [CANN85_INFO, TOOLKIT_INFO]
    assert "npuops provision --tags cann" in (toolkit.remediation or "")
    for check in (CannKernels, NnalVersion, DriverCannCompat):
        result = run(check, ctx)
        assert result.status is Status.SKIP and set(result.evidence) == {"toolkit_path"}


@pytest.mark.parametrize("check", [CannKernels, NnalVersion, DriverCannCompat])
def test_no_cann_no_npu_skips_the_comparisons(fake_root: Path, check: type[Check]) -> None:
    assert run(check, context(fake_root, smi=None)).status is Status.SKIP


def test_cann_checks_on_this_machine() -> None:
    checks = [c for c in discover_checks() if c.id in CANN_IDS]
    ctx = CheckContext(Probe(Settings(environ=dict(os.environ))))
    report = run_checks(checks, ctx)
    statuses = {o.check_id: o.result.status for o in report.outcomes}
    assert Status.ERROR not in statuses.values(), report.outcomes
    if not ctx.node.cann.toolkit.installed:
        # This machine (no NPU, no CANN): cann-toolkit fails with the install fix, the comparisons skip.
        assert statuses == {"cann-toolkit": Status.FAIL, "cann-kernels": Status.SKIP, "nnal-version": Status.SKIP,
                            "driver-cann-compat": Status.SKIP}
        toolkit = next(o for o in report.outcomes if o.check_id == "cann-toolkit")
        assert "npuops provision --tags cann" in (toolkit.result.remediation or "")
