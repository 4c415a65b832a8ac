"""npu-smi info parser: golden parses of every real capture, targeted checks, and robustness.

Goldens live in tests/golden/npu_smi/<fixture-stem>.json. `NPUOPS_REFRESH_GOLDEN=1` rewrites them;
review every changed golden against its capture before committing it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.datafiles import load_data_toml
from npuops.hardware.npu_smi import (
    NpuSmiFailed,
    NpuSmiInfo,
    detect_npu_smi_failure,
    parse_npu_smi_info,
)
from npuops.parsing import ParseError
from tests.support.captures import capture
from tests.support.paths import ASCEND_FIXTURES, REPO

GOLDEN_DIR = REPO / "tests" / "golden" / "npu_smi"
FIXTURES = sorted(ASCEND_FIXTURES.glob("npu-smi-info_*.txt"))
# The glob must keep finding every main-table capture; a rename would otherwise drop one silently.
EXPECTED_STEMS = {
    "npu-smi-info_310b1_1",
    "npu-smi-info_310p3-300iduo_1",
    "npu-smi-info_310p3_1chip_v22_1",
    "npu-smi-info_310p3_1chip_v22_2",
    "npu-smi-info_310p3_1chip_v22_3",
    "npu-smi-info_310p3_1chip_v22_4",
    "npu-smi-info_310p3_1chip_v22_5",
    "npu-smi-info_310pvir01_1",
    "npu-smi-info_910a_doc_1",
    "npu-smi-info_910b1_8dev_busy_elided_1",
    "npu-smi-info_910b1_8dev_elided_v23rc2_1",
    "npu-smi-info_910b2c_4dev_proc_1",
    "npu-smi-info_910b3_1",
    "npu-smi-info_910b4_1dev_v26_truncated_1",
    "npu-smi-info_910prob_1dev_proc_v23rc1_1",
    "npu-smi-info_910prob_8dev_1",
    "npu-smi-info_a3-ascend910-2chip_1",
    "npu-smi-info_error-8005_container_1",
}
TABLE_TEXTS = [capture(path.name) for path in FIXTURES if "error" not in path.stem]


def parse(name: str) -> NpuSmiInfo:
    return parse_npu_smi_info(capture(f"npu-smi-info_{name}.txt"))


def as_json(text: str) -> dict[str, Any]:
    """The parse as it is stored in a golden: asdict form, or the failure for error captures."""
    try:
        shape: dict[str, Any] = asdict(parse_npu_smi_info(text))
    except NpuSmiFailed as failed:
        shape = {"NpuSmiFailed": asdict(failed.failure)}
    # The round trip turns tuples into lists, as in the stored file.
    result: dict[str, Any] = json.loads(json.dumps(shape))
    return result


def test_fixture_set_is_complete() -> None:
    assert {path.stem for path in FIXTURES} == EXPECTED_STEMS


@pytest.mark.parametrize("path", FIXTURES, ids=lambda path: path.stem)
def test_golden(path: Path) -> None:
    actual = as_json(capture(path.name))
    golden = GOLDEN_DIR / f"{path.stem}.json"
    if os.environ.get("NPUOPS_REFRESH_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(actual, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    assert golden.exists(), f"no golden for {path.stem}: run with NPUOPS_REFRESH_GOLDEN=1 and review it"
    assert json.loads(golden.read_text(encoding="utf-8")) == actual


def test_a2_910b3_idle() -> None:
    info = parse("910b3_1")
    assert (info.tool_version, info.driver_version) == ("23.0.7", "23.0.7")
    assert [chip.npu_id for chip in info.chips] == list(range(8))
    chip = info.chips[0]
    assert (chip.name, chip.health, chip.bus_id, chip.power_w, chip.temperature_c) == (
        "910B3",
        "OK",
        "0000:C1:00.0",
        102.8,
        55.0,
    )
    assert (chip.hbm_used_mb, chip.hbm_total_mb, chip.memory_total_mb, chip.logical_id) == (3338, 65536, 0, None)
    assert info.has_process_table
    assert info.processes == ()
    assert not info.elided


def test_a3_two_chips_per_npu() -> None:
    info = parse("a3-ascend910-2chip_1")
    assert len(info.chips) == 16
    assert [(chip.npu_id, chip.chip_id) for chip in info.chips] == [(n, c) for n in range(8) for c in (0, 1)]
    # The "Phy-ID" column is the logical id, numbered across the whole node.
    assert [chip.logical_id for chip in info.chips] == list(range(16))
    # Only chip 0 of each NPU reports the board power; chip 1 shows "-".
    assert all(chip.power_w is None for chip in info.chips if chip.chip_id == 1)
    assert all(chip.power_w is not None for chip in info.chips if chip.chip_id == 0)
    assert info.chips[1].hbm_used_mb == 52948
    assert len(info.processes) == 14
    assert all(process.name == "" for process in info.processes)
    assert [(p.npu_id, p.chip_id, p.pid) for p in info.processes[4:6]] == [(0, 1, 3328327), (1, 0, 3330598)]


def test_310p_duo_in_container() -> None:
    info = parse("310p3-300iduo_1")
    assert len(info.chips) == 8
    assert {chip.npu_id for chip in info.chips} == {0, 96, 32768, 32896}
    assert [chip.logical_id for chip in info.chips] == list(range(8))
    assert all(chip.hbm_used_mb is None and chip.hbm_total_mb is None for chip in info.chips)
    assert all(chip.power_w is None for chip in info.chips)
    assert [chip.memory_total_mb for chip in info.chips if chip.chip_id == 0] == [44278] * 4
    assert (info.chips[0].memory_used_mb, info.chips[0].hugepages_used) == (35552, 16885)
    assert [(p.npu_id, p.chip_id, p.pid, p.name, p.memory_mb) for p in info.processes] == [
        (0, 0, 326429, "", 33842),
        (0, 0, 326430, "", 108),
        (0, 1, 326430, "", 34086),
    ]


@pytest.mark.parametrize("variant", [1, 2, 3, 4, 5])
def test_310p_old_single_chip_variants(variant: int) -> None:
    info = parse(f"310p3_1chip_v22_{variant}")
    assert len(info.chips) == 1
    assert info.chips[0].name == "310P3"
    assert info.chips[0].hbm_total_mb is None
    assert not info.has_process_table


def test_310p_old_huge_npu_id_and_na_power() -> None:
    chip = parse("310p3_1chip_v22_1").chips[0]
    assert (chip.npu_id, chip.power_w, chip.memory_used_mb, chip.memory_total_mb) == (2144, None, 1807, 21527)
    chip = parse("310p3_1chip_v22_2").chips[0]
    assert (chip.power_w, chip.hugepages_used, chip.hugepages_total) == (16.3, 1236, 1236)


def test_910prob_has_ddr_and_hbm() -> None:
    info = parse("910prob_8dev_1")
    assert len(info.chips) == 8
    assert all(chip.memory_total_mb and chip.hbm_total_mb == 32768 for chip in info.chips)
    assert (info.chips[0].memory_used_mb, info.chips[0].memory_total_mb, info.chips[0].hbm_used_mb) == (2387, 13553, 18)
    assert info.has_process_table
    assert info.processes == ()


def test_910prob_narrow_variant_with_blank_line_and_process() -> None:
    info = parse("910prob_1dev_proc_v23rc1_1")
    chip = info.chips[0]
    assert (chip.memory_used_mb, chip.memory_total_mb, chip.hbm_used_mb, chip.hbm_total_mb) == (
        1198,
        15137,
        30711,
        32768,
    )
    assert [(p.pid, p.name, p.memory_mb) for p in info.processes] == [(55115, "python", 30784)]


def test_hbm_without_space_before_slash() -> None:
    info = parse("910b2c_4dev_proc_1")
    assert [chip.npu_id for chip in info.chips] == [4, 5, 6, 7]
    assert (info.chips[0].hbm_used_mb, info.chips[0].hbm_total_mb) == (32446, 65536)
    assert [(p.npu_id, p.pid, p.name, p.memory_mb) for p in info.processes] == [(4, 154983, "pt_main_thread", 29166)]


def test_v26_layout_truncated_after_process_header() -> None:
    info = parse("910b4_1dev_v26_truncated_1")
    assert info.tool_version == "26.0.rc1"
    assert len(info.chips) == 1
    assert (info.chips[0].name, info.chips[0].hbm_total_mb) == ("910B4", 32768)
    assert info.has_process_table
    assert info.processes == ()


def test_v26_container_pid_column() -> None:
    lines = capture("npu-smi-info_910b4_1dev_v26_truncated_1.txt").split("\n")
    empty = next(index for index, line in enumerate(lines) if line.startswith("| No running processes"))
    # Rows laid out like the 26.x process header: NPU Chip | pid | name | memory | pid in container.
    lines[empty : empty + 1] = [
        "| 0       0                 | 154983        | python3 serve.py   | 29166                 | 87        |",
        "| 0       0                 | 154990        |                    | 12                    | -         |",
    ]
    text = "\n".join(lines)
    processes = parse_npu_smi_info(text).processes
    assert [(p.pid, p.name, p.memory_mb, p.container_pid) for p in processes] == [
        (154983, "python3 serve.py", 29166, 87),
        (154990, "", 12, None),
    ]


def test_elided_capture_keeps_only_the_rows_shown() -> None:
    info = parse("910b1_8dev_busy_elided_1")
    assert info.elided
    assert [chip.npu_id for chip in info.chips] == [0, 7]
    assert (info.chips[1].aicore_percent, info.chips[1].power_w) == (68.0, 451.6)
    assert [(p.npu_id, p.pid, p.memory_mb) for p in info.processes] == [
        (0, 2441447, 59618),
        (1, 2441448, 59834),
        (7, 2441454, 59802),
    ]


def test_elided_capture_without_process_table() -> None:
    info = parse("910b1_8dev_elided_v23rc2_1")
    assert info.elided
    assert [chip.npu_id for chip in info.chips] == [0, 1, 7]
    assert not info.has_process_table


def test_doc_capture_with_redacted_misaligned_name() -> None:
    info = parse("910a_doc_1")
    assert info.elided
    chip = info.chips[0]
    assert (chip.npu_id, chip.name, chip.memory_used_mb, chip.memory_total_mb, chip.hbm_total_mb) == (
        7,
        "xxx",
        2505,
        15567,
        32768,
    )


def test_error_8005_raises_with_data_file_remediation() -> None:
    with pytest.raises(NpuSmiFailed) as raised:
        parse("error-8005_container_1")
    failure = raised.value.failure
    entry = load_data_toml("npu_smi_errors.toml")["codes"]["-8005"]
    assert failure.code == "-8005"
    assert failure.message == "dcmi module initialize failed. ret is -8005"
    assert (failure.meaning, failure.remediation) == (entry["meaning"], entry["remediation"])
    assert "/dev/davinci_manager" in failure.remediation
    assert raised.value.line_no == 2
    assert isinstance(raised.value, ParseError)


def test_error_8020_wording_is_recognised() -> None:
    failure = detect_npu_smi_failure(
        "DrvMngGetConsoleLogLevel failed. (g_conLogLevel=3)\n"
        "dcmi model initialized failed, because the device is used. ret is -8020\n"
    )
    assert failure is not None
    assert failure.code == "-8020"
    assert failure.meaning == load_data_toml("npu_smi_errors.toml")["codes"]["-8020"]["meaning"]


def test_unknown_error_code_gets_generic_advice() -> None:
    failure = detect_npu_smi_failure("dcmi module initialize failed. ret is -8999")
    assert failure is not None
    assert failure.code == "-8999"
    assert failure.meaning == load_data_toml("npu_smi_errors.toml")["unknown"]["meaning"]


def test_every_data_file_entry_is_complete() -> None:
    data = load_data_toml("npu_smi_errors.toml")
    assert {"-8005", "-8020", "-9005"} <= set(data["codes"])
    for entry in [data["unknown"], *data["codes"].values()]:
        assert entry["meaning"].strip()
        assert entry["remediation"].strip()


def test_tables_are_not_failures() -> None:
    assert all(detect_npu_smi_failure(text) is None for text in TABLE_TEXTS)


def test_process_name_cannot_fake_a_failure() -> None:
    text = capture("npu-smi-info_910b2c_4dev_proc_1.txt").replace(
        "| pt_main_thread           |", "| ret is -8005             |"
    )
    assert parse_npu_smi_info(text).processes[0].name == "ret is -8005"


def test_warning_lines_before_the_table_are_skipped() -> None:
    text = capture("npu-smi-info_910b3_1.txt")
    assert parse_npu_smi_info("DrvMngGetConsoleLogLevel failed. (g_conLogLevel=3)\n" + text) == parse_npu_smi_info(text)


def test_crlf_line_ends() -> None:
    text = capture("npu-smi-info_a3-ascend910-2chip_1.txt")
    assert parse_npu_smi_info(text.replace("\n", "\r\n")) == parse_npu_smi_info(text)


def test_empty_output() -> None:
    with pytest.raises(ParseError, match="empty"):
        parse_npu_smi_info("")
    with pytest.raises(ParseError, match="empty"):
        parse_npu_smi_info("\n  \n")


def test_command_not_found_names_the_line() -> None:
    with pytest.raises(ParseError) as raised:
        parse_npu_smi_info("bash: npu-smi: command not found\n")
    assert (raised.value.line_no, raised.value.line) == (1, "bash: npu-smi: command not found")
    assert "command not found" in str(raised.value)


def test_non_numeric_npu_id_names_the_line() -> None:
    text = capture("npu-smi-info_910b3_1.txt").replace("| 3     910B3 ", "| X     910B3 ")
    with pytest.raises(ParseError) as raised:
        parse_npu_smi_info(text)
    assert raised.value.line_no == 16
    assert raised.value.line is not None and raised.value.line.startswith("| X     910B3")
    assert "'X'" in str(raised.value)
    assert "line 16" in str(raised.value)


def test_output_cut_inside_a_chip_entry() -> None:
    text = capture("npu-smi-info_910b3_1.txt")
    cut = "\n".join(text.split("\n")[:10])
    with pytest.raises(ParseError, match="second row") as raised:
        parse_npu_smi_info(cut)
    assert raised.value.line_no == 10


def test_line_cut_off_mid_row() -> None:
    lines = capture("npu-smi-info_910b3_1.txt").split("\n")
    lines[6] = lines[6][:40]
    with pytest.raises(ParseError, match="cut off") as raised:
        parse_npu_smi_info("\n".join(lines))
    assert raised.value.line_no == 7


def test_duplicate_chip_is_rejected() -> None:
    lines = capture("npu-smi-info_910b3_1.txt").split("\n")
    doubled = [*lines[:9], *lines[6:9], *lines[9:]]
    with pytest.raises(ParseError, match="appears twice"):
        parse_npu_smi_info("\n".join(doubled))


def test_header_without_its_second_row() -> None:
    lines = capture("npu-smi-info_910b3_1.txt").split("\n")
    del lines[4]
    with pytest.raises(ParseError, match="only one row") as raised:
        parse_npu_smi_info("\n".join(lines))
    assert raised.value.line_no == 5


def test_unknown_columns_are_skipped() -> None:
    text = capture("npu-smi-info_310p3_1chip_v22_2.txt")
    text = text.replace("Hugepages-Usage(page) |", "Hugepages-Usage(page) Fan(%) |", 1)
    text = text.replace("1236 / 1236           |", "1236 / 1236     40    |", 1)
    assert parse_npu_smi_info(text).chips == parse_npu_smi_info(capture("npu-smi-info_310p3_1chip_v22_2.txt")).chips


@st.composite
def mutated_capture(draw: st.DrawFn) -> str:
    lines = draw(st.sampled_from(TABLE_TEXTS)).split("\n")
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        if not lines:
            break
        index = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        operation = draw(st.sampled_from(["delete", "duplicate", "replace", "truncate_line", "truncate_text"]))
        if operation == "delete":
            del lines[index]
        elif operation == "duplicate":
            lines.insert(index, lines[index])
        elif operation == "replace" and lines[index]:
            column = draw(st.integers(min_value=0, max_value=len(lines[index]) - 1))
            replacement = draw(st.one_of(st.sampled_from("|+-=/ .0123456789XN\t\r\n"), st.characters()))
            lines[index] = lines[index][:column] + replacement + lines[index][column + 1 :]
        elif operation == "truncate_line":
            lines[index] = lines[index][: draw(st.integers(min_value=0, max_value=len(lines[index])))]
        elif operation == "truncate_text":
            lines = lines[:index]
    return "\n".join(lines)


def assert_parses_or_parse_error(text: str) -> None:
    try:
        info = parse_npu_smi_info(text)
    except ParseError:
        return
    assert info.chips or info.elided


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_text_only_raises_parse_error(text: str) -> None:
    assert_parses_or_parse_error(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="|+-=/. \n0123456789NPUChipNameOKAD:x"))
def test_table_like_text_only_raises_parse_error(text: str) -> None:
    assert_parses_or_parse_error(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_capture())
def test_mutated_captures_only_raise_parse_error(text: str) -> None:
    assert_parses_or_parse_error(text)
