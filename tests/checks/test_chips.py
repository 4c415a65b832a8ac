"""The chip checks on real `npu-smi` captures (busy chips, a 300I Duo, -8005) and on this machine as it is.

States no capture shows (a chip in Alarm, a hot chip, health error codes, ECC errors) are derived from a real
capture by changing only the value in question, keeping the table's widths; `derived()` asserts that.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npuops.checks.chips import (
    ChipEcc,
    ChipHealth,
    ChipHealthDetail,
    ChipTemperature,
    HbmFree,
    classify_health,
)
from npuops.doctor.context import CheckContext, DoctorOptions
from npuops.doctor.model import Check, Result, Status
from npuops.doctor.registry import discover_checks
from npuops.doctor.runner import run_checks
from npuops.hardware.node import NPU_SMI_MISSING
from npuops.hardware.npu_smi_detail import parse_npu_smi_ecc
from npuops.hardware.probe import Probe
from npuops.parsing import ParseError
from npuops.settings import Settings
from tests.support.captures import capture
from tests.support.fake_commands import FakeRunner
from tests.support.paths import REPO

CHIP_IDS = ("chip-health", "chip-temperature", "hbm-free", "chip-health-detail", "chip-ecc")
B2C = "npu-smi-info_910b2c_4dev_proc_1.txt"  # NPUs 4-7, pt_main_thread holds 29166 MB on NPU 4
B1_BUSY = "npu-smi-info_910b1_8dev_busy_elided_1.txt"  # NPUs 0 and 7 shown, python holds ~59.6 GB on each
DUO = "npu-smi-info_310p3-300iduo_1.txt"  # 4 cards x 2 chips, NPU 0 busy (two processes)
B3 = "npu-smi-info_910b3_1.txt"  # 8x 910B3, idle
HEALTH = "npu-smi-info-t-health_doc_1.txt"
ECC = "npu-smi-info-t-ecc_doc_1.txt"

Answers = dict[tuple[str, ...], tuple[int, str, str]]


def derived(text: str, old: str, new: str, count: int = 1) -> str:
    """A real capture with one value changed in place (same width, so the table keeps its shape)."""
    assert len(old) == len(new), (old, new)
    assert text.count(old) >= count, f"{old!r} not in the capture"
    return text.replace(old, new, count)


def context(root: Path, smi: str | None, *, extra: Answers | None = None, rc: int = 0,
            options: DoctorOptions | None = None) -> CheckContext:
    # Per-chip queries first: FakeRunner answers the first matching prefix, and ("npu-smi", "info") prefixes them.
    answers: Answers = dict(extra or {})
    if smi is not None:
        answers[("npu-smi", "info")] = (rc, smi, "")
    probe = Probe(Settings(root=root), runner=FakeRunner(answers, passthrough_python=False), machine=lambda: "aarch64")
    return CheckContext(probe, options)


def run(check: type[Check], ctx: CheckContext) -> Result:
    result = check().run(ctx)
    assert isinstance(result, Result)
    if result.status is not Status.PASS:
        assert result.remediation
    return result


def test_chip_checks_are_discovered_with_pages() -> None:
    found = {c.id: c for c in discover_checks()}
    for check_id in CHIP_IDS:
        assert found[check_id].area == "chips"
        page = (REPO / "checks" / "docs" / f"{check_id}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {check_id}: ")
        for heading in ("**What it checks.**", "**Why it matters.**", "**How to fix.**"):
            assert heading in page
    assert {found[i].level for i in ("chip-health-detail", "chip-ecc")} == {2}


@pytest.mark.parametrize(("raw", "status"), [("OK", Status.PASS), ("Warning", Status.WARN), ("Alarm", Status.FAIL),
                                             ("Critical", Status.FAIL), ("critical", Status.FAIL),
                                             ("Unknown", Status.WARN)])
def test_classify_health(raw: str, status: Status) -> None:
    assert classify_health(raw) is status


# --- chip-health --------------------------------------------------------------------------------------------------


def test_health_ok_on_real_captures(fake_root: Path) -> None:
    for name in (B2C, B1_BUSY, DUO, B3):
        result = run(ChipHealth, context(fake_root, capture(name)))
        assert result.status is Status.PASS, (name, result)


def test_health_alarm_fails_naming_the_chip(fake_root: Path) -> None:
    # Derived from the 910B2C capture: NPU 4's health cell "OK" becomes "Alarm".
    smi = derived(capture(B2C), "| OK            |", "| Alarm         |")
    result = run(ChipHealth, context(fake_root, smi))
    assert result.status is Status.FAIL
    (problem,) = result.evidence["problems"]
    assert problem | {"name": None} == {"npu_id": 4, "chip_id": 0, "device": 4, "bus_id": "0000:DA:00.0",
                                        "name": None, "health": "Alarm", "in_launch": True}
    assert "npu-smi set -t reset -i 4 -c 0" in (result.remediation or "")  # the command to run


def test_health_critical_on_a_310p_chip_names_npu_chip_and_device(fake_root: Path) -> None:
    # Derived from the 300I Duo capture: the first card's second chip (NPU 0, chip 1, device 1) becomes Critical.
    text = capture(DUO)
    first = text.index("| OK              |")
    second = text.index("| OK              |", first + 1)
    smi = text[:second] + "| Critical        |" + text[second + len("| OK              |"):]
    result = run(ChipHealth, context(fake_root, smi))
    assert result.status is Status.FAIL
    (problem,) = result.evidence["problems"]
    assert (problem["npu_id"], problem["chip_id"], problem["device"], problem["bus_id"]) == (0, 1, 1, "0000:01:00.0")
    assert problem["health"] == "Critical"


def test_health_warning_and_unknown_words_warn(fake_root: Path) -> None:
    smi = derived(capture(B2C), "| OK            |", "| Warning       |")
    result = run(ChipHealth, context(fake_root, smi))
    assert result.status is Status.WARN and [p["health"] for p in result.evidence["problems"]] == ["Warning"]
    smi = derived(capture(B2C), "| OK            |", "| Unknown       |")
    result = run(ChipHealth, context(fake_root, smi))
    assert result.status is Status.WARN
    assert [p["health"] for p in result.evidence["problems"]] == ["Unknown"]  # the raw word, as printed


def test_health_alarm_outside_the_launch_only_warns(fake_root: Path) -> None:
    smi = derived(capture(B2C), "| OK            |", "| Alarm         |")  # NPU 4
    result = run(ChipHealth, context(fake_root, smi, options=DoctorOptions(devices=(5, 6, 7))))
    assert result.status is Status.WARN
    assert [(p["npu_id"], p["in_launch"]) for p in result.evidence["problems"]] == [(4, False)]


# --- chip-temperature ---------------------------------------------------------------------------------------------


def test_temperature_real_captures(fake_root: Path) -> None:
    assert run(ChipTemperature, context(fake_root, capture(B2C))).status is Status.PASS  # 51-55 C
    # The 300I Duo runs at 78-86 C: 86 is at the warn threshold (85).
    result = run(ChipTemperature, context(fake_root, capture(DUO)))
    assert result.status is Status.WARN
    assert [(c["npu_id"], c["chip_id"], c["device"], c["bus_id"]) for c in result.evidence["warm"]] == [
        (0, 0, 0, "0000:01:00.0")]
    assert result.evidence["temperatures_c"]["0/0"] == 86 and result.evidence["hottest_c"] == 86


def test_temperature_hot_chip_fails(fake_root: Path) -> None:
    # Derived from the 910B2C capture: NPU 4's temperature 52 becomes 97 (the fail threshold is 95).
    smi = derived(capture(B2C), "93.7        52", "93.7        97")
    result = run(ChipTemperature, context(fake_root, smi))
    assert result.status is Status.FAIL
    assert [(c["npu_id"], c["chip_id"]) for c in result.evidence["hot"]] == [(4, 0)]
    assert result.evidence["hottest_c"] == 97
    assert "check the cooling" in (result.remediation or "")
    # Only the chips the launch uses count.
    assert run(ChipTemperature, context(fake_root, smi, options=DoctorOptions(devices=(5,)))).status is Status.PASS


# --- hbm-free -----------------------------------------------------------------------------------------------------


def test_hbm_free_fails_on_the_busy_910b2c_chip_naming_the_pid(fake_root: Path) -> None:
    result = run(HbmFree, context(fake_root, capture(B2C)))
    assert result.status is Status.FAIL
    chip4 = next(c for c in result.evidence["chips"] if c["npu_id"] == 4)
    assert (chip4["free_mb"], chip4["total_mb"], chip4["need_mb"]) == (33090, 65536, 58983)
    assert chip4["processes"] == [{"pid": 154983, "name": "pt_main_thread", "memory_mb": 29166}]
    assert [c["npu_id"] for c in result.evidence["chips"] if c["free_mb"] < c["need_mb"]] == [4]
    # The fix names the commands and the flag value that would fit.
    assert "`kill 154983`" in (result.remediation or "")
    assert "--gpu-memory-utilization to 0.50" in (result.remediation or "")


def test_hbm_free_other_chips_of_the_same_node_pass(fake_root: Path) -> None:
    result = run(HbmFree, context(fake_root, capture(B2C), options=DoctorOptions(devices=(5, 6, 7))))
    assert result.status is Status.PASS
    assert len(result.evidence["chips"]) == 3


def test_hbm_free_warns_when_others_hold_memory_but_the_launch_fits(fake_root: Path) -> None:
    options = DoctorOptions(devices=(4,), gpu_memory_utilization=0.5)  # needs 32768 MB, 33090 MB are free
    result = run(HbmFree, context(fake_root, capture(B2C), options=options))
    assert result.status is Status.WARN
    (chip4,) = result.evidence["chips"]
    assert [p["pid"] for p in chip4["processes"]] == [154983] and chip4["free_mb"] >= chip4["need_mb"]
    assert "`kill 154983`" in (result.remediation or "")


def test_hbm_free_busy_910b1_names_both_pids(fake_root: Path) -> None:
    result = run(HbmFree, context(fake_root, capture(B1_BUSY)))
    assert result.status is Status.FAIL
    held = [p for c in result.evidence["chips"] for p in c["processes"]]
    assert {"pid": 2441447, "name": "python", "memory_mb": 59618} in held
    assert {"pid": 2441454, "name": "python", "memory_mb": 59802} in held
    assert result.evidence["npu_smi_elided"] is True


def test_hbm_free_on_310p_uses_device_memory(fake_root: Path) -> None:
    result = run(HbmFree, context(fake_root, capture(DUO)))
    assert result.status is Status.FAIL
    chips = {(c["npu_id"], c["chip_id"]): c for c in result.evidence["chips"]}
    assert chips[(0, 0)]["total_mb"] == 44278 and chips[(0, 0)]["used_mb"] == 35552
    assert [p["pid"] for p in chips[(0, 0)]["processes"]] == [326429, 326430]
    assert [p["pid"] for p in chips[(0, 1)]["processes"]] == [326430]
    assert chips[(0, 0)]["processes"][0]["memory_mb"] == 33842
    assert "--gpu-memory-utilization" not in (result.remediation or "")  # 0.19 would not be worth suggesting
    # The other three cards are free.
    idle = DoctorOptions(devices=(2, 3, 4, 5, 6, 7))
    assert run(HbmFree, context(fake_root, capture(DUO), options=idle)).status is Status.PASS


def test_hbm_free_unknown_device_fails(fake_root: Path) -> None:
    result = run(HbmFree, context(fake_root, capture(B2C), options=DoctorOptions(devices=(0, 4))))
    assert result.status is Status.FAIL
    assert result.evidence["devices_not_listed"] == [0]


# --- no NPU: the -8005 sample, and no npu-smi at all ---------------------------------------------------------------


@pytest.mark.parametrize("check", [ChipHealth, ChipTemperature, HbmFree, ChipHealthDetail, ChipEcc])
def test_chip_checks_skip_on_minus_8005(fake_root: Path, check: type[Check]) -> None:
    ctx = context(fake_root, capture("npu-smi-info_error-8005_container_1.txt"), rc=255)
    result = run(check, ctx)
    assert result.status is Status.SKIP
    assert result.evidence["npu_smi_error"] == "-8005"


@pytest.mark.parametrize("check", [ChipHealth, ChipTemperature, HbmFree, ChipHealthDetail, ChipEcc])
def test_chip_checks_skip_without_npu_smi(fake_root: Path, check: type[Check]) -> None:
    result = run(check, context(fake_root, None))
    assert result.status is Status.SKIP
    assert result.evidence["npu_smi_error"] == NPU_SMI_MISSING


# --- chip-health-detail (level 2) ---------------------------------------------------------------------------------


def _health_key(npu: int, chip: int = 0) -> tuple[str, ...]:
    return ("npu-smi", "info", "-t", "health", "-i", str(npu), "-c", str(chip))


def test_health_detail_ok_per_chip(fake_root: Path) -> None:
    runner_answers = {_health_key(n): (0, capture(HEALTH), "") for n in range(4, 8)}
    ctx = context(fake_root, capture(B2C), extra=runner_answers)
    result = run(ChipHealthDetail, ctx)
    assert result.status is Status.PASS
    assert [c["npu_id"] for c in result.evidence["chips"] if "skipped" not in c] == [4, 5, 6, 7]
    # One query per chip, run once, through the shared probe.
    runner = ctx.probe.runner
    assert isinstance(runner, FakeRunner)
    assert sorted(c for c in runner.calls if "health" in c) == [_health_key(n) for n in range(4, 8)]


def test_health_detail_error_codes_fail_with_the_codes(fake_root: Path) -> None:
    # Derived from the vendor's -t health sample: the status and the error code changed, nothing else.
    text = capture(HEALTH)
    alarm = text.replace("Health Status                  : OK", "Health Status                  : Alarm").replace(
        "Error Code                     : NA", "Error Code                     : 80E18402")
    assert alarm != text
    answers = {_health_key(4): (0, alarm, "")} | {_health_key(n): (0, text, "") for n in (5, 6, 7)}
    result = run(ChipHealthDetail, context(fake_root, capture(B2C), extra=answers))
    assert result.status is Status.FAIL
    codes = {c["npu_id"]: (c["health"], c["error_codes"]) for c in result.evidence["chips"]}
    assert codes == {4: ("Alarm", ["80E18402"]), 5: ("OK", []), 6: ("OK", []), 7: ("OK", [])}


def test_health_detail_codes_with_ok_status_warn(fake_root: Path) -> None:
    text = capture(HEALTH)
    coded = text.replace("Error Code                     : NA", "Error Code                     : 80E18402")
    answers = {_health_key(n): (0, coded if n == 5 else text, "") for n in range(4, 8)}
    result = run(ChipHealthDetail, context(fake_root, capture(B2C), extra=answers))
    assert result.status is Status.WARN
    assert {c["npu_id"]: c["error_codes"] for c in result.evidence["chips"] if c["error_codes"]} == {5: ["80E18402"]}


def test_health_detail_failing_query_skips_that_chip(fake_root: Path) -> None:
    # NPU 4's query fails with the real -8005 output; the other chips answer OK.
    answers = {_health_key(4): (255, capture("npu-smi-info_error-8005_container_1.txt"), "")}
    answers |= {_health_key(n): (0, capture(HEALTH), "") for n in (5, 6, 7)}
    result = run(ChipHealthDetail, context(fake_root, capture(B2C), extra=answers))
    assert result.status is Status.PASS
    assert [c["npu_id"] for c in result.evidence["chips"] if "skipped" in c] == [4]
    assert "left out: NPU 4 chip 0" in result.message  # the report names the chip it could not judge


def test_health_detail_unsupported_everywhere_skips_saying_so(fake_root: Path) -> None:
    # npu-smi's "does not support querying ..." message (quoted in npu_smi_detail for p2p-enable), for -t health.
    unsupported = "This device does not support querying health.\n"
    answers = {_health_key(n): (0, unsupported, "") for n in range(4, 8)}
    result = run(ChipHealthDetail, context(fake_root, capture(B2C), extra=answers))
    assert result.status is Status.SKIP
    assert all("skipped" in c for c in result.evidence["chips"]) and len(result.evidence["chips"]) == 4
    assert "not supported" in result.message  # says why, not just that nothing answered


def test_health_detail_a3_asks_each_die(fake_root: Path) -> None:
    ctx = context(fake_root, capture("npu-smi-info_a3-ascend910-2chip_1.txt"),
                  extra={("npu-smi", "info", "-t", "health"): (0, capture(HEALTH), "")})
    result = run(ChipHealthDetail, ctx)
    assert result.status is Status.PASS
    assert len([c for c in result.evidence["chips"] if "skipped" not in c]) == 16
    runner = ctx.probe.runner
    assert isinstance(runner, FakeRunner)
    assert _health_key(0, 1) in runner.calls and _health_key(7, 1) in runner.calls


# --- chip-ecc (level 2) -------------------------------------------------------------------------------------------


def _ecc_key(npu: int, chip: int = 0) -> tuple[str, ...]:
    return ("npu-smi", "info", "-t", "ecc", "-i", str(npu), "-c", str(chip))


def test_ecc_zero_counts_pass(fake_root: Path) -> None:
    answers: Answers = {("npu-smi", "info", "-t", "ecc"): (0, capture(ECC), "")}
    result = run(ChipEcc, context(fake_root, capture(B2C), extra=answers))
    assert result.status is Status.PASS
    assert {(c["single_bit"], c["double_bit"]) for c in result.evidence["chips"]} == {(0, 0)}


def test_ecc_double_bit_fails_single_bit_warns(fake_root: Path) -> None:
    text = capture(ECC)
    # Derived from the vendor sample: one count changed from 0.
    pad = " " * 19  # the capture's alignment
    double = derived(text, f"Double-bit Error Count{pad}: 0", f"Double-bit Error Count{pad}: 2")
    single = derived(text, f"Single-bit Error Count{pad}: 0", f"Single-bit Error Count{pad}: 7")
    answers = {_ecc_key(4): (0, double, ""), _ecc_key(5): (0, single, "")}
    answers |= {_ecc_key(n): (0, text, "") for n in (6, 7)}
    result = run(ChipEcc, context(fake_root, capture(B2C), extra=answers))
    assert result.status is Status.FAIL
    counts = {c["npu_id"]: (c["double_bit"], c["single_bit"]) for c in result.evidence["chips"]}
    assert counts == {4: (2, 0), 5: (0, 7), 6: (0, 0), 7: (0, 0)}
    answers[_ecc_key(4)] = (0, text, "")
    result = run(ChipEcc, context(fake_root, capture(B2C), extra=answers))
    assert result.status is Status.WARN
    assert {c["npu_id"]: c["single_bit"] for c in result.evidence["chips"] if c["single_bit"]} == {5: 7}


def test_ecc_parser_reads_the_hbm_spelling_of_a2_servers() -> None:
    # A2 servers print "HBM Single Bit Error Count" (and "DDR ..." on some cards) rather than the manual's
    # "Single-bit Error Count". No capture of that form is in tests/fixtures yet: this is the vendor sample with
    # only the key names respelled that way, plus an Aggregate line, which must not count.
    text = capture(ECC).replace("Single-bit Error Count  ", "HBM Single Bit Error Count").replace(
        "Double-bit Error Count  ", "HBM Double Bit Error Count")
    text += "        HBM Double Bit Aggregate Total Err Cnt   : 3\n"
    ecc = parse_npu_smi_ecc(text.replace("Double Bit Error Count                 : 0",
                                         "Double Bit Error Count                 : 1"))
    assert (ecc.single_bit_errors, ecc.double_bit_errors) == (0, 1)  # the Aggregate line (3) is not counted
    with pytest.raises(ParseError):
        parse_npu_smi_ecc("        Chip ID                                  : 0\n")


def test_ecc_na_counts_skip(fake_root: Path) -> None:
    na = capture(ECC).replace(": 0", ": NA")
    answers: Answers = {("npu-smi", "info", "-t", "ecc"): (0, na, "")}
    result = run(ChipEcc, context(fake_root, capture(B2C), extra=answers))
    assert result.status is Status.SKIP
    assert {(c["single_bit"], c["double_bit"]) for c in result.evidence["chips"]} == {(None, None)}


# --- this machine, as it is ---------------------------------------------------------------------------------------


def test_chip_checks_on_this_machine_never_error() -> None:
    checks = [c for c in discover_checks() if c.id in CHIP_IDS]
    ctx = CheckContext(Probe(Settings(environ=dict(os.environ))))
    report = run_checks(checks, ctx)
    for outcome in report.outcomes:
        assert outcome.result.status is not Status.ERROR, outcome
        if outcome.result.status is not Status.PASS:
            assert outcome.result.remediation
    if not ctx.node.has_npus:
        assert {o.result.status for o in report.outcomes} == {Status.SKIP}
